"""dpfl: differentially private federated learning with per-client privacy ledgers.

    import dpfl
    outcome = dpfl.run("configs/demo.yaml", out="runs/demo")          # what `dpfl run` does, from Python
    outcome.final_accuracy, outcome.epsilon, outcome.privacy.guarantee

The public names below are imported on first use (PEP 562), so `import dpfl` and the `dpfl` command stay
fast; `docs/api.md` shows them at work.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (dynamic)

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # running
    "run": "dpfl.api", "RunOutcome": "dpfl.api",
    "PrivacyReport": "dpfl.results.privacy_report", "read_privacy_report": "dpfl.results.privacy_report",
    "FederatedRun": "dpfl.experiment.federated_run", "RunResult": "dpfl.experiment.federated_run",
    "build_run": "dpfl.experiment.build",
    # configuration
    "RunConfig": "dpfl.experiment.config", "ConfigError": "dpfl.experiment.config",
    "load_config": "dpfl.experiment.config", "validate_config": "dpfl.experiment.config",
    "config_to_yaml": "dpfl.experiment.config",
    # data and models
    "federated_data": "dpfl.data.provided", "federated_dataset": "dpfl.data.registry",
    "FederatedDataset": "dpfl.data.federated", "ClientData": "dpfl.data.federated", "ArrayDataset": "dpfl.data.arrays",
    "register_dataset": "dpfl.data.registry", "build_model": "dpfl.models.registry",
    "federated_files": "dpfl.data.silos", "load_silo": "dpfl.data.silo_files", "SiloSchema": "dpfl.data.schema",
    "Scaling": "dpfl.data.schema", "DataError": "dpfl.data.errors",
    "register_model": "dpfl.models.registry", "register_loss": "dpfl.engine.losses",
    # algorithms and their stages
    "Algorithm": "dpfl.algorithms.algorithm", "fedavg": "dpfl.algorithms.algorithm",
    "central_dp_fedavg": "dpfl.algorithms.algorithm", "Selection": "dpfl.algorithms.selection",
    "sgd": "dpfl.algorithms.client.program", "dpsgd": "dpfl.algorithms.client.program",
    "LocalProgram": "dpfl.algorithms.client.program", "FedAvg": "dpfl.algorithms.server.fedavg",
    "ServerView": "dpfl.algorithms.server.view", "ServerStep": "dpfl.algorithms.stages",
    "ServerUpdate": "dpfl.algorithms.stages", "RoundInputs": "dpfl.algorithms.stages",
    "UploadMechanism": "dpfl.algorithms.stages", "MechanismRelease": "dpfl.algorithms.stages",
    "MechanismChain": "dpfl.algorithms.stages",
    "register_aggregator": "dpfl.algorithms.registry", "register_local_program": "dpfl.algorithms.registry",
    # privacy
    "ClientBudget": "dpfl.privacy.budgets", "PlannedRun": "dpfl.privacy.run_calibration",
    "calibrate_run": "dpfl.privacy.run_calibration", "epsilon": "dpfl.privacy.accountant",
    "calibrate_noise_multiplier": "dpfl.privacy.calibration",
}

# subpackages reached as attributes: dpfl.algorithms.pfa(...) is the factory of the algorithm a config names pfa
_SUBPACKAGES = ("algorithms",)

__all__ = ["__version__", *sorted(_EXPORTS), *_SUBPACKAGES]


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"dpfl.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dpfl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access does not come back here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBPACKAGES))


if TYPE_CHECKING:  # what type checkers and IDEs see
    from dpfl import algorithms
    from dpfl.algorithms.algorithm import Algorithm, central_dp_fedavg, fedavg
    from dpfl.algorithms.client.program import LocalProgram, dpsgd, sgd
    from dpfl.algorithms.registry import register_aggregator, register_local_program
    from dpfl.algorithms.selection import Selection
    from dpfl.algorithms.server.fedavg import FedAvg
    from dpfl.algorithms.server.view import ServerView
    from dpfl.algorithms.stages import (MechanismChain, MechanismRelease, RoundInputs, ServerStep, ServerUpdate,
                                        UploadMechanism)
    from dpfl.api import RunOutcome, run
    from dpfl.data.arrays import ArrayDataset
    from dpfl.data.errors import DataError
    from dpfl.data.federated import ClientData, FederatedDataset
    from dpfl.data.provided import federated_data
    from dpfl.data.registry import federated_dataset, register_dataset
    from dpfl.data.schema import Scaling, SiloSchema
    from dpfl.data.silo_files import load_silo
    from dpfl.data.silos import federated_files
    from dpfl.engine.losses import register_loss
    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import ConfigError, RunConfig, config_to_yaml, load_config, validate_config
    from dpfl.experiment.federated_run import FederatedRun, RunResult
    from dpfl.models.registry import build_model, register_model
    from dpfl.privacy.accountant import epsilon
    from dpfl.privacy.budgets import ClientBudget
    from dpfl.privacy.calibration import calibrate_noise_multiplier
    from dpfl.privacy.run_calibration import PlannedRun, calibrate_run
    from dpfl.results.privacy_report import PrivacyReport, read_privacy_report

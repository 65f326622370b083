"""Algorithms and their round stages. Every algorithm a config can name is a factory here, built by name:

    run = dpfl.algorithms.RunFacts(lr=0.5, clients=10, clip=1.0)
    algorithm = dpfl.algorithms.pfa(run, public_fraction=0.2)      # the Algorithm bundle a config would build
    algorithm = dpfl.algorithms.with_server_optimizer(algorithm, dpfl.algorithms.fedadam(lr=0.01))  # FedAdam on it

The names are imported on first use (PEP 562): `dpfl.algorithms.<name>` is the registered factory of `name`
(`registry.algorithm_spec(name).factory`), so it is dpfl's own or one the user registered.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "RunFacts": "dpfl.algorithms.catalog.context", "AlgorithmError": "dpfl.algorithms.catalog.context",
    "Algorithm": "dpfl.algorithms.algorithm", "register_algorithm": "dpfl.algorithms.registry",
    "algorithm_names": "dpfl.algorithms.registry", "algorithm_spec": "dpfl.algorithms.registry",
    **{name: "dpfl.algorithms.server.optimizers" for name in ("ServerOptimizer", "fedadagrad", "fedadam", "fedavgm",
                                                               "fedyogi", "with_server_optimizer")},
}
_ALIASES = {"central_dp_fedavg": "dp_fedavg_central"}  # the paper's name of central DP-FedAvg


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name.startswith("_"):  # never a factory; and no registry lookup while modules are being imported
        raise AttributeError(f"module 'dpfl.algorithms' has no attribute {name!r}")
    from dpfl.algorithms.registry import algorithm_names, algorithm_spec

    name = _ALIASES.get(name, name)
    if name in algorithm_names():
        return algorithm_spec(name).factory
    raise AttributeError(f"module 'dpfl.algorithms' has no attribute {name!r}")


def __dir__() -> list[str]:
    from dpfl.algorithms.registry import algorithm_names

    return sorted(set(globals()) | set(_EXPORTS) | set(_ALIASES) | set(algorithm_names()))

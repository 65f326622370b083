"""`dpfl.run`: from Python what `dpfl run` does from YAML, optionally with the user's own data and model objects.

    import dpfl
    outcome = dpfl.run("configs/demo.yaml", overrides=["training.rounds=5"], out="runs/demo")
    outcome = dpfl.run(config_dict, data=dpfl.federated_data(per_client_tensors, test=(x, y)), model=MyNet())
    outcome.final_accuracy, outcome.epsilon, outcome.run_dir, outcome.model, outcome.privacy.rigorous

Every run goes through the same path as the CLI: the config is validated, the run built (data, model,
calibration) before anything is written, then executed into a run directory with checkpoints, `privacy.json`
and `report.md`. The outcome is read back from that directory, so what Python returns is what the files say.

Objects instead of config sections: with ``data=`` the config's `data` section may be left out (it becomes
``{dataset: provided, clients: N}`` in the saved config); with ``model=`` the `model` section may be left out
(``{name: provided}``). Such a run resumes only through `dpfl.run(..., resume=True)` with the same objects.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from dpfl.data.federated import FederatedDataset
from dpfl.data.registry import PROVIDED
from dpfl.experiment.build import build_run
from dpfl.experiment.config import (ConfigError, RunConfig, apply_overrides, device_override, load_config,
                                    validate_config)
from dpfl.experiment.run_directory import CHECKPOINT, execute, load_checkpoint
from dpfl.models import build_model
from dpfl.results.privacy_report import PrivacyReport, read_privacy_report
from dpfl.results.run_files import read_metrics, read_summary

__all__ = ["RunOutcome", "run"]


@dataclass
class RunOutcome:
    """A finished run, as its run directory records it, plus the trained model.

    summary / metrics: `summary.json` and the rows of `metrics.jsonl`; privacy: `privacy.json` as a typed
    `PrivacyReport` (its `to_dict()` is the file's content; formats in `dpfl/results/FORMATS.md`). params: the
    final global parameters; model: a module holding them.
    """

    run_dir: Path
    config: RunConfig
    summary: dict[str, Any]
    privacy: PrivacyReport
    metrics: list[dict[str, Any]]
    params: dict[str, torch.Tensor]
    model: nn.Module = field(repr=False)

    @property
    def final_accuracy(self) -> float | None:
        return self.summary.get("final_accuracy")

    @property
    def epsilon(self) -> list[float] | None:
        """Each client's guarantee (privacy.json `clients[].epsilon_guarantee`), None for a run without one."""
        clients = self.privacy.clients  # every client row of an accounted run has epsilon_guarantee (FORMATS.md)
        return cast("list[float]", [c.epsilon_guarantee for c in clients]) if clients else None


def run(config: RunConfig | Mapping[str, Any] | str | Path, *, data: FederatedDataset | None = None,
        model: nn.Module | None = None, out: str | Path | None = None, resume: bool = False,
        overrides: Sequence[str] = (), on_round: Callable[[dict[str, Any]], None] | None = None,
        device: str | None = None) -> RunOutcome:
    """Run `config` (a RunConfig, a mapping like the YAML, or a YAML path) into `out` and return its outcome.

    data: a `FederatedDataset` (e.g. from `dpfl.federated_data`) used instead of the config's dataset.
    model: an `nn.Module` used as the initial global model instead of the config's registered model; it must
    keep the engine's contract (no buffers such as BatchNorm statistics; `loss_kind` attribute or cross-entropy).
    out: the run directory (default `runs/<name>-<time>`). resume: continue a killed run in `out`.
    overrides: ``FIELD.PATH=VALUE`` strings, as the CLI's ``--set``. on_round: called with each metrics row.
    device: where to train ("cpu", "cuda", "cuda:N"), the config's `device` (as the CLI's ``--device``); None keeps
    the config's. The returned `params` and `model` are on the CPU whatever the device (read from the checkpoint).
    Raises `ConfigError` (one line) for a bad config, `DataError` (a ValueError) for data that breaks its schema or
    cannot form a federated dataset, `ValueError` for bad objects or run directories.
    """
    cfg = _config(config, [*overrides, *device_override(device)], data, model)
    if data is not None and data.n_clients != cfg.data.clients:
        raise ConfigError(f"data.clients: the config says {cfg.data.clients} clients, the data object has "
                          f"{data.n_clients}", "data.clients")
    if out is None:
        if resume:
            raise ValueError("resume=True needs the run directory: pass out=")
        out = Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(out)
    built: list[nn.Module] = []

    def build() -> Any:
        federated = build_run(cfg, data=data, model=model)
        built.append(federated.model)
        return federated

    execute(cfg, out, resume=resume, on_round=on_round, build=build)
    return _outcome(cfg, out, built[0] if built else model)


def _config(config: Any, overrides: Sequence[str], data: FederatedDataset | None, model: nn.Module | None) -> RunConfig:
    if isinstance(config, RunConfig):
        if not overrides and data is None and model is None:
            return config
        raw: dict[str, Any] = config.model_dump(mode="python")
    elif isinstance(config, (str, Path)):
        cfg = load_config(config, list(overrides))
        if data is None and model is None:
            return cfg
        raw, overrides = cfg.model_dump(mode="python"), ()
    elif isinstance(config, Mapping):
        raw = copy.deepcopy(dict(config))
    else:
        raise ConfigError(f"config: expected a RunConfig, a mapping or a YAML path (got {type(config).__name__})",
                          "config")
    raw = apply_overrides(raw, overrides)
    if data is not None:
        if not isinstance(data, FederatedDataset):
            raise ValueError("data must be a dpfl FederatedDataset (see dpfl.federated_data), got "
                             f"{type(data).__name__}")
        section = raw.get("data")
        if section is None or (isinstance(section, Mapping) and section.get("dataset") == PROVIDED):
            raw["data"] = {"dataset": PROVIDED, "clients": data.n_clients,
                           **({} if section is None else {k: v for k, v in section.items() if k != "dataset"})}
        else:
            raise ConfigError(f"data: the data is given as an object, so the config's data section must be left out "
                              f"(got dataset {section.get('dataset') if isinstance(section, Mapping) else section!r})",
                              "data")
    if model is not None:
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        section = raw.get("model")
        if section is not None and not (isinstance(section, Mapping) and section.get("name") == "provided"
                                        and not section.get("options")):
            raise ConfigError("model: the model is given as an object, so the config's model section must be left out",
                              "model")
        raw["model"] = {"name": "provided"}
    return validate_config(raw)


def _outcome(cfg: RunConfig, out: Path, template: nn.Module | None) -> RunOutcome:
    """The run directory's record of the finished run, and a copy of `template` holding its final parameters."""
    summary = read_summary(out)
    assert summary is not None  # execute returns only once summary.json is written
    state = load_checkpoint(out / CHECKPOINT)
    params = {n: t.detach().clone() for n, t in state["params"].items()}
    if template is not None:
        trained = copy.deepcopy(template).to("cpu")  # the run moved its model to its device
    else:  # a finished run resumed: nothing was built, so build the architecture from the config
        shape, classes = _shape_and_classes(cfg)
        trained = build_model(cfg.model.name, shape, classes, seed=cfg.seed, **cfg.model.options)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            p.copy_(params[name])
    trained.eval()
    return RunOutcome(out, cfg, summary, read_privacy_report(out), read_metrics(out), params, trained)


def _shape_and_classes(cfg: RunConfig) -> tuple[tuple[int, ...], int]:
    from dpfl.experiment.build import build_data

    data = build_data(cfg)
    return tuple(data.input_shape), data.n_classes

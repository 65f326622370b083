"""From a validated RunConfig to a ready FederatedRun: data, model, budgets, batch sizes and the algorithm bundle
(`algorithm_bundle.build_algorithm`, re-exported here).

    cfg = load_config(Path("configs/demo.yaml"))
    run = build_run(cfg)
    result = run.run(checkpoint_every=cfg.checkpoint.every)

Randomness: data split and model initialisation use the run seed through their own streams; drawn
per-client budgets and batch sizes use dedicated streams (`BUDGETS_STREAM`, `BATCH_SIZES_STREAM`), so
changing the budget distribution never changes the data split or the initial model, and vice versa.

Problems the schema cannot see (a model that cannot take the dataset's input shape, a budget that no
noise can meet, ...) are raised as one-line `ConfigError`s naming the config section. A dataset that is
not on this machine raises `dpfl.data.DatasetNotFoundError` unchanged (its message lists where it looked).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpfl.engine.backends.base import Backend
from dpfl.engine.backends.errors import BackendError
from dpfl.engine.backends.local import LocalBackend
from dpfl.data import federated_dataset
from dpfl.data.clustered import clustered_split
from dpfl.data.registry import load_dataset
from dpfl.data.errors import ChecksumError, DataError, DatasetNotFoundError
from dpfl.data.federated import SPLITS, ClientData, FederatedDataset, PooledClients
from dpfl.data.on_nodes import records_on_nodes
from dpfl.data.registry import PROVIDED
from dpfl.data.schema import Scaling, SiloSchema
from dpfl.data.silo_files import read_records
from dpfl.data.silos import FILES, federated_files, silo_client
from dpfl.algorithms.catalog.context import AlgorithmError
from dpfl.algorithms.registry import algorithm_spec
from dpfl.experiment.algorithm_bundle import (build_algorithm, check_precision, noisy_accounting, run_facts,
                                              server_optimized)
from dpfl.experiment.config import (
    PROVIDED_MODEL,
    BatchSizeChoice,
    ChoiceBudgets,
    ConfigError,
    FixedBudgets,
    NamedBudgets,
    ParetoBudgets,
    Rhdp20Budgets,
    RunConfig,
    UniformBudgets,
    validate_config,
)
from dpfl.experiment.federated_run import FederatedRun
from dpfl.models import build_model
from dpfl.models.registry import BUILTIN_MODELS
from dpfl.privacy.adaptive_clipping import COUNT_NOISE_KEY
from dpfl.privacy.budget_distributions import draw_batch_sizes
from dpfl.privacy.budgets import Budgets, draw_budgets
from dpfl.seeding import Purpose, numpy_generator

__all__ = [
    "BATCH_SIZES_STREAM",
    "BUDGETS_STREAM",
    "DEMO_CONFIG",
    "build_algorithm",
    "build_data",
    "build_data_on_nodes",
    "build_demo_config",
    "build_run",
    "build_run_on_nodes",
    "build_silo_client",
    "build_silos",
    "noisy_accounting",
    "refuse_unaccounted_buffers",
    "resolve_batch_sizes",
    "resolve_budgets",
]

# Dedicated streams for per-client draws made when a run is built: (purpose, round key). The partition
# uses rounds 0 and 1 of Purpose.PARTITION; these keys are far from any round a run reaches.
# TODO(seeding owner): a Purpose member for run setup would make this explicit.
BUDGETS_STREAM = (Purpose.PARTITION, 1 << 20)
BATCH_SIZES_STREAM = (Purpose.PARTITION, (1 << 20) + 1)

# The README demo: every client within its own budget; seed 0 reaches 0.83 test accuracy, the run itself
# taking ~2 s here (~4 s more to calibrate the clients' noise, plus imports).
DEMO_CONFIG: dict[str, Any] = {
    "name": "demo",
    "seed": 0,
    "data": {"dataset": "digits", "clients": 10, "partition": "iid"},
    "model": {"name": "logr"},
    "algorithm": {"name": "dp_fedavg_local"},
    "training": {
        "rounds": 30,
        "local_epochs": 1,
        "batch_size": 32,
        "optimizer": {"lr": 2.0},
        "selection": {"kind": "all"},
    },
    "privacy": {
        "unit": "sample",
        "observer": "server",
        "mechanism": "dpsgd",
        "sampling": "poisson",
        "clip": 1.0,
        "budgets": {"distribution": "choice", "values": [1, 2, 4, 8]},
        "delta": 1e-5,
        "accountant": "rdp",
    },
    "evaluation": {"every": 5},
}


def build_demo_config() -> RunConfig:
    """The README demo (same as configs/demo.yaml): digits, 10 clients, logistic regression, DP-SGD."""
    return validate_config(DEMO_CONFIG)


# ---- pieces -------------------------------------------------------------------------------------------


def build_data(cfg: RunConfig) -> FederatedDataset:
    """The federated dataset of `cfg.data`, split with the run seed (given silos: read and checked, never split).

    A problem in the user's files is a `DataError`, one line naming the file and the row or column."""
    d = cfg.data
    if d.dataset == FILES:
        return build_silos(cfg)
    kw: dict[str, Any] = dict(partition=d.partition, client_test_fraction=d.client_test_fraction,
                              client_val_fraction=d.client_val_fraction,
                              max_train_samples=d.max_train_samples, **d.options)
    if d.partition in ("dirichlet", "dirichlet_quota"):
        kw["alpha"] = d.alpha
    elif d.partition == "shards":
        kw["shards_per_client"] = d.shards_per_client
    if d.samples_per_client is not None:  # the schema allows it with dirichlet_quota and iid_equal only
        kw["samples_per_client"] = d.samples_per_client
    try:
        if d.partition == "clustered":
            c = d.clustered
            assert c is not None  # the schema pairs the partition with its section
            base = load_dataset(d.dataset, Path(d.root) if d.root else None, **d.options)
            return clustered_split(base, d.clients, c.clusters, shift=c.shift, minority_ratio=c.minority_ratio,
                                   n_train_per_client=c.train_per_client, val_frac=c.val_fraction, seed=cfg.seed,
                                   disjoint=c.disjoint, purity=c.purity,
                                   normalize=tuple(c.normalize) if c.normalize else None)
        return federated_dataset(d.dataset, d.clients, root=Path(d.root) if d.root else None, seed=cfg.seed, **kw)
    except (DatasetNotFoundError, ChecksumError, DataError):
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"data: {err}", "data") from None


def build_silos(cfg: RunConfig) -> FederatedDataset:
    """The user's silo files of `cfg.data` (data.silos), one client each, checked against the declared schema."""
    d, (paths, names), schema, scaling = cfg.data, _silo_sources(cfg), *_silo_declarations(cfg)
    return federated_files(paths, schema, test=d.test, client_test_fraction=d.client_test_fraction,
                           client_val_fraction=d.client_val_fraction, seed=cfg.seed, scaling=scaling, names=names)


def build_silo_client(cfg: RunConfig, client: int, path: str | Path | None = None) -> ClientData:
    """Client `client`'s data alone, exactly as `build_silos` gives it (the same checks, scaling and local
    test/validation shares): what one federated node loads. `path`: the node's own file or folder (a Flower node's
    `silo`), instead of the config's entry for that client."""
    d, (paths, _), schema, scaling = cfg.data, _silo_sources(cfg), *_silo_declarations(cfg)
    if not 0 <= client < len(paths):
        raise ConfigError(f"data.silos: no client {client} (the config lists {len(paths)} silos)", "data.silos")
    return silo_client(paths[client] if path is None else path, schema, client=client, seed=cfg.seed,
                       client_test_fraction=d.client_test_fraction, client_val_fraction=d.client_val_fraction,
                       scaling=scaling)


def build_data_on_nodes(cfg: RunConfig, records: Sequence[int]) -> FederatedDataset:
    """The server's data of a federation whose nodes read their own silos (data.silos): the record count each
    client's node reported, in client order, and the shared test file (data.test), the only file the server reads."""
    d, (_, names), schema, scaling = cfg.data, _silo_sources(cfg), *_silo_declarations(cfg)
    if d.test is None:
        raise ConfigError("data.test: in a federation the server evaluates the global model and holds no silo: give "
                          "a shared test file (client_test_fraction's shares stay on the nodes)", "data.test")
    if len(records) != d.clients:
        raise ConfigError(f"data.silos: {len(records)} nodes reported records, the config lists {d.clients} silos",
                          "data.silos")
    x_test, y_test = read_records(d.test, schema, scaling)
    info = {"dataset": FILES, "silos": names, "test": d.test, "seed": cfg.seed,
            "client_test_fraction": d.client_test_fraction}
    return records_on_nodes([int(n) for n in records], torch.from_numpy(np.ascontiguousarray(x_test)),
                            torch.from_numpy(np.ascontiguousarray(y_test)), schema.n_classes, info=info)


def _silo_sources(cfg: RunConfig) -> tuple[list[str], list[str]]:
    """The silos' paths and names (a silo's name defaults to its file's stem)."""
    silos = cfg.data.silos
    if cfg.data.dataset != FILES or silos is None:
        raise ConfigError(f"data: dataset {cfg.data.dataset!r} has no silo files (data.silos)", "data.silos")
    paths = [s if isinstance(s, str) else s.path for s in silos]
    names = [Path(s).stem if isinstance(s, str) else (s.name or Path(s.path).stem) for s in silos]
    return paths, names


def _silo_declarations(cfg: RunConfig) -> tuple[SiloSchema, Scaling | None]:
    d = cfg.data
    assert d.schema_ is not None  # the config requires a schema with dataset 'files'
    return d.schema_.to_schema(), (d.scaling.to_scaling(d.schema_) if d.scaling != "none" else None)


def resolve_budgets(cfg: RunConfig) -> Budgets | None:
    """One ClientBudget per client, as Budgets (arrays; None when the run is not private).

    Distributions are drawn from the run seed's budget stream (the PFA / Robust-HDP ones by name, see
    `dpfl.privacy.budget_distributions`; `rhdp20` is a fixed list and draws nothing). A param_noise run
    (Noisy-FedAvg/FedProx) without budgets gets unlimited ones: its noise σ is given, not calibrated, so it
    runs all its rounds and reports what it spent.
    """
    p, n = cfg.privacy, cfg.data.clients
    b = p.budgets
    if b is None:
        return Budgets(np.full(n, float("inf")), p.delta) if p.mechanism == "param_noise" else None
    if isinstance(b, float):
        eps = np.full(n, b)
    elif isinstance(b, list):
        eps = list(b)
    else:
        rng = numpy_generator(cfg.seed, BUDGETS_STREAM[0], BUDGETS_STREAM[1])
        kind: str
        params: dict[str, Any]
        if isinstance(b, UniformBudgets):
            kind, params = "uniform", dict(low=b.low, high=b.high)
        elif isinstance(b, ChoiceBudgets):
            kind, params = "choice", dict(values=b.values, probs=b.probs)
        elif isinstance(b, FixedBudgets):
            kind, params = "fixed", dict(value=b.epsilon)
        elif isinstance(b, NamedBudgets):
            kind, params = b.distribution, dict(eps_floor=b.eps_floor)
        elif isinstance(b, ParetoBudgets):
            kind, params = "Pareto", dict(eps_floor=b.eps_floor, pareto_cap=b.pareto_cap)
        elif isinstance(b, Rhdp20Budgets):
            kind, params = "rhdp20", dict(dist=b.dist)
        else:  # pragma: no cover - the schema admits nothing else
            raise ConfigError(f"privacy.budgets: unsupported budgets {b!r}", "privacy.budgets")
        try:
            drawn = draw_budgets(kind, n, rng, **params)
        except ValueError as err:
            raise ConfigError(f"privacy.budgets: {err}", "privacy.budgets") from None
        eps = drawn
    return Budgets(eps, p.delta)


def resolve_batch_sizes(cfg: RunConfig, data: FederatedDataset | None = None) -> list[int]:
    """One batch size per client; a distribution is drawn from the run seed's batch-size stream.

    ``hetero`` draws each size uniformly from {16, 32, 64, 128} (the same draw as the equivalent
    ``{distribution: choice}``); ``rhdp20`` is the RHDP code's fixed 20-client list; ``full`` is each
    client's training-set size (needs `data`).
    """
    bs, n = cfg.training.batch_size, cfg.data.clients
    if bs == "full":
        if data is None:
            raise ConfigError("training.batch_size: 'full' needs the data to size each client's batch",
                              "training.batch_size")
        return [int(v) for v in data.train_sizes]
    if isinstance(bs, int):
        return [bs] * n
    if isinstance(bs, list):
        return list(bs)
    rng = numpy_generator(cfg.seed, BATCH_SIZES_STREAM[0], BATCH_SIZES_STREAM[1])
    if isinstance(bs, str):
        try:
            return draw_batch_sizes(bs, n, rng)
        except ValueError as err:
            raise ConfigError(f"training.batch_size: {err}", "training.batch_size") from None
    assert isinstance(bs, BatchSizeChoice)
    return [int(v) for v in rng.choice(np.asarray(bs.values), size=n, p=bs.probs)]


def model_is_users(cfg: RunConfig) -> bool:
    """True for a model passed as an object or registered with `register_model` (not one of dpfl's own)."""
    return cfg.model.name == PROVIDED_MODEL or cfg.model.name not in BUILTIN_MODELS


def check_model_contract(model: nn.Module, data: FederatedDataset, *, user: bool) -> None:
    """A user's model must keep the engine's contract: checked once, with a one-line reason if it does not.

    No buffers (BatchNorm's running statistics mix the records of a batch, so per-sample gradients, and with
    them DP-SGD's guarantee, would be wrong) and an output of one row of `n_classes` scores per sample.
    """
    if not user:
        return
    buffers = [n for n, _ in model.named_buffers()]
    if buffers:
        raise ConfigError(f"model: has buffers {buffers[:3]} (e.g. BatchNorm statistics), which mix the records of a "
                          "batch and break per-sample gradients; use GroupNorm/LayerNorm or none", "model")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError("model: has no trainable parameters", "model")
    x = data.clients[0].x_train[:2]
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as err:  # noqa: BLE001 - any failure of the user's forward is reported in one line
        raise ConfigError(f"model: its forward pass fails on a batch of shape {tuple(x.shape)}: "
                          f"{type(err).__name__}: {err}".splitlines()[0], "model") from None
    classes = max(1, data.n_classes)
    if isinstance(out, torch.Tensor) and out.ndim == 2 and out.shape[0] == len(x) and 0 < out.shape[1] < classes:
        _refuse_labels_beyond(data, int(out.shape[1]))
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(x), classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model: must map a batch [B, {', '.join(map(str, data.input_shape))}] to scores [B, "
                          f"{classes}] (one per class), got {got}", "model")


def _refuse_labels_beyond(data: FederatedDataset, width: int) -> None:
    """A label the model has no score for is the data's problem (a label outside the classes), said as such."""
    clients = data.clients
    if isinstance(clients, PooledClients):  # only the first client with such a label is named: found with numpy
        first: list[tuple[int, int, str]] = []  # (client, split order, split) of each split's first such label
        for order, name in enumerate(SPLITS):
            _, y, offsets = clients.split(name)
            beyond = np.flatnonzero(y.numpy() >= width) if y.numel() else np.zeros(0, dtype=np.int64)
            if len(beyond):
                first.append((int(np.searchsorted(offsets, beyond[0], side="right")) - 1, order, name))
        clients = [] if not first else [None] * min(first)[0] + [clients[min(first)[0]]]
    splits = [("test", data.y_test)] + [(f"client {i} {name}", y) for i, c in enumerate(clients) if c is not None
                                          for name, y in (("train", c.y_train), ("test", c.y_test), ("val", c.y_val))]
    for where, y in splits:
        if y is not None and y.numel() and int(y.max()) >= width:
            raise DataError(f"data: {where} has label {int(y.max())}, outside the model's {width} classes "
                            f"(0..{width - 1}): labels must be class indices below the number of classes")


def refuse_unaccounted_buffers(cfg: RunConfig, model: Any) -> None:
    """Parameter noise covers parameters only: a model with buffers (BatchNorm statistics) is refused."""
    if cfg.privacy.mechanism == "param_noise" and any(True for _ in model.buffers()):
        raise ConfigError(f"model: {cfg.model.name!r} has buffers (e.g. BatchNorm running statistics), which the "
                          "f-DP analysis of parameter noise does not cover; use a GroupNorm model", "model")


# ---- the run ------------------------------------------------------------------------------------------


def _calibration_target(cfg: RunConfig) -> str | float:
    """min_eps / max_eps calibrate every client to one epsilon (observed from the reports, or given)."""
    if cfg.algorithm.name not in ("min_eps", "max_eps"):
        return "own"
    eps = cfg.algorithm.params.get("epsilon", "observed")
    if eps == "observed":
        return "min" if cfg.algorithm.name == "min_eps" else "max"
    return float(eps)


def refuse_mismatched_objects(cfg: RunConfig, data: Any, model: Any, call: str) -> None:
    """Data and model objects come with the config's `provided` names and only with them (`call` names the entry
    point in the message, e.g. "dpfl.run(config")."""
    if (cfg.data.dataset == PROVIDED) != (data is not None):
        raise ConfigError(f"data: dataset {PROVIDED!r} means the data is passed as an object ({call}, data=...)); "
                          "any other dataset is loaded from the config", "data")
    if (cfg.model.name == PROVIDED_MODEL) != (model is not None):
        raise ConfigError(f"model: name {PROVIDED_MODEL!r} means the model is passed as an object ({call}, "
                          "model=...)); any other name is built from the registry", "model")


def build_backend(cfg: RunConfig) -> Backend:
    """Where the run's local training happens; `backend: ray` without Ray installed is one line naming the extra."""
    if cfg.backend == "local":
        return LocalBackend()
    from dpfl.engine.backends.ray import RayBackend, import_ray

    try:
        import_ray()
    except BackendError as err:
        raise ConfigError(f"backend: {err}", "backend") from None
    assert cfg.ray is not None  # filled in by the schema
    return RayBackend(actors=cfg.ray.actors, threads=cfg.ray.threads_per_actor, address=cfg.ray.address,
                      gpus=cfg.ray.gpus_per_actor)


def build_run(cfg: RunConfig, *, data: FederatedDataset | None = None, model: nn.Module | None = None) -> FederatedRun:
    """A FederatedRun for `cfg`; call ``.run(checkpoint_every=cfg.checkpoint.every)`` on it.

    `data` / `model`: the user's own objects (`dpfl.run`), for configs whose data section is
    ``{dataset: provided}`` / whose model is ``{name: provided}``; the model is copied, never trained in place.
    """
    refuse_mismatched_objects(cfg, data, model, "dpfl.run(config")
    return _assemble(cfg, data if data is not None else build_data(cfg), model)


def build_run_on_nodes(cfg: RunConfig, records: Sequence[int]) -> FederatedRun:
    """The server's FederatedRun of a federation whose clients read their own silo files (`build_data_on_nodes`):
    calibrated for the reported record counts; its clients train only through `remote_clients`."""
    return _assemble(cfg, build_data_on_nodes(cfg, records), None)


def _assemble(cfg: RunConfig, data: FederatedDataset, model: nn.Module | None) -> FederatedRun:
    """The run of `cfg` on `data`, with the user's `model` (copied) or the config's."""
    if model is not None:
        model = copy.deepcopy(model)
    else:
        try:
            model = build_model(cfg.model.name, tuple(data.input_shape), data.n_classes, seed=cfg.seed,
                                **cfg.model.options)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"model: {err}", "model") from None
    data = data.with_feature_dtype(next(model.parameters()).dtype)  # a float64 network (MP-DP's) reads float64
    check_model_contract(model, data, user=model_is_users(cfg))
    refuse_unaccounted_buffers(cfg, model)
    budgets = resolve_budgets(cfg)
    noise = cfg.privacy.noise_multiplier if cfg.privacy.mechanism == "dpsgd" else None
    try:
        spec = algorithm_spec(cfg.algorithm.name)
        if spec.with_data:  # the clustered algorithms: their noise depends on the split
            assert budgets is not None  # dpsgd runs need budgets (the schema)
            facts = dataclasses.replace(run_facts(cfg, model), data=data, budgets=tuple(budgets),
                                        batch_sizes=tuple(int(b) for b in resolve_batch_sizes(cfg, data)))
            try:
                built = spec.factory(facts, **cfg.algorithm.params)
            except AlgorithmError as err:
                raise ConfigError(str(err), err.key) from None
            algorithm, noise = built.algorithm, built.noise_multipliers
            check_precision(cfg, algorithm)
            algorithm = server_optimized(cfg, algorithm)
        else:
            algorithm = build_algorithm(cfg, model, tuple(data.input_shape))
    except ValueError as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"algorithm: {err}", "algorithm") from None
    calibrating = (cfg.privacy.mechanism == "dpsgd" and noise is None) or algorithm.uncalibrated_stage() is not None
    try:
        return FederatedRun(
            data, model, algorithm,
            rounds=cfg.training.rounds,
            batch_sizes=resolve_batch_sizes(cfg, data),
            budgets=budgets,
            noise_multipliers=noise,
            accountant=cfg.privacy.accountant,
            seed=cfg.seed,
            eval_every=cfg.evaluation.every,
            calibrate_to=_calibration_target(cfg),
            allow_budget_violation=cfg.privacy.allow_budget_violation,
            misreport=({cfg.privacy.misreport.client: cfg.privacy.misreport.factor}
                       if cfg.privacy.misreport is not None else None),
            calibration=cfg.privacy.calibration,
            participation=cfg.privacy.participation,
            backend=build_backend(cfg),
            device=cfg.device,
        )
    except ValueError as err:
        if str(err).startswith(f"{COUNT_NOISE_KEY}: "):  # the adaptive clip's count leaves the update no budget
            raise ConfigError(str(err), COUNT_NOISE_KEY) from None
        where = "privacy.budgets" if calibrating else "config"
        what = "cannot calibrate the noise: " if calibrating else ""
        raise ConfigError(f"{where}: {what}{err}", where) from None

"""From a validated RunConfig to a ready FederatedRun: data, model, algorithm bundle, budgets, batch sizes.

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
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.client.param_noise import ParameterNoise
from dpfl.algorithms.client.program import LocalProgram, clipped_sgd, dpsgd, sgd
from dpfl.algorithms.client.additive_personal import AdditivePersonal
from dpfl.algorithms.client.phased import PhasedProgram
from dpfl.algorithms.client.private_head import PrivateHead
from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.registry import AGGREGATORS, LOCAL_PROGRAMS
from dpfl.algorithms.secure.aggregator import DistributedDPFedAvg, SecureAggregation, SecureFedAvg
from dpfl.algorithms.secure.protocol import default_threshold
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.oracle import OracleAverage
from dpfl.algorithms.server.pfa import PFA
from dpfl.algorithms.server.fedceo import FedCEO
from dpfl.algorithms.server.splitting import AndersonII
from dpfl.algorithms.server.splitting import presets as splitting_presets
from dpfl.algorithms.server.splitting.aggregator import EngineOperator, SplittingAggregator
from dpfl.algorithms.server.pfa_plus import PFAPlus
from dpfl.algorithms.server.robust_hdp import RobustHDP
from dpfl.engine.backends.base import Backend
from dpfl.engine.backends.errors import BackendError
from dpfl.engine.backends.local import LocalBackend
from dpfl.data import federated_dataset
from dpfl.data.clustered import clustered_split
from dpfl.data.registry import load_dataset
from dpfl.data.errors import ChecksumError, DatasetNotFoundError
from dpfl.data.federated import FederatedDataset
from dpfl.data.registry import PROVIDED
from dpfl.experiment.config import (
    ALGORITHM_PARAMS,
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
from dpfl.experiment.config.vocabulary import CLUSTERED_ALGORITHMS, SPLITTING_ALGORITHMS
from dpfl.experiment.clustered_build import build_clustered
from dpfl.experiment.federated_run import FederatedRun
from dpfl.models import build_model, model_info
from dpfl.models.registry import BUILTIN_MODELS
from dpfl.privacy.budget_distributions import draw_batch_sizes
from dpfl.privacy.budgets import ClientBudget, draw_budgets
from dpfl.privacy.fdp_run import NoisyRunAccounting
from dpfl.privacy.fdp_sensitivity import step_sizes as fdp_step_sizes
from dpfl.seeding import Purpose, numpy_generator

__all__ = [
    "BATCH_SIZES_STREAM",
    "BUDGETS_STREAM",
    "DEMO_CONFIG",
    "build_algorithm",
    "build_data",
    "build_demo_config",
    "build_run",
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
    """The federated dataset of `cfg.data`, split with the run seed."""
    d = cfg.data
    kw: dict[str, Any] = dict(partition=d.partition, client_test_fraction=d.client_test_fraction,
                              client_val_fraction=d.client_val_fraction,
                              max_train_samples=d.max_train_samples, **d.options)
    if d.partition in ("dirichlet", "dirichlet_quota"):
        kw["alpha"] = d.alpha
    elif d.partition == "shards":
        kw["shards_per_client"] = d.shards_per_client
    if d.samples_per_client is not None:  # the schema allows it with dirichlet_quota only
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
    except (DatasetNotFoundError, ChecksumError):
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"data: {err}", "data") from None


def resolve_budgets(cfg: RunConfig) -> list[ClientBudget] | None:
    """One ClientBudget per client (None when the run is not private).

    Distributions are drawn from the run seed's budget stream (the PFA / Robust-HDP ones by name, see
    `dpfl.privacy.budget_distributions`; `rhdp20` is a fixed list and draws nothing). A param_noise run
    (Noisy-FedAvg/FedProx) without budgets gets unlimited ones: its noise σ is given, not calibrated, so it
    runs all its rounds and reports what it spent.
    """
    p, n = cfg.privacy, cfg.data.clients
    b = p.budgets
    if b is None:
        return [ClientBudget(float("inf"), p.delta)] * n if p.mechanism == "param_noise" else None
    if isinstance(b, float):
        eps = [b] * n
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
        eps = [float(e) for e in drawn]
    return [ClientBudget(e, p.delta) for e in eps]


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


def _local_program(cfg: RunConfig, loss: str, *, private: bool, prox_mu: float = 0.0, lr_factor: float = 1.0,
                   trainable: tuple[str, ...] | None = None, epochs: float | None = None) -> LocalProgram:
    """The configured local program; `epochs` replaces the configured length (CENTAUR's head phase)."""
    t, p = cfg.training, cfg.privacy
    if epochs is not None:
        length: dict[str, Any] = dict(epochs=epochs)
    else:
        length = dict(steps=t.local_steps) if t.local_steps is not None else dict(epochs=t.local_epochs)
    common = dict(loss=loss, momentum=t.optimizer.momentum, prox_mu=prox_mu, trainable=trainable, **length)
    lr = t.optimizer.lr * lr_factor
    if cfg.algorithm.local is not None:
        return _registered_local(cfg, lr, private, common)
    program = dpsgd(lr, p.clip, sampling=p.sampling, **common) if private else sgd(lr, **common)
    if t.micro_batch is not None:
        program = dataclasses.replace(program, spec=dataclasses.replace(program.spec, micro_batch=t.micro_batch))
    return program


def _registered_local(cfg: RunConfig, lr: float, private: bool, common: dict[str, Any]) -> LocalProgram:
    """A user-registered local program, checked to be accounted exactly as the config's mechanism says."""
    stage, p = cfg.algorithm.local, cfg.privacy
    assert stage is not None
    where = "algorithm.local"
    kwargs = dict(lr=lr, loss=common["loss"], steps=common.get("steps"), epochs=common.get("epochs"),
                  momentum=common["momentum"], prox_mu=common["prox_mu"], private=private,
                  clip=p.clip if private else None, sampling=p.sampling if private else None)
    try:
        program = LOCAL_PROGRAMS[stage.name](**kwargs, **stage.params)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: local program {stage.name!r} could not be built: {err}", where) from None
    if not isinstance(program, LocalProgram):
        raise ConfigError(f"{where}: local program {stage.name!r} must return a LocalProgram (dpfl's sgd or dpsgd), "
                          f"got {type(program).__name__}", where)
    if program.private != private:
        need = "DP-SGD (dpfl's dpsgd)" if private else "non-private (dpfl's sgd)"
        raise ConfigError(f"{where}: mechanism {p.mechanism!r} needs a {need} local program; {stage.name!r} is "
                          f"{'private' if program.private else 'not private'}", where)
    if private and (program.spec.clip != p.clip or program.spec.sampling != p.sampling):
        raise ConfigError(f"{where}: {stage.name!r} clips at {program.spec.clip} with {program.spec.sampling} "
                          f"sampling; the run is accounted for privacy.clip {p.clip} and {p.sampling} sampling", where)
    return program


def _registered_aggregator(cfg: RunConfig) -> Any:
    """A user-registered aggregator (post-processing of what the server received)."""
    stage, where = cfg.algorithm.aggregator, "algorithm.aggregator"
    assert stage is not None
    try:
        aggregator = AGGREGATORS[stage.name](**stage.params)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: aggregator {stage.name!r} could not be built: {err}", where) from None
    if not callable(getattr(aggregator, "aggregate", None)):
        raise ConfigError(f"{where}: {stage.name!r} must return an object with aggregate(global_params, uploads, "
                          f"view, seed, round_), got {type(aggregator).__name__}", where)
    return aggregator


def _model_facts(cfg: RunConfig, model: nn.Module | None) -> tuple[str, list[str], str | None]:
    """(loss, parameter names, head module) of the run's model: the built module's own, else the registry's."""
    if model is not None:
        info = model_info(cfg.model.name) if cfg.model.name != PROVIDED_MODEL else None
        head = getattr(model, "head_name", None) or (info.head if info is not None else None)
        return getattr(model, "loss_kind", "cross_entropy"), [n for n, _ in model.named_parameters()], head or None
    info = model_info(cfg.model.name)
    # parameter names do not depend on the input shape: read them off a small instance
    small = build_model(cfg.model.name, info.small_shape, info.reference_classes, **cfg.model.options)
    return info.loss, [n for n, _ in small.named_parameters()], info.head or None


def _centaur(cfg: RunConfig, loss: str, head_epochs: float, private: bool, names: list[str],
             head_module: str | None) -> tuple[PhasedProgram, PrivateHead]:
    """CENTAUR's two-phase local program (head, then representation) and its client-side heads."""
    if head_module is None or not any(n.startswith(head_module + ".") for n in names):
        raise ConfigError(f"model: CENTAUR needs a model with a head (mlp2, lenet5), got {cfg.model.name!r}", "model")
    head = tuple(n for n in names if n.startswith(head_module + "."))
    body = tuple(n for n in names if n not in head)
    if not body:
        raise ConfigError(f"model: CENTAUR needs a representation below the head; {cfg.model.name!r} is only a head",
                          "model")
    phases = (_local_program(cfg, loss, private=private, trainable=head, epochs=head_epochs),
              _local_program(cfg, loss, private=private, trainable=body))
    return PhasedProgram(phases), PrivateHead(head)


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
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(x), classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model: must map a batch [B, {', '.join(map(str, data.input_shape))}] to scores [B, "
                          f"{classes}] (one per class), got {got}", "model")


def refuse_unaccounted_buffers(cfg: RunConfig, model: Any) -> None:
    """Parameter noise covers parameters only: a model with buffers (BatchNorm statistics) is refused."""
    if cfg.privacy.mechanism == "param_noise" and any(True for _ in model.buffers()):
        raise ConfigError(f"model: {cfg.model.name!r} has buffers (e.g. BatchNorm running statistics), which the "
                          "f-DP analysis of parameter noise does not cover; use a GroupNorm model", "model")


def noisy_accounting(cfg: RunConfig) -> NoisyRunAccounting:
    """The f-DP accounting of a noisy_fedavg / noisy_fedprox config: its realised step sizes η[T, K] and threat
    model."""
    p, t, params = cfg.privacy, cfg.training, cfg.algorithm.params
    assert t.local_steps is not None  # the schema requires it for these algorithms
    schedule = params["schedule"]
    if schedule == "custom":
        eta = np.asarray(params["step_sizes"], dtype=np.float64)
    else:
        eta = fdp_step_sizes(schedule, t.optimizer.lr, t.rounds, t.local_steps)
    fedprox = cfg.algorithm.name == "noisy_fedprox"
    return NoisyRunAccounting(
        "fedprox" if fedprox else "fedavg", schedule, eta, float(p.clip), params["std"],
        view="aggregate" if p.observer == "aggregate" else "upload", release=p.release,
        alpha=params["alpha"] if fedprox else None, smoothness_L=p.smoothness_L, honest_clients=p.honest_clients,
        secure_aggregation=p.secure_aggregation, clip_mode=params["clip_mode"])


def _noisy(cfg: RunConfig, params: Any, loss: str, selection: Selection) -> Algorithm:
    """Noisy-FedAvg/FedProx: clipped local steps on the schedule, parameter noise on upload, a plain mean."""
    accounting = noisy_accounting(cfg)
    if accounting.sigma is not None:  # sigma given: every round's event must be computable before anything runs
        cohort = cfg.planned_cohort or 1
        try:
            for t in range(accounting.rounds):
                accounting.event(t, cohort)
        except (ValueError, ZeroDivisionError, OverflowError) as err:
            raise ConfigError(f"algorithm.params: the f-DP accounting of these settings fails (std, privacy.clip, "
                              f"step sizes): {err}", "algorithm.params") from None
    local = clipped_sgd(accounting.step_sizes, accounting.clip, clip_mode=params.clip_mode,
                        sampling=params.batch_sampling, loss=loss, prox_mu=accounting.alpha or 0.0)
    aggregator = _registered_aggregator(cfg) if cfg.algorithm.aggregator is not None else FedAvg("uniform")
    if cfg.secure_aggregation is not None:  # the aggregate view, for real: the server sees only the sum
        aggregator = SecureFedAvg(_secure_protocol(cfg))
    return Algorithm(cfg.algorithm.name, local, selection, ParameterNoise(accounting), aggregator)


def _splitting(cfg: RunConfig, params: Any, loss: str, selection: Selection) -> Algorithm:
    """A splitting preset on a network: the engine's (DP-)SGD from each client's u_i (on the prox objective for prox
    presets), the scheme's server step over the population's u and z; udp: one N(0, z^2 C^2) per upload (cohort 1).

    fedsplit / fedpi / fedrp: eta is the prox step (mu = 1/eta). fedavg / fedprox with `anderson`: the presets of the
    same names (fedavg's eta is the local learning rate, fedprox's is 1/mu), so Anderson can accelerate them."""
    p, mech, name = cfg.privacy, cfg.privacy.mechanism, cfg.algorithm.name
    if cfg.algorithm.aggregator is not None:
        raise ConfigError(f"algorithm.aggregator: {name} is its own aggregator (the splitting server step)",
                          "algorithm.aggregator")
    if name == "fedavg":
        eta, kind, mu = cfg.training.optimizer.lr, "gradient", 0.0
    elif name == "fedprox":
        eta, kind, mu = 1.0 / params.mu, "prox", params.mu
    else:
        eta, kind, mu = params.eta, "prox", 1.0 / params.eta
    a = params.anderson
    options = {k: getattr(params, k) for k in ("mode", "report", "ergodic") if hasattr(params, k)}
    try:
        anderson = AndersonII(a.memory, a.scope, a.blend, a.safeguard) if a is not None else None
        scheme = splitting_presets.make(name, eta, EngineOperator(kind), anderson=anderson, participation=selection,
                                        schedule=params.schedule, period=params.period, **options)
    except ValueError as err:
        raise ConfigError(f"algorithm.params: {err}", "algorithm.params") from None
    local = _local_program(cfg, loss, private=mech == "dpsgd", prox_mu=mu)
    if scheme.schedule.name != "constant":  # eta_t is the local lr (gradient presets) or the prox step 1/mu_t
        etas = [scheme.schedule(t) for t in range(cfg.training.rounds)]
        specs = [dataclasses.replace(local.spec, **({"lr": e} if kind == "gradient" else {"prox_mu": 1.0 / e}))
                 for e in etas]
        local = dataclasses.replace(local, round_specs=tuple(specs))
    upload: Any = ClippedNoisyUpdate(p.clip, p.noise_multiplier, 1.0) if mech == "udp" else FullUpdate()
    aggregator = SplittingAggregator(scheme, cfg.data.clients, noisy=mech != "none")
    return Algorithm(name, local, selection, upload, aggregator)


def build_algorithm(cfg: RunConfig, model: nn.Module | None = None) -> Algorithm:
    """The algorithm bundle named by `cfg.algorithm`, with the stages its privacy mechanism needs.

    `model`: the run's built model (its loss and parameter names); default: the registry's facts of `cfg.model`.
    A noise the config leaves unset stays None in its stage: `FederatedRun` calibrates it from the budgets.
    """
    name, mech, p = cfg.algorithm.name, cfg.privacy.mechanism, cfg.privacy
    if name in CLUSTERED_ALGORITHMS:
        raise ConfigError(f"algorithm: {name} is built with its data (build_run): its noise depends on the split",
                          "algorithm")
    params = ALGORITHM_PARAMS[name].model_validate(cfg.algorithm.params)
    loss, names, head_module = _model_facts(cfg, model)
    sel = cfg.training.selection
    selection = Selection(sel.kind, sel.k, sel.rate)
    protocol = _secure_protocol(cfg) if cfg.secure_aggregation is not None else None
    if name in ("noisy_fedavg", "noisy_fedprox"):
        return _noisy(cfg, params, loss, selection)
    if name in SPLITTING_ALGORITHMS or getattr(params, "splitting", False):
        return _splitting(cfg, params, loss, selection)
    mu = getattr(params, "mu", 0.0)
    personal: Any = AdditivePersonal(params.alpha) if name == "ppsgd" else None
    local: Any = _local_program(cfg, loss, private=mech == "dpsgd", prox_mu=mu,
                                lr_factor=personal.lr_factor if personal is not None else 1.0)
    if name == "centaur":
        local, personal = _centaur(cfg, loss, params.head_epochs, private=mech == "dpsgd", names=names,
                                   head_module=head_module)
    if name == "dp_fedavg_central":  # the server's noise: given, or calibrated by FederatedRun from the budgets
        central: Any = CentralDPFedAvg(p.clip, p.noise_multiplier, params.server_lr) if protocol is None \
            else DistributedDPFedAvg(p.clip, p.noise_multiplier, params.server_lr, protocol=protocol)
        return Algorithm(name, local, selection, FullUpdate(), central)
    if name == "oracle":
        aggregator: Any = OracleAverage(params.server_lr)
    elif name == "robust_hdp":
        aggregator = RobustHDP(**params.model_dump())
    elif name == "fedceo":
        aggregator = FedCEO(**params.model_dump())
    elif name in ("pfa", "pfa_plus"):
        fields = params.model_dump()
        if fields["public_clients"] is not None:
            fields["public_clients"] = tuple(fields["public_clients"])
        plus = {key: fields.pop(key) for key in ("warmup_rounds", "subspace_broadcast") if key in fields}
        aggregator = PFA(**fields) if name == "pfa" else PFAPlus(PFA(**fields), **plus)
    elif name == "weiavg":
        aggregator = FedAvg("epsilon", params.server_lr)
    elif name in ("ppsgd", "centaur"):
        aggregator = FedAvg("uniform")
    else:
        aggregator = FedAvg(params.weighting, params.server_lr)
    if mech == "udp":
        # FedCEO Algorithm 1: the noise is split over the expected cohort (the sum carries σC)
        cohort = max(1.0, selection.expected_count(cfg.data.clients))
        scale = cfg.training.optimizer.lr if p.paper_eta_scaling else 1.0
        if p.per_upload_amplification and selection.kind != "poisson":
            raise ConfigError("privacy.per_upload_amplification: needs Poisson client selection "
                              f"(training.selection.kind: poisson), got {selection.kind!r}",
                              "privacy.per_upload_amplification")
        if protocol is not None:  # distributed noise: split over the protocol's threshold t
            planned = cfg.planned_cohort
            assert planned is not None  # the schema requires a fixed cohort here
            cohort = protocol.threshold_for(planned)
        upload: Any = ClippedNoisyUpdate(p.clip, p.noise_multiplier, cohort, upload_scale=scale,
                                         hidden_sampling=p.per_upload_amplification, secure_sum=protocol is not None)
    elif p.paper_eta_scaling or p.per_upload_amplification:
        option = "paper_eta_scaling" if p.paper_eta_scaling else "per_upload_amplification"
        raise ConfigError(f"privacy.{option}: applies to mechanism udp only", f"privacy.{option}")
    else:
        upload = FullUpdate()
    if cfg.algorithm.aggregator is not None:  # the schema allows it only where aggregation is post-processing
        aggregator = _registered_aggregator(cfg)
    if protocol is not None:  # the schema allows it only with plain FedAvg aggregation
        aggregator = SecureFedAvg(protocol, aggregator.weighting, aggregator.server_lr)
    return Algorithm(name, local, selection, upload, aggregator, personal)


def _secure_protocol(cfg: RunConfig) -> SecureAggregation:
    """The protocol's settings; with a fixed cohort the threshold is fixed for the run (floor(K/2) + 1 by default),
    so a noise share split over t stays valid even if the cohort shrinks (the protocol then refuses the round)."""
    s = cfg.secure_aggregation
    assert s is not None
    planned = cfg.planned_cohort
    threshold = s.threshold if s.threshold is not None else (default_threshold(planned) if planned is not None
                                                             else None)
    return SecureAggregation(threshold, s.ring_bits, s.frac_bits, s.dropout, s.workers,
                             run_id=f"dpfl/{cfg.name}/{cfg.seed}".encode())


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
    return RayBackend(actors=cfg.ray.actors, threads=cfg.ray.threads_per_actor, address=cfg.ray.address)


def build_run(cfg: RunConfig, *, data: FederatedDataset | None = None, model: nn.Module | None = None) -> FederatedRun:
    """A FederatedRun for `cfg`; call ``.run(checkpoint_every=cfg.checkpoint.every)`` on it.

    `data` / `model`: the user's own objects (`dpfl.run`), for configs whose data section is
    ``{dataset: provided}`` / whose model is ``{name: provided}``; the model is copied, never trained in place.
    """
    if cfg.device != "cpu":
        raise ConfigError(f"device: the engine runs on cpu only for now (got {cfg.device!r}; allowed: cpu)", "device")
    refuse_mismatched_objects(cfg, data, model, "dpfl.run(config")
    data = data if data is not None else build_data(cfg)
    if model is not None:
        model = copy.deepcopy(model)
    else:
        try:
            model = build_model(cfg.model.name, tuple(data.input_shape), data.n_classes, seed=cfg.seed,
                                **cfg.model.options)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"model: {err}", "model") from None
    check_model_contract(model, data, user=model_is_users(cfg))
    refuse_unaccounted_buffers(cfg, model)
    budgets = resolve_budgets(cfg)
    noise = cfg.privacy.noise_multiplier if cfg.privacy.mechanism == "dpsgd" else None
    try:
        if cfg.algorithm.name in CLUSTERED_ALGORITHMS:
            assert budgets is not None  # dpsgd runs need budgets (the schema)
            params = ALGORITHM_PARAMS[cfg.algorithm.name].model_validate(cfg.algorithm.params)
            local = _local_program(cfg, _model_facts(cfg, model)[0], private=True)
            algorithm, noise, _ = build_clustered(cfg, params, local, data, budgets,
                                                  [int(b) for b in resolve_batch_sizes(cfg, data)])
        else:
            algorithm = build_algorithm(cfg, model)
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
        )
    except ValueError as err:
        where = "privacy.budgets" if calibrating else "config"
        what = "cannot calibrate the noise: " if calibrating else ""
        raise ConfigError(f"{where}: {what}{err}", where) from None

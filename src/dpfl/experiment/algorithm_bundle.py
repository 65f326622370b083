"""From a validated config's algorithm and privacy sections to the `Algorithm` bundle a run trains with: the local
program, selection, upload stage, aggregator and personal state, with the noise each privacy mechanism needs.

    algorithm = build_algorithm(cfg, model)   # dpfl.experiment.build re-exports it

A noise the config leaves unset stays None in its stage: `FederatedRun` calibrates it from the budgets. The clustered
algorithms (R-DPCFL, IFCA-DP, ...) need their data to plan their noise and are built in `clustered_build`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from torch import nn

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.client.additive_personal import AdditivePersonal
from dpfl.algorithms.client.param_noise import ParameterNoise
from dpfl.algorithms.client.phased import PhasedProgram
from dpfl.algorithms.client.private_head import PrivateHead
from dpfl.algorithms.client.program import LocalProgram, clipped_sgd, dpsgd, sgd
from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.registry import AGGREGATORS, LOCAL_PROGRAMS
from dpfl.algorithms.secure.aggregator import DistributedDPFedAvg, SecureAggregation, SecureFedAvg
from dpfl.algorithms.secure.protocol import default_threshold
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.fedceo import FedCEO
from dpfl.algorithms.server.oracle import OracleAverage
from dpfl.algorithms.server.pfa import PFA
from dpfl.algorithms.server.pfa_plus import PFAPlus
from dpfl.algorithms.server.robust_hdp import RobustHDP
from dpfl.algorithms.server.splitting import AndersonII
from dpfl.algorithms.server.splitting import presets as splitting_presets
from dpfl.algorithms.server.splitting.aggregator import EngineOperator, SplittingAggregator
from dpfl.experiment.config import ALGORITHM_PARAMS, PROVIDED_MODEL, ConfigError, RunConfig
from dpfl.experiment.config.vocabulary import CLUSTERED_ALGORITHMS, SPLITTING_ALGORITHMS
from dpfl.models import build_model, model_info
from dpfl.privacy.fdp_run import NoisyRunAccounting
from dpfl.privacy.fdp_sensitivity import step_sizes as fdp_step_sizes

__all__ = ["build_algorithm", "local_program", "model_facts", "noisy_accounting"]


def local_program(cfg: RunConfig, loss: str, *, private: bool, prox_mu: float = 0.0, lr_factor: float = 1.0,
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


def model_facts(cfg: RunConfig, model: nn.Module | None) -> tuple[str, list[str], str | None]:
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
    phases = (local_program(cfg, loss, private=private, trainable=head, epochs=head_epochs),
              local_program(cfg, loss, private=private, trainable=body))
    return PhasedProgram(phases), PrivateHead(head)


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
    local = local_program(cfg, loss, private=mech == "dpsgd", prox_mu=mu)
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
    loss, names, head_module = model_facts(cfg, model)
    sel = cfg.training.selection
    selection = Selection(sel.kind, sel.k, sel.rate)
    protocol = _secure_protocol(cfg) if cfg.secure_aggregation is not None else None
    if name in ("noisy_fedavg", "noisy_fedprox"):
        return _noisy(cfg, params, loss, selection)
    if name in SPLITTING_ALGORITHMS or getattr(params, "splitting", False):
        return _splitting(cfg, params, loss, selection)
    mu = getattr(params, "mu", 0.0)
    personal: Any = AdditivePersonal(params.alpha) if name == "ppsgd" else None
    local: Any = local_program(cfg, loss, private=mech == "dpsgd", prox_mu=mu,
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

"""From a validated config's algorithm and privacy sections to the `Algorithm` bundle a run trains with: the
algorithm's registered factory (`dpfl.algorithms.registry`), called with the config's params and the `RunFacts` read
off the config and the model.

    algorithm = build_algorithm(cfg, model)   # dpfl.experiment.build re-exports it

A noise the config leaves unset stays None in its stage: `FederatedRun` calibrates it from the budgets. The clustered
algorithms (R-DPCFL, IFCA-DP, ...) need their data to plan their noise: `build_run` calls their factories with it.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.context import AlgorithmError, RunFacts
from dpfl.algorithms.catalog.noisy import noisy_run_accounting
from dpfl.algorithms.client.phased import PhasedProgram
from dpfl.algorithms.client.program import LocalProgram
from dpfl.algorithms.registry import AGGREGATORS, LOCAL_PROGRAMS, algorithm_spec
from dpfl.algorithms.secure.aggregator import SecureAggregation
from dpfl.algorithms.secure.protocol import default_threshold
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.optimizers import ServerOptimizer, with_server_optimizer
from dpfl.algorithms.stages import ServerStep, as_server_step
from dpfl.experiment.config import PROVIDED_MODEL, ConfigError, RunConfig
from dpfl.models import build_model, model_info
from dpfl.privacy.adaptive_clipping import AdaptiveClipping
from dpfl.privacy.fdp_run import NoisyRunAccounting

__all__ = ["build_algorithm", "check_precision", "model_facts", "noisy_accounting", "run_facts", "server_optimized"]


def run_facts(cfg: RunConfig, model: nn.Module | None = None,
              input_shape: tuple[int, ...] | None = None) -> RunFacts:
    """What the algorithm's factory needs of the run: the config's training and privacy settings, the model's loss
    and parameter names (`model_facts`), the built model and one record's shape (MP-DP perturbs the network), the
    user's registered stages and the secure-aggregation protocol."""
    loss, names, head = model_facts(cfg, model)
    return RunFacts(**_settings(cfg), loss=loss, param_names=tuple(names), head_module=head,
                    model_name=cfg.model.name, model=model, input_shape=input_shape, run_name=cfg.name,
                    secure=_secure_protocol(cfg) if cfg.secure_aggregation is not None else None,
                    aggregator=_registered_aggregator(cfg) if cfg.algorithm.aggregator is not None else None,
                    local=_registered_local(cfg) if cfg.algorithm.local is not None else None)


def _settings(cfg: RunConfig) -> dict[str, Any]:
    """The `RunFacts` of the config's training, privacy and data sections."""
    t, p, sel = cfg.training, cfg.privacy, cfg.training.selection
    adaptive = AdaptiveClipping(**p.adaptive_clipping.model_dump()) if p.adaptive_clipping is not None else None
    return dict(
        lr=t.optimizer.lr, clients=cfg.data.clients, rounds=t.rounds, local_epochs=t.local_epochs,
        local_steps=t.local_steps, momentum=t.optimizer.momentum, micro_batch=t.micro_batch,
        precision=t.precision,
        selection=Selection(sel.kind, sel.k, sel.rate), mechanism=p.mechanism,
        clip=adaptive.initial_clip if adaptive is not None else p.clip, adaptive_clipping=adaptive,
        noise_cohort_size=p.noise_cohort_size, sampling=p.sampling,
        noise_multiplier=p.noise_multiplier, paper_eta_scaling=p.paper_eta_scaling,
        per_upload_amplification=p.per_upload_amplification, observer=p.observer, release=p.release,
        smoothness_L=p.smoothness_L, honest_clients=p.honest_clients, secure_view=p.secure_aggregation, seed=cfg.seed)


def build_algorithm(cfg: RunConfig, model: nn.Module | None = None,
                    input_shape: tuple[int, ...] | None = None) -> Algorithm:
    """The algorithm bundle named by `cfg.algorithm`, with the stages its privacy mechanism needs.

    `model`: the run's built model (its loss and parameter names); default: the registry's facts of `cfg.model`.
    `input_shape`: one record's shape (the MP-DP family reads it with the model).
    A noise the config leaves unset stays None in its stage: `FederatedRun` calibrates it from the budgets.
    """
    name = cfg.algorithm.name
    spec = algorithm_spec(name)
    if spec.with_data:
        raise ConfigError(f"algorithm: {name} is built with its data (build_run): its noise depends on the split",
                          "algorithm")
    try:
        algorithm = spec.factory(run_facts(cfg, model, input_shape), **cfg.algorithm.params)
    except AlgorithmError as err:
        raise ConfigError(str(err), err.key) from None
    check_precision(cfg, algorithm)
    return server_optimized(cfg, algorithm)


def server_optimized(cfg: RunConfig, algorithm: Algorithm) -> Algorithm:
    """`algorithm` with the config's `algorithm.server_optimizer` on its server step (itself when there is none);
    refused in one line naming the key where the optimizer would not be post-processing of the aggregate."""
    opt = cfg.algorithm.server_optimizer
    if opt is None:
        return algorithm
    where = "algorithm.server_optimizer"
    try:
        return with_server_optimizer(algorithm, ServerOptimizer(**opt.model_dump()))
    except ValueError as err:
        raise ConfigError(f"{where}: {err}", where) from None


def check_precision(cfg: RunConfig, algorithm: Algorithm) -> None:
    """Refuse `training.precision` or `privacy.adaptive_clipping` where the built algorithm does not run with it (an
    algorithm or a registered local program that builds its own LocalSpec; a server step that clips with a fixed
    norm): a setting is honoured or refused, never dropped."""
    _check_adaptive_clipping(cfg, algorithm)
    want = cfg.training.precision
    if want == "float32":
        return
    local = algorithm.local
    phases = local.phases if isinstance(local, (LocalProgram, PhasedProgram)) else ()
    if not phases or any(phase.spec.precision != want for phase in phases):
        raise ConfigError(f"training.precision: algorithm {cfg.algorithm.name!r}"
                          f"{' with local program ' + repr(cfg.algorithm.local.name) if cfg.algorithm.local else ''}"
                          f" trains its clients with its own settings and does not run in {want}; use float32",
                          "training.precision")


def noisy_accounting(cfg: RunConfig) -> NoisyRunAccounting:
    """The f-DP accounting of a noisy_fedavg / noisy_fedprox config: its realised step sizes η[T, K] and threat
    model."""
    params = algorithm_spec(cfg.algorithm.name).params.model_validate(cfg.algorithm.params)
    try:
        return noisy_run_accounting(RunFacts(**_settings(cfg)), cfg.algorithm.name, params)
    except AlgorithmError as err:
        raise ConfigError(str(err), err.key) from None


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


def _registered_local(cfg: RunConfig) -> Any:
    """The user-registered local program as a factory of the run's keywords, checked to be accounted exactly as the
    config's mechanism says."""
    stage, p = cfg.algorithm.local, cfg.privacy
    assert stage is not None
    where = "algorithm.local"

    def build(**kwargs: Any) -> LocalProgram:
        private = kwargs["private"]
        try:
            program = LOCAL_PROGRAMS[stage.name](**kwargs, **stage.params)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{where}: local program {stage.name!r} could not be built: {err}", where) from None
        if not isinstance(program, LocalProgram):
            raise ConfigError(f"{where}: local program {stage.name!r} must return a LocalProgram (dpfl's sgd or "
                              f"dpsgd), got {type(program).__name__}", where)
        if program.private != private:
            need = "DP-SGD (dpfl's dpsgd)" if private else "non-private (dpfl's sgd)"
            raise ConfigError(f"{where}: mechanism {p.mechanism!r} needs a {need} local program; {stage.name!r} is "
                              f"{'private' if program.private else 'not private'}", where)
        if private and (program.spec.clip != p.clip or program.spec.sampling != p.sampling):
            raise ConfigError(f"{where}: {stage.name!r} clips at {program.spec.clip} with {program.spec.sampling} "
                              f"sampling; the run is accounted for privacy.clip {p.clip} and {p.sampling} sampling",
                              where)
        return program

    return build


def _registered_aggregator(cfg: RunConfig) -> ServerStep:
    """A user-registered aggregator (post-processing of what the server received), as a server step."""
    stage, where = cfg.algorithm.aggregator, "algorithm.aggregator"
    assert stage is not None
    try:
        aggregator = AGGREGATORS[stage.name](**stage.params)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: aggregator {stage.name!r} could not be built: {err}", where) from None
    try:
        return as_server_step(aggregator)
    except TypeError as err:
        raise ConfigError(f"{where}: {stage.name!r} returned no server step: {err}", where) from None


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


def _check_adaptive_clipping(cfg: RunConfig, algorithm: Algorithm) -> None:
    """`privacy.adaptive_clipping` is run by the server step (client level) or by every phase of the local program
    (sample level); an oracle's weights read a fixed clip's noise, so it is refused there too."""
    if cfg.privacy.adaptive_clipping is None:
        return
    where = "privacy.adaptive_clipping"
    local = algorithm.local
    phases = local.phases if isinstance(local, (LocalProgram, PhasedProgram)) else ()
    sample_level = bool(phases) and all(phase.spec.adaptive_clipping is not None for phase in phases)
    if algorithm.aggregator.adaptive_clipping is None and not sample_level:
        raise ConfigError(f"{where}: algorithm {cfg.algorithm.name!r}"
                          f"{' with local program ' + repr(cfg.algorithm.local.name) if cfg.algorithm.local else ''}"
                          " clips with a fixed norm (it builds its own clipping stage); use privacy.clip", where)
    if algorithm.aggregator.privileged:
        raise ConfigError(f"{where}: the oracle weighs clients by their true noise variance, computed for a fixed "
                          "clip; under adaptive clipping each client's noise follows its own clip", where)

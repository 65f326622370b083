"""fedsplit / fedpi / fedrp (operator_splitting.md §3): operator-splitting schemes on a network, and the bundle of
any splitting preset (fedavg / fedprox run as one when accelerated or scheduled, `catalog.fedavg`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import Field

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.context import AlgorithmError, RunFacts, mechanism_of, validated
from dpfl.algorithms.catalog.validation import MAX_ITERATIONS, Params
from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.server.splitting import AndersonII
from dpfl.algorithms.server.splitting import presets as splitting_presets
from dpfl.algorithms.server.splitting.aggregator import EngineOperator, SplittingAggregator

__all__ = ["MECHANISMS", "AndersonParams", "Schedule", "SplittingParams", "fedpi", "fedrp", "fedsplit",
           "splitting_bundle"]

MECHANISMS = ("none", "dpsgd", "udp")
Schedule = Literal["constant", "inv_t", "inv_sqrt", "inv_log", "inv_log_e", "exp_halving"]  # splitting.schedules


class AndersonParams(Params):
    """Type-II Anderson acceleration of the round map (operator_splitting.md §7); memory 0 is the plain iteration."""

    memory: int = Field(ge=0, le=1000)
    scope: Literal["state", "global"] = "state"
    blend: float = Field(0.0, ge=0, le=1)
    safeguard: bool = False


class SplittingParams(Params):
    """fedsplit / fedpi / fedrp (operator_splitting.md §3): eta is the prox step (the local program runs the
    configured SGD on f_i + ||x - u_i||^2 / (2 eta) from the client's own u_i); mode, report, ergodic averaging and
    Anderson acceleration as in the spec; `schedule` (period: exp_halving's T) makes the prox step eta_t, i.e. the
    local program's proximal weight 1/eta_t, round by round."""

    eta: float = Field(gt=0)
    schedule: Schedule = "constant"
    period: int = Field(500, ge=1, le=MAX_ITERATIONS)
    mode: Literal["centralized", "decentralized"] = "centralized"
    report: Literal["xbar", "shadow"] = "xbar"
    ergodic: bool = False
    anderson: AndersonParams | None = None


def splitting_bundle(run: RunFacts, name: str, params: Any, mechanism: str) -> Algorithm:
    """A splitting preset on a network: the engine's (DP-)SGD from each client's u_i (on the prox objective for prox
    presets), the scheme's server step over the population's u and z; udp: one N(0, z^2 C^2) per upload (cohort 1).

    fedsplit / fedpi / fedrp: eta is the prox step (mu = 1/eta). fedavg / fedprox with `anderson`: the presets of the
    same names (fedavg's eta is the local learning rate, fedprox's is 1/mu), so Anderson can accelerate them.
    Reads run.lr, rounds, clients, selection, clip and noise_multiplier."""
    if run.aggregator is not None:
        raise AlgorithmError(f"algorithm.aggregator: {name} is its own aggregator (the splitting server step)",
                             "algorithm.aggregator")
    if name == "fedavg":
        eta, kind, mu = run.lr, "gradient", 0.0
    elif name == "fedprox":
        eta, kind, mu = 1.0 / params.mu, "prox", params.mu
    else:
        eta, kind, mu = params.eta, "prox", 1.0 / params.eta
    a = params.anderson
    options = {k: getattr(params, k) for k in ("mode", "report", "ergodic") if hasattr(params, k)}
    try:
        anderson = AndersonII(a.memory, a.scope, a.blend, a.safeguard) if a is not None else None
        scheme = splitting_presets.make(name, eta, EngineOperator(kind), anderson=anderson,
                                        participation=run.selection, schedule=params.schedule, period=params.period,
                                        **options)
    except ValueError as err:
        raise AlgorithmError(f"algorithm.params: {err}", "algorithm.params") from None
    local = run.local_program(private=mechanism == "dpsgd", prox_mu=mu)
    if scheme.schedule.name != "constant":  # eta_t is the local lr (gradient presets) or the prox step 1/mu_t
        etas = [scheme.schedule(t) for t in range(run.rounds)]
        specs = [dataclasses.replace(local.spec, **({"lr": e} if kind == "gradient" else {"prox_mu": 1.0 / e}))
                 for e in etas]
        local = dataclasses.replace(local, round_specs=tuple(specs))
    if mechanism == "udp" and run.clip is None:
        raise AlgorithmError("privacy.clip: a clipped, noised upload needs a clip norm", "privacy.clip")
    upload: Any = ClippedNoisyUpdate(run.clip, run.noise_multiplier, 1.0) if mechanism == "udp" else FullUpdate()
    aggregator = SplittingAggregator(scheme, run.clients, noisy=mechanism != "none")
    return Algorithm(name, local, run.selection, upload, aggregator)


def _scheme(name: str, run: RunFacts, arguments: dict[str, Any]) -> Algorithm:
    params = validated(SplittingParams, name, arguments)
    return splitting_bundle(run, name, params, mechanism_of(run, name, MECHANISMS))


def fedsplit(run: RunFacts, *, eta: float, schedule: Schedule = "constant", period: int = 500,
             mode: Literal["centralized", "decentralized"] = "centralized", report: Literal["xbar", "shadow"] = "xbar",
             ergodic: bool = False, anderson: dict[str, Any] | None = None) -> Algorithm:
    """The fedsplit preset (operator_splitting.md §3) with prox step `eta`; see `splitting_bundle` for the run facts."""
    return _scheme("fedsplit", run, locals())


def fedpi(run: RunFacts, *, eta: float, schedule: Schedule = "constant", period: int = 500,
          mode: Literal["centralized", "decentralized"] = "centralized", report: Literal["xbar", "shadow"] = "xbar",
          ergodic: bool = False, anderson: dict[str, Any] | None = None) -> Algorithm:
    """The fedpi preset (operator_splitting.md §3) with prox step `eta`; see `splitting_bundle` for the run facts."""
    return _scheme("fedpi", run, locals())


def fedrp(run: RunFacts, *, eta: float, schedule: Schedule = "constant", period: int = 500,
          mode: Literal["centralized", "decentralized"] = "centralized", report: Literal["xbar", "shadow"] = "xbar",
          ergodic: bool = False, anderson: dict[str, Any] | None = None) -> Algorithm:
    """The fedrp preset (operator_splitting.md §3) with prox step `eta`; see `splitting_bundle` for the run facts."""
    return _scheme("fedrp", run, locals())

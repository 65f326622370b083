"""FedAvg and its direct variants: fedavg and fedprox (no privacy, or DP-SGD for fedprox), dp_fedavg_local (local
DP-SGD), udp_fedavg (client-level noise on each upload) and dp_fedavg_central (the server's noise).

fedavg / fedprox with `anderson` or a non-constant `schedule` run as the splitting preset of the same name
(`catalog.splitting`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from pydantic import Field, model_validator

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.bundle import fedavg_bundle
from dpfl.algorithms.catalog.context import AlgorithmError, RunFacts, mechanism_of, validated
from dpfl.algorithms.catalog.splitting import AndersonParams, Schedule, splitting_bundle
from dpfl.algorithms.catalog.validation import MAX_ITERATIONS, Params
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.secure.aggregator import DistributedDPFedAvg
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.privacy.adaptive_clipping import COUNT_NOISE_KEY, AdaptiveClipping

__all__ = ["AcceleratedParams", "CentralParams", "FedAvgParams", "ProxParams", "dp_fedavg_central",
           "dp_fedavg_local", "fedavg", "fedprox", "udp_fedavg"]

Weighting = Literal["uniform", "samples", "epsilon"]


class FedAvgParams(Params):
    weighting: Weighting = "uniform"
    server_lr: float = Field(1.0, gt=0)


class CentralParams(Params):
    server_lr: float = Field(1.0, gt=0)


class AcceleratedParams(FedAvgParams):
    """fedavg / fedprox; `anderson` or a non-constant `schedule` runs them as the splitting scheme's fedavg / fedprox
    preset (operator_splitting.md §3, §6, §7): the server keeps the round map's iterates and may extrapolate them
    (uniform weights, server_lr 1); eta_t scales fedavg's learning rate and fedprox's 1/mu round by round."""

    anderson: AndersonParams | None = None
    schedule: Schedule = "constant"
    period: int = Field(500, ge=1, le=MAX_ITERATIONS)

    @property
    def splitting(self) -> bool:
        """Whether the run is the splitting preset (something only the preset offers is asked for)."""
        return self.anderson is not None or self.schedule != "constant"

    @model_validator(mode="after")
    def _plain_average(self) -> AcceleratedParams:
        if self.splitting and (self.weighting != "uniform" or self.server_lr != 1.0):
            raise ValueError("anderson and schedules run the splitting preset, which averages uniformly with "
                             f"server_lr 1 (got weighting {self.weighting!r}, server_lr {self.server_lr:g})")
        return self


class ProxParams(AcceleratedParams):
    mu: float = Field(gt=0)


def _plain(run: RunFacts, name: str, mechanisms: tuple[str, ...], params: Any) -> Algorithm:
    """FedAvg's aggregation of the run's local program (FedProx's proximal term `mu`), or the splitting preset."""
    mechanism = mechanism_of(run, name, mechanisms)
    if getattr(params, "splitting", False):
        return splitting_bundle(run, name, params, mechanism)
    local = run.local_program(private=mechanism == "dpsgd", prox_mu=getattr(params, "mu", 0.0))
    return fedavg_bundle(run, name, mechanism, local, FedAvg(params.weighting, params.server_lr))


def fedavg(run: RunFacts, *, weighting: Weighting = "uniform", server_lr: float = 1.0,
           anderson: dict[str, Any] | None = None, schedule: Schedule = "constant", period: int = 500) -> Algorithm:
    """FedAvg without privacy (McMahan et al. 2017). Reads run.lr and the local program's settings, selection,
    clients; with anderson / schedule also rounds (the splitting preset)."""
    return _plain(run, "fedavg", ("none",), validated(AcceleratedParams, "fedavg", locals()))


def fedprox(run: RunFacts, *, mu: float, weighting: Weighting = "uniform", server_lr: float = 1.0,
            anderson: dict[str, Any] | None = None, schedule: Schedule = "constant", period: int = 500) -> Algorithm:
    """FedProx: local training on f_i + mu/2 ||w - w_t||^2, without privacy or with DP-SGD (run.mechanism dpsgd,
    run.clip, run.sampling). Reads what fedavg reads."""
    return _plain(run, "fedprox", ("none", "dpsgd"), validated(ProxParams, "fedprox", locals()))


def dp_fedavg_local(run: RunFacts, *, weighting: Weighting = "uniform", server_lr: float = 1.0) -> Algorithm:
    """DP-FedAvg with sample-level DP-SGD on each client (run.clip, run.sampling; each client's noise calibrated
    from its budget unless given). Reads the local program's settings, selection, clients."""
    return _plain(run, "dp_fedavg_local", ("dpsgd",), validated(FedAvgParams, "dp_fedavg_local", locals()))


def udp_fedavg(run: RunFacts, *, weighting: Weighting = "uniform", server_lr: float = 1.0) -> Algorithm:
    """Client-level DP: each upload clipped to run.clip and noised, the noise split over the expected cohort
    (run.selection, run.clients); run.paper_eta_scaling, per_upload_amplification and secure as in the config."""
    return _plain(run, "udp_fedavg", ("udp",), validated(FedAvgParams, "udp_fedavg", locals()))


def dp_fedavg_central(run: RunFacts, *, server_lr: float = 1.0) -> Algorithm:
    """Central DP-FedAvg (McMahan et al. 2018): the server clips each update to run.clip and adds the Gaussian
    noise (run.noise_multiplier, or calibrated from the budgets); with run.secure, each client adds its share.
    With run.adaptive_clipping the clip starts at run.clip and follows the target quantile of the update norms
    (Andrew et al. 2021; the count is summed securely too under run.secure). With run.noise_cohort_size M the
    noise is scaled and accounted as for a cohort of M (a simulation; `CentralDPFedAvg`).
    Also `dpfl.algorithms.central_dp_fedavg`."""
    params = validated(CentralParams, "dp_fedavg_central", locals())
    mechanism_of(run, "dp_fedavg_central", ("central",))
    local = run.local_program(private=False)
    adaptive = _adaptive_clipping(run)
    cohort = run.noise_cohort_size
    if cohort is not None and run.secure is not None:
        raise AlgorithmError("privacy.noise_cohort_size: a simulated cohort runs with central DP-FedAvg without "
                             "secure aggregation (each client's noise share would need rescaling)",
                             "privacy.noise_cohort_size")
    try:
        if run.secure is None:
            central: Any = CentralDPFedAvg(run.clip, run.noise_multiplier, params.server_lr, adaptive,
                                           noise_cohort=cohort, simulated_selection=_simulated(run))
        else:
            central = DistributedDPFedAvg(run.clip, run.noise_multiplier, params.server_lr, adaptive,
                                          protocol=run.secure)
    except ValueError as err:
        if adaptive is None or not str(err).startswith(COUNT_NOISE_KEY):
            raise
        raise AlgorithmError(str(err).removeprefix(f"{COUNT_NOISE_KEY}: "), COUNT_NOISE_KEY) from None
    return Algorithm("dp_fedavg_central", local, run.selection, FullUpdate(), central)


def _adaptive_clipping(run: RunFacts) -> AdaptiveClipping | None:
    """run.adaptive_clipping with its count noise resolved: sigma_b = expected clients per round / 20 unless given
    (Andrew et al.'s default; the expected cohort of the whole population, fixed for the run so that z_Delta is)."""
    adaptive = run.adaptive_clipping
    if adaptive is None or adaptive.count_noise is not None:
        return adaptive
    return replace(adaptive, count_noise=adaptive.sigma_b(run.selection.expected_count(run.clients)))


def _simulated(run: RunFacts) -> Selection | None:
    """The selection of the cohort run.noise_cohort_size simulates: M of the run.clients without replacement under
    fixed-size selection, each client with probability M / run.clients under Poisson selection (None: none)."""
    cohort = run.noise_cohort_size
    if cohort is None:
        return None
    if run.selection.kind == "all" or not run.selection.expected_count(run.clients) < cohort <= run.clients:
        raise AlgorithmError(f"privacy.noise_cohort_size: must lie above the expected cohort "
                             f"({run.selection.expected_count(run.clients):g}) and at most data.clients "
                             f"({run.clients}), with selection fixed or poisson (got {cohort}, selection "
                             f"{run.selection.kind!r})", "privacy.noise_cohort_size")
    if run.selection.kind == "fixed":
        return Selection("fixed", k=cohort)
    return Selection("poisson", rate=cohort / run.clients)

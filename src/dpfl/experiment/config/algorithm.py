"""The `algorithm` section: an algorithm by name, with its hyperparameters checked per algorithm."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dpfl.experiment.config.base import _is_number, _Section, _too_big
from dpfl.experiment.config.errors import _fail, _sub_validate
from dpfl.experiment.config.limits import MAX_ITERATIONS, MAX_LOCAL_EPOCHS, _at_most
from dpfl.experiment.config.vocabulary import AlgorithmName


class _FedAvgParams(_Section):
    weighting: Literal["uniform", "samples", "epsilon"] = "uniform"
    server_lr: float = Field(1.0, gt=0)


class _CentralParams(_Section):
    server_lr: float = Field(1.0, gt=0)


class _EpsTargetParams(_FedAvgParams):
    """min_eps / max_eps: everyone's noise calibrated to one epsilon: `observed` (the smallest / largest
    reported epsilon) or a number (PFA: 0.1 or 1.0 for Minimum, 10.0 for Maximum)."""

    epsilon: Literal["observed"] | float = "observed"

    @field_validator("epsilon", mode="plain")  # plain: an error names algorithm.params.epsilon, not a union member
    @classmethod
    def _positive(cls, v: Any) -> Any:
        allowed = "'observed' or a number > 0"
        if isinstance(v, str) and v == "observed":
            return v
        if not _is_number(v):
            _fail("", "not an allowed value" if isinstance(v, str) else "wrong type", v, allowed)
        if _too_big(v) or not math.isfinite(v):
            _fail("", "not a finite number", v, allowed)
        if not v > 0:
            _fail("", "must be > 0", float(v), allowed)
        return float(v)


class _NoisyParams(_Section):
    """Noisy-FedAvg (spec fdp_accounting.md §1.1): K clipped local steps (clip norm privacy.clip, per example or
    on the batch mean), N(0, std²) on every uploaded parameter, a plain mean. Step sizes η_{k,t} from the base
    rate training.optimizer.lr: constant η, cyclic η/(k+1), stagewise η/(t+1), continuous η/(tK+k+1), or
    custom `step_sizes` ([rounds][local_steps]). batch_sampling: shuffled epochs or a fresh uniform subset per
    step (both independent of the data; no sampling amplification is claimed). std: null calibrates it from
    privacy.budgets (dpfl.privacy.run_calibration)."""

    std: float | None = Field(None, gt=0)
    schedule: Literal["constant", "cyclic", "stagewise", "continuous", "custom"] = "constant"
    step_sizes: list[list[Annotated[float, Field(gt=0)]]] | None = None
    clip_mode: Literal["per_example", "batch"] = "per_example"
    batch_sampling: Literal["shuffle", "fixed"] = "shuffle"

    @model_validator(mode="after")
    def _custom_steps(self) -> _NoisyParams:
        if (self.schedule == "custom") != (self.step_sizes is not None):
            _fail("step_sizes", "give step_sizes exactly when schedule is 'custom'", self.step_sizes,
                  "a [rounds][local_steps] list of numbers > 0 with schedule: custom, else null")
        return self


class _NoisyProxParams(_NoisyParams):
    """Noisy-FedProx: Noisy-FedAvg's steps plus α(w − w_t), added after clipping (α = 0 is Noisy-FedAvg)."""

    alpha: float = Field(ge=0)




class _PFAParams(_Section):
    """PFA (spec heterogeneous_dp §4.2): public/private split by reported epsilon, projection of the
    private clients' updates onto the public clients' top-k subspace, per tensor."""

    split: Literal["top_fraction", "gmm", "kmeans", "explicit"] = "top_fraction"
    public_fraction: float = Field(0.1, gt=0, le=1)
    public_clients: list[Annotated[int, Field(ge=0)]] | None = None
    subspace: Literal["centered", "second-moment", "mean-outer", "random"] = "centered"
    k: int = Field(1, ge=1)
    scope: Literal["tensor", "model"] = "tensor"
    svd_solver: Literal["exact", "lanczos"] = "exact"
    lanczos_iters: int = Field(256, ge=1)
    weighting: Literal["epsilon", "count"] = "epsilon"
    server_lr: float = Field(1.0, gt=0)

    @field_validator("public_clients")
    @classmethod
    def _distinct(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and len(set(v)) != len(v):
            _fail("", "a client is listed twice", v, "distinct client ids")
        return v


class _PFAPlusParams(_PFAParams):
    """PFA+ (spec heterogeneous_dp §4.3): private clients upload k coordinates per tensor in the previous
    round's public subspace; `warmup_rounds` rounds with private clients are aggregated in full first."""

    warmup_rounds: int = Field(1, ge=1)
    subspace_broadcast: Literal["private", "all"] = "private"


class _RobustHDPParams(_Section):
    """Robust-HDP (spec heterogeneous_dp §4.4): robust PCA of the stacked updates estimates each update's
    noise from the updates themselves; weights ∝ 1/estimated variance. Never reads reported epsilons."""

    p_prime: int = Field(200_000, ge=1)
    blocks: Literal["all", "first"] = "all"
    schedule: Literal["every_round", "once"] = "every_round"
    # the PCP's mu grows by mu_growth per iteration up to mu_max (None: 1e7 x the block's initial mu), from LCM's
    # 1.25 / ||M||_2; mu_growth 1.0 keeps it constant from m n / (4 ||M||_1), as the authors' code did (the thesis
    # comparisons of `dpfl reproduce robust-hdp` pin it). mu_norm None: spectral when mu grows, else entrywise
    mu_norm: Literal["entrywise", "max_col_sum", "spectral"] | None = None
    mu_growth: float = Field(1.5, ge=1)
    mu_max: float | None = Field(None, gt=0)
    lam: float | None = Field(None, gt=0)
    tol: float = Field(1e-7, gt=0)
    max_iter: int = Field(10_000, ge=1)
    server_lr: float = Field(1.0, gt=0)

    @field_validator("max_iter")
    @classmethod
    def _iterations_limit(cls, v: int) -> int:
        return _at_most(v, MAX_ITERATIONS, "iterations")


class _FedCEOParams(_Section):
    """FedCEO (spec fedceo.md §2-3): T-tSVD smoothing of the uploaded models every `interval` rounds at
    threshold theta^j / (2 lam); clients start from their own smoothed model in the round after."""

    lam: float = Field(gt=0)
    theta: float = Field(1.0, ge=1)
    interval: int = Field(1, ge=1)
    layers: Literal["all"] | int = "all"
    personalize: bool = True
    personal_staleness: Literal["any", "last"] = "any"
    prox_dtype: Literal["float64", "float32"] = "float64"
    rfft: bool = True

    @field_validator("layers", mode="plain")  # plain: an error names algorithm.params.layers, not a union member
    @classmethod
    def _layers(cls, v: Any) -> Any:
        if not (isinstance(v, str) and v == "all") and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            _fail("", "must be 'all' or a number of last layers >= 1", v, "all | 1, 2, ...")
        return v


class _PPSGDParams(_Section):
    """PPSGD (spec fedceo.md §6.2): θ_k = w + u_k; u_k stays on the client and moves alpha times as fast."""

    alpha: float = Field(1.0, gt=0)


class _CentaurParams(_Section):
    """CENTAUR (spec fedceo.md §6.3): private heads; each round fits the head for head_epochs with the
    representation frozen, then trains the representation (the only shared part) with the head frozen."""

    head_epochs: float = Field(1.0, gt=0)

    @field_validator("head_epochs")
    @classmethod
    def _epochs_limit(cls, v: float) -> float:
        return _at_most(v, MAX_LOCAL_EPOCHS, "local epochs")


class _AndersonParams(_Section):
    """Type-II Anderson acceleration of the round map (operator_splitting.md §7); memory 0 is the plain iteration."""

    memory: int = Field(ge=0, le=1000)
    scope: Literal["state", "global"] = "state"
    blend: float = Field(0.0, ge=0, le=1)
    safeguard: bool = False


Schedule = Literal["constant", "inv_t", "inv_sqrt", "inv_log", "inv_log_e", "exp_halving"]  # splitting.schedules


class _AcceleratedParams(_FedAvgParams):
    """fedavg / fedprox; `anderson` or a non-constant `schedule` runs them as the splitting scheme's fedavg / fedprox
    preset (operator_splitting.md §3, §6, §7): the server keeps the round map's iterates and may extrapolate them
    (uniform weights, server_lr 1); eta_t scales fedavg's learning rate and fedprox's 1/mu round by round."""

    anderson: _AndersonParams | None = None
    schedule: Schedule = "constant"
    period: int = Field(500, ge=1, le=MAX_ITERATIONS)

    @property
    def splitting(self) -> bool:
        """Whether the run is the splitting preset (something only the preset offers is asked for)."""
        return self.anderson is not None or self.schedule != "constant"

    @model_validator(mode="after")
    def _plain_average(self) -> _AcceleratedParams:
        if self.splitting and (self.weighting != "uniform" or self.server_lr != 1.0):
            raise ValueError("anderson and schedules run the splitting preset, which averages uniformly with "
                             f"server_lr 1 (got weighting {self.weighting!r}, server_lr {self.server_lr:g})")
        return self


class _ProxParams(_AcceleratedParams):
    mu: float = Field(gt=0)


class _SplittingParams(_Section):
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
    anderson: _AndersonParams | None = None


class _ClusteredParams(_Section):
    """clustered_oracle / clustered_local (clustered_dpfl.md §6): fixed clusters (the true ones / one per client);
    the noise is calibrated per client on the 0.01 grid with this RDP-to-DP conversion."""

    conversion: Literal["dp_accounting", "classic"] = "dp_accounting"


class _MRMTLParams(_ClusteredParams):
    """MR-MTL (§6): personal models with the pull (lam / 2) ||theta_i - thetabar||^2 (lam 0: Local)."""

    lam: float = Field(1.0, ge=0)


class _SelectingParams(_ClusteredParams):
    """Private cluster selection (§4): each selection is an exponential mechanism with eps_sel = ratio x epsilon;
    floor(clustering_rounds_ratio E) + 1 are planned; `split` subtract or joint."""

    selection_budget_ratio: float = Field(0.03, gt=0, lt=1)
    clustering_rounds_ratio: float = Field(0.1, ge=0, le=1)
    split: Literal["subtract", "joint"] = "subtract"
    selection_score: Literal["accuracy", "neg_clipped_loss"] = "accuracy"
    loss_cap: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _cap(self) -> _SelectingParams:
        if (self.selection_score == "neg_clipped_loss") != (self.loss_cap is not None):
            raise ValueError("selection_score neg_clipped_loss needs loss_cap (L_max), and loss_cap only applies to it")
        return self


class _IFCAParams(_SelectingParams):
    """IFCA with private selection (§6): `clusters` models, uniform random round-1 assignment; `ifca_round1:
    reference` follows the reference code (round 1 local DP training whose updates are discarded, round 2 uniform,
    floor(0.1 E) selections after rounds 2..floor(0.1 E) + 1)."""

    clusters: int = Field(ge=1, le=1000)
    ifca_round1: Literal["uniform", "reference"] = "uniform"


class _RDPCFLParams(_SelectingParams):
    """R-DPCFL (§5): clusters M (null: chosen by MSS among m_candidates), the full-batch round 1 (round1_batch),
    the selection window or every round, and the reference code's options."""

    clusters: int | None = Field(None, ge=1, le=1000)
    m_candidates: list[Annotated[int, Field(ge=2, le=1000)]] = Field(default_factory=lambda: list(range(2, 9)),
                                                                      min_length=1)
    selection_rounds: Literal["window", "every_round"] = "window"
    round1_batch: int | Literal["full"] = "full"
    cluster_init: Literal["initial", "trained_client0"] = "initial"
    pca_project: Literal["raw", "standardized"] = "raw"
    scaler: Literal["minmax", "standard"] = "minmax"

    @field_validator("round1_batch")
    @classmethod
    def _batch(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"round1_batch must be 'full' or an integer >= 1, got {v}")
        return v


ALGORITHM_PARAMS: dict[str, type[_Section]] = {
    "fedavg": _AcceleratedParams,
    "dp_fedavg_local": _FedAvgParams,
    "dp_fedavg_central": _CentralParams,
    "udp_fedavg": _FedAvgParams,
    "noisy_fedavg": _NoisyParams,
    "noisy_fedprox": _NoisyProxParams,
    "fedprox": _ProxParams,
    "weiavg": _CentralParams,
    "min_eps": _EpsTargetParams,
    "max_eps": _EpsTargetParams,
    "oracle": _CentralParams,
    "pfa": _PFAParams,
    "pfa_plus": _PFAPlusParams,
    "robust_hdp": _RobustHDPParams,
    "fedceo": _FedCEOParams,
    "ppsgd": _PPSGDParams,
    "centaur": _CentaurParams,
    "fedsplit": _SplittingParams,
    "fedpi": _SplittingParams,
    "fedrp": _SplittingParams,
    "rdpcfl": _RDPCFLParams,
    "ifca_dp": _IFCAParams,
    "clustered_oracle": _ClusteredParams,
    "clustered_local": _ClusteredParams,
    "mr_mtl": _MRMTLParams,
}


class StageConfig(_Section):
    """A user-registered stage (`dpfl.register_aggregator` / `dpfl.register_local_program`) and its params."""

    name: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


def _registered(kind: str, v: StageConfig | None) -> StageConfig | None:
    from dpfl.algorithms.registry import AGGREGATORS, LOCAL_PROGRAMS

    table = AGGREGATORS if kind == "aggregator" else LOCAL_PROGRAMS
    if v is not None and v.name not in table:
        how = "dpfl.register_aggregator" if kind == "aggregator" else "dpfl.register_local_program"
        _fail("name", f"no {kind.replace('_', ' ')} of this name is registered (register one with {how} before "
              "the config is validated)", v.name, ", ".join(sorted(table)) or "none registered")
    return v


class AlgorithmConfig(_Section):
    """An algorithm bundle by name, with its hyperparameters in `params` (checked per algorithm).

    params: fedavg / dp_fedavg_local / udp_fedavg: weighting (uniform|samples), server_lr;
    dp_fedavg_central: server_lr; fedprox: mu (required) + fedavg's; fedavg and fedprox also take anderson
    {memory, scope, blend, safeguard} and schedule / period (then they run as the splitting preset: uniform
    weights, server_lr 1);
    noisy_fedavg: std (required), schedule, step_sizes (schedule custom), clip_mode, batch_sampling;
    noisy_fedprox: noisy_fedavg's + alpha (required, >= 0);
    weiavg (weights ∝ reported epsilon) and oracle (weights ∝ 1/true noise variance; privileged): server_lr;
    min_eps / max_eps: epsilon ('observed' or a number) + fedavg's. max_eps needs privacy.allow_budget_violation.
    pfa: split, public_fraction, public_clients, subspace, k, scope, svd_solver, lanczos_iters, weighting, server_lr.
    pfa_plus: pfa's, plus warmup_rounds (>= 1) and subspace_broadcast (private | all).
    robust_hdp: p_prime, blocks, schedule, mu_norm, mu_growth, mu_max, lam, tol, max_iter, server_lr.
    fedceo: lam (required), theta (>= 1), interval, layers (all | last n), personalize, personal_staleness
    (any | last), prox_dtype, rfft. ppsgd: alpha (> 0, local / global step size).
    centaur: head_epochs (> 0; needs a model with a head: mlp2, lenet5).
    fedsplit / fedpi / fedrp: eta (required, the prox step), schedule, period, mode, report, ergodic, anderson
    {memory, scope, blend, safeguard}; mechanism udp uploads one Gaussian per client (the noise is not split over
    the cohort).
    rdpcfl: clusters, m_candidates, selection_budget_ratio, clustering_rounds_ratio, selection_rounds, split,
    conversion, selection_score (accuracy | neg_clipped_loss with loss_cap), round1_batch, cluster_init, pca_project,
    scaler; ifca_dp: clusters (required), ifca_round1 (uniform | reference) + the selection fields;
    clustered_oracle / clustered_local: conversion; mr_mtl: lam (>= 0, default 1) + conversion. All five:
    data.partition clustered (oracle), dpsgd, every client in every round.

    aggregator / local: optional user-registered stages replacing the bundle's aggregator (any bundle whose
    guarantee holds against a server that sees each upload) or its local program (not for noisy_fedavg,
    noisy_fedprox, ppsgd, centaur); see `dpfl.algorithms.registry`.
    """

    name: AlgorithmName
    params: dict[str, Any] = Field(default_factory=dict, validate_default=True)
    aggregator: StageConfig | None = None
    local: StageConfig | None = None

    @field_validator("aggregator")
    @classmethod
    def _aggregator_registered(cls, v: StageConfig | None) -> StageConfig | None:
        return _registered("aggregator", v)

    @field_validator("local")
    @classmethod
    def _local_registered(cls, v: StageConfig | None) -> StageConfig | None:
        return _registered("local_program", v)

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("name")
        if name not in ALGORITHM_PARAMS:
            return v  # the name's own error is reported
        return _sub_validate(ALGORITHM_PARAMS[name], v).model_dump()

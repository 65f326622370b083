"""The `algorithm` section: an algorithm by name, with its hyperparameters checked per algorithm by the params model
it is registered with (`dpfl.algorithms.registry`; dpfl's own in `dpfl.algorithms.catalog`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from dpfl.algorithms.registry import algorithm_names, algorithm_spec
from dpfl.algorithms.server.optimizers import DEFAULTS as _OPTIMIZER_DEFAULTS
from dpfl.experiment.config.base import _Section
from dpfl.experiment.config.errors import _allowed, _fail, _sub_validate


class _Registered(Mapping[str, Any]):
    """A read-only view of the algorithm registry (`dpfl.algorithms.registry`): each name's params model or
    mechanisms. The registry holds them with their factories (`dpfl.algorithms.catalog`), below this layer."""

    def __init__(self, field: str) -> None:
        self._field = field

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(algorithm_spec(name), self._field)
        except KeyError:
            raise KeyError(name) from None

    def __iter__(self) -> Iterator[str]:
        return iter(algorithm_names())

    def __len__(self) -> int:
        return len(algorithm_names())


ALGORITHM_PARAMS: Mapping[str, type[BaseModel]] = _Registered("params")  # name -> its params model
ALGORITHM_MECHANISMS: Mapping[str, tuple[str, ...]] = _Registered("mechanisms")  # the first is the default


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


class ServerOptimizerConfig(_Section):
    """A server optimizer on the aggregate (Reddi et al. 2021; `dpfl.algorithms.server.optimizers`): fedavgm (lr 1,
    momentum 0.9), fedadam (lr 0.1, beta1 0.9, beta2 0.99, tau 1e-3), fedyogi (lr 0.01, beta1 0.9, beta2 0.99,
    tau 1e-3) or fedadagrad (lr 0.1, beta1 0, tau 1e-3). A setting left out takes that default; one the optimizer
    does not use is refused."""

    name: Literal["fedavgm", "fedadam", "fedyogi", "fedadagrad"]
    lr: float | None = Field(None, gt=0)
    momentum: float | None = Field(None, ge=0, lt=1)
    beta1: float | None = Field(None, ge=0, lt=1)
    beta2: float | None = Field(None, ge=0, lt=1)
    tau: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _settings_of_the_optimizer(self) -> ServerOptimizerConfig:
        used = _OPTIMIZER_DEFAULTS[self.name]
        for key in ("momentum", "beta1", "beta2", "tau"):
            if key not in used and getattr(self, key) is not None:
                _fail(key, f"{self.name} does not use it ({', '.join(sorted(used))} only)", getattr(self, key),
                      "null")
        for key, default in used.items():
            if getattr(self, key) is None:
                setattr(self, key, default)
        return self


class AlgorithmConfig(_Section):
    """An algorithm bundle by name, with its hyperparameters in `params` (checked per algorithm).

    params: fedavg / dp_fedavg_local / udp_fedavg: weighting (uniform|samples), server_lr;
    dp_fedavg_central: server_lr; fedprox: mu (required) + fedavg's; fedavg and fedprox also take anderson
    {memory, scope, blend, safeguard} and schedule / period (then they run as the splitting preset: uniform
    weights, server_lr 1);
    noisy_fedavg: std (null: calibrated from the budgets), schedule, step_sizes (schedule custom), clip_mode,
    batch_sampling; noisy_fedprox: noisy_fedavg's + alpha (required, >= 0);
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

    server_optimizer: null (the default), or {name: fedavgm|fedadam|fedyogi|fedadagrad, lr, momentum (fedavgm),
    beta1, beta2, tau}: the server moves by that optimizer on the pseudo-gradient x' - x of the algorithm's own
    step (post-processing of the aggregate); refused at build time where it would not be (personal or cluster
    models, the splitting preset, MP-DP's perturbed broadcast, server_lr != 1; `optimizers.refusal`).
    """

    name: str
    params: dict[str, Any] = Field(default_factory=dict, validate_default=True)
    aggregator: StageConfig | None = None
    local: StageConfig | None = None
    server_optimizer: ServerOptimizerConfig | None = None

    @field_validator("name", mode="plain")  # plain: the registry's names, worded as a Literal's
    @classmethod
    def _name_registered(cls, v: Any) -> str:
        names = algorithm_names()
        if not isinstance(v, str) or v not in names:
            _fail("", "not an allowed value", v, _allowed(names))
        return v

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

"""Robust-HDP (spec heterogeneous_dp §4.4): robust PCA of the stacked updates of DP-SGD clients estimates each
update's noise from the updates themselves; weights ∝ 1/estimated variance. Never reads reported epsilons."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.bundle import fedavg_bundle
from dpfl.algorithms.catalog.context import RunFacts, mechanism_of, validated
from dpfl.algorithms.catalog.validation import MAX_ITERATIONS, Params, at_most
from dpfl.algorithms.server.robust_hdp import RobustHDP

__all__ = ["RobustHDPParams", "robust_hdp"]

MECHANISMS = ("dpsgd",)
MuNorm = Literal["entrywise", "max_col_sum", "spectral"]


class RobustHDPParams(Params):
    """Robust-HDP's solver settings (`dpfl.algorithms.server.robust_hdp.RobustHDP`)."""

    p_prime: int = Field(200_000, ge=1)
    blocks: Literal["all", "first"] = "all"
    schedule: Literal["every_round", "once"] = "every_round"
    # the PCP's mu grows by mu_growth per iteration up to mu_max (None: 1e7 x the block's initial mu), from LCM's
    # 1.25 / ||M||_2; mu_growth 1.0 keeps it constant from m n / (4 ||M||_1), as the authors' code did (the thesis
    # comparisons of `dpfl reproduce robust-hdp` pin it). mu_norm None: spectral when mu grows, else entrywise
    mu_norm: MuNorm | None = None
    mu_growth: float = Field(1.5, ge=1)
    mu_max: float | None = Field(None, gt=0)
    lam: float | None = Field(None, gt=0)
    tol: float = Field(1e-7, gt=0)
    max_iter: int = Field(10_000, ge=1)
    server_lr: float = Field(1.0, gt=0)

    @field_validator("max_iter")
    @classmethod
    def _iterations_limit(cls, v: int) -> int:
        return at_most(v, MAX_ITERATIONS, "iterations")


def robust_hdp(run: RunFacts, *, p_prime: int = 200_000, blocks: Literal["all", "first"] = "all",
               schedule: Literal["every_round", "once"] = "every_round", mu_norm: MuNorm | None = None,
               mu_growth: float = 1.5, mu_max: float | None = None, lam: float | None = None, tol: float = 1e-7,
               max_iter: int = 10_000, server_lr: float = 1.0) -> Algorithm:
    """Robust-HDP's aggregation of DP-SGD clients. Reads the local program's settings (run.lr, clip, ...)."""
    params = validated(RobustHDPParams, "robust_hdp", locals())
    mechanism = mechanism_of(run, "robust_hdp", MECHANISMS)
    return fedavg_bundle(run, "robust_hdp", mechanism, run.local_program(private=True),
                         RobustHDP(**params.model_dump()))

"""The heterogeneous-DP baselines of DP-SGD clients (spec heterogeneous_dp): weiavg (weights ∝ reported epsilon),
min_eps / max_eps (everyone's noise calibrated to one epsilon) and oracle (weights ∝ 1/true noise variance)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import field_validator

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.bundle import fedavg_bundle
from dpfl.algorithms.catalog.context import RunFacts, mechanism_of, validated
from dpfl.algorithms.catalog.fedavg import CentralParams, FedAvgParams, Weighting
from dpfl.algorithms.catalog.validation import fail, is_number, too_big
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.oracle import OracleAverage

__all__ = ["EpsTargetParams", "max_eps", "min_eps", "oracle", "weiavg"]

MECHANISMS = ("dpsgd",)


class EpsTargetParams(FedAvgParams):
    """min_eps / max_eps: everyone's noise calibrated to one epsilon: `observed` (the smallest / largest
    reported epsilon) or a number (PFA: 0.1 or 1.0 for Minimum, 10.0 for Maximum)."""

    epsilon: Literal["observed"] | float = "observed"

    @field_validator("epsilon", mode="plain")  # plain: an error names algorithm.params.epsilon, not a union member
    @classmethod
    def _positive(cls, v: Any) -> Any:
        allowed = "'observed' or a number > 0"
        if isinstance(v, str) and v == "observed":
            return v
        if not is_number(v):
            fail("", "not an allowed value" if isinstance(v, str) else "wrong type", v, allowed)
        if too_big(v) or not math.isfinite(v):
            fail("", "not a finite number", v, allowed)
        if not v > 0:
            fail("", "must be > 0", float(v), allowed)
        return float(v)


def _dpsgd(run: RunFacts, name: str, aggregator: Any) -> Algorithm:
    mechanism = mechanism_of(run, name, MECHANISMS)
    return fedavg_bundle(run, name, mechanism, run.local_program(private=True), aggregator)


def weiavg(run: RunFacts, *, server_lr: float = 1.0) -> Algorithm:
    """DP-SGD clients averaged with weights ∝ their reported epsilon. Reads the local program's settings."""
    params = validated(CentralParams, "weiavg", locals())
    return _dpsgd(run, "weiavg", FedAvg("epsilon", params.server_lr))


def oracle(run: RunFacts, *, server_lr: float = 1.0) -> Algorithm:
    """DP-SGD clients averaged with weights ∝ 1/true noise variance (privileged: the server knows the noise)."""
    params = validated(CentralParams, "oracle", locals())
    return _dpsgd(run, "oracle", OracleAverage(params.server_lr))


def min_eps(run: RunFacts, *, epsilon: Literal["observed"] | float = "observed", weighting: Weighting = "uniform",
            server_lr: float = 1.0) -> Algorithm:
    """Every client's noise calibrated to one epsilon: the smallest reported (`observed`) or `epsilon`.
    `FederatedRun(calibrate_to=...)` does the calibration: "min" for observed, else the number."""
    params = validated(EpsTargetParams, "min_eps", locals())
    return _dpsgd(run, "min_eps", FedAvg(params.weighting, params.server_lr))


def max_eps(run: RunFacts, *, epsilon: Literal["observed"] | float = "observed", weighting: Weighting = "uniform",
            server_lr: float = 1.0) -> Algorithm:
    """Every client's noise calibrated to the largest reported epsilon (`observed`) or `epsilon`, beyond the
    smaller budgets (`FederatedRun(calibrate_to="max", allow_budget_violation=True)`)."""
    params = validated(EpsTargetParams, "max_eps", locals())
    return _dpsgd(run, "max_eps", FedAvg(params.weighting, params.server_lr))

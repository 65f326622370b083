"""FedCEO (spec fedceo.md §2-3): T-tSVD smoothing of the uploaded models every `interval` rounds at threshold
theta^j / (2 lam); clients start from their own smoothed model in the round after."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.bundle import fedavg_bundle
from dpfl.algorithms.catalog.context import RunFacts, mechanism_of, validated
from dpfl.algorithms.catalog.validation import Params, fail
from dpfl.algorithms.server.fedceo import FedCEO

__all__ = ["FedCEOParams", "fedceo"]

MECHANISMS = ("dpsgd", "udp")


class FedCEOParams(Params):
    """FedCEO's smoothing settings (`dpfl.algorithms.server.fedceo.FedCEO`)."""

    lam: float = Field(gt=0)
    theta: float = Field(1.0, ge=1)
    interval: int = Field(1, ge=1)
    layers: Literal["all"] | int = "all"
    personalize: bool = True
    personal_staleness: Literal["any", "last"] = "any"
    # float32 since issue 67: the smoothed models agree with float64's to ~3e-6 relative at the benchmark sizes
    # (tests/algorithms/test_t_tsvd.py), in about half the time; the reproduction configs pin float64
    prox_dtype: Literal["float64", "float32"] = "float32"
    rfft: bool = True

    @field_validator("layers", mode="plain")  # plain: an error names algorithm.params.layers, not a union member
    @classmethod
    def _layers(cls, v: Any) -> Any:
        if not (isinstance(v, str) and v == "all") and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            fail("", "must be 'all' or a number of last layers >= 1", v, "all | 1, 2, ...")
        return v


def fedceo(run: RunFacts, *, lam: float, theta: float = 1.0, interval: int = 1, layers: Literal["all"] | int = "all",
           personalize: bool = True, personal_staleness: Literal["any", "last"] = "any",
           prox_dtype: Literal["float64", "float32"] = "float32", rfft: bool = True) -> Algorithm:
    """FedCEO's smoothing of DP-SGD clients (run.mechanism dpsgd) or of clipped, noised uploads (udp, FedCEO's
    Algorithm 1: reads run.selection, clients, clip, noise_multiplier, paper_eta_scaling, ...)."""
    params = validated(FedCEOParams, "fedceo", locals())
    mechanism = mechanism_of(run, "fedceo", MECHANISMS)
    return fedavg_bundle(run, "fedceo", mechanism, run.local_program(private=mechanism == "dpsgd"),
                         FedCEO(**params.model_dump()))

"""PFA and PFA+ (spec heterogeneous_dp §4.2-4.3): DP-SGD clients split into public and private by reported epsilon;
the private clients' updates are projected onto the public clients' top-k subspace."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.bundle import fedavg_bundle
from dpfl.algorithms.catalog.context import RunFacts, mechanism_of, validated
from dpfl.algorithms.catalog.validation import Params, fail
from dpfl.algorithms.server.pfa import PFA
from dpfl.algorithms.server.pfa_plus import PFAPlus

__all__ = ["PFAParams", "PFAPlusParams", "pfa", "pfa_plus"]

MECHANISMS = ("dpsgd",)
Split = Literal["top_fraction", "gmm", "kmeans", "explicit"]
Subspace = Literal["centered", "second-moment", "mean-outer", "random"]


class PFAParams(Params):
    """PFA (spec heterogeneous_dp §4.2): public/private split by reported epsilon, projection of the
    private clients' updates onto the public clients' top-k subspace, per tensor."""

    split: Split = "top_fraction"
    public_fraction: float = Field(0.1, gt=0, le=1)
    public_clients: list[Annotated[int, Field(ge=0)]] | None = None
    subspace: Subspace = "centered"
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
            fail("", "a client is listed twice", v, "distinct client ids")
        return v


class PFAPlusParams(PFAParams):
    """PFA+ (spec heterogeneous_dp §4.3): private clients upload k coordinates per tensor in the previous
    round's public subspace; `warmup_rounds` rounds with private clients are aggregated in full first."""

    warmup_rounds: int = Field(1, ge=1)
    subspace_broadcast: Literal["private", "all"] = "private"


def _pfa(params: PFAParams) -> PFA:
    fields = params.model_dump(exclude={"warmup_rounds", "subspace_broadcast"})
    if fields["public_clients"] is not None:
        fields["public_clients"] = tuple(fields["public_clients"])
    return PFA(**fields)


def pfa(run: RunFacts, *, split: Split = "top_fraction", public_fraction: float = 0.1,
        public_clients: list[int] | None = None, subspace: Subspace = "centered", k: int = 1,
        scope: Literal["tensor", "model"] = "tensor", svd_solver: Literal["exact", "lanczos"] = "exact",
        lanczos_iters: int = 256, weighting: Literal["epsilon", "count"] = "epsilon",
        server_lr: float = 1.0) -> Algorithm:
    """PFA's aggregation of DP-SGD clients. Reads the local program's settings (run.lr, clip, sampling, ...)."""
    params = validated(PFAParams, "pfa", locals())
    mechanism = mechanism_of(run, "pfa", MECHANISMS)
    return fedavg_bundle(run, "pfa", mechanism, run.local_program(private=True), _pfa(params))


def pfa_plus(run: RunFacts, *, split: Split = "top_fraction", public_fraction: float = 0.1,
             public_clients: list[int] | None = None, subspace: Subspace = "centered", k: int = 1,
             scope: Literal["tensor", "model"] = "tensor", svd_solver: Literal["exact", "lanczos"] = "exact",
             lanczos_iters: int = 256, weighting: Literal["epsilon", "count"] = "epsilon", server_lr: float = 1.0,
             warmup_rounds: int = 1, subspace_broadcast: Literal["private", "all"] = "private") -> Algorithm:
    """PFA+: PFA with projected uploads after `warmup_rounds`. Reads what pfa reads."""
    params = validated(PFAPlusParams, "pfa_plus", locals())
    mechanism = mechanism_of(run, "pfa_plus", MECHANISMS)
    aggregator = PFAPlus(_pfa(params), warmup_rounds=params.warmup_rounds,
                         subspace_broadcast=params.subspace_broadcast)
    return fedavg_bundle(run, "pfa_plus", mechanism, run.local_program(private=True), aggregator)

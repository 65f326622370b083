"""The clustered DP-FL algorithms (clustered_dpfl.md §5-§6): rdpcfl, ifca_dp, clustered_oracle, clustered_local
and mr_mtl. Their params live here; their bundles depend on the data split (each client's record count fixes its
noise, the Oracle needs the true clusters), so a run builds them with its data (`dpfl.experiment.clustered_build`)
and their factories refuse to build them from `RunFacts` alone."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.context import AlgorithmError, RunFacts
from dpfl.algorithms.catalog.validation import Params

__all__ = ["ClusteredParams", "IFCAParams", "MRMTLParams", "RDPCFLParams", "SelectingParams", "built_with_data"]

MECHANISMS = ("dpsgd",)


class ClusteredParams(Params):
    """clustered_oracle / clustered_local (clustered_dpfl.md §6): fixed clusters (the true ones / one per client);
    the noise is calibrated per client on the 0.01 grid with this RDP-to-DP conversion."""

    conversion: Literal["dp_accounting", "classic"] = "dp_accounting"


class MRMTLParams(ClusteredParams):
    """MR-MTL (§6): personal models with the pull (lam / 2) ||theta_i - thetabar||^2 (lam 0: Local)."""

    lam: float = Field(1.0, ge=0)


class SelectingParams(ClusteredParams):
    """Private cluster selection (§4): each selection is an exponential mechanism with eps_sel = ratio x epsilon;
    floor(clustering_rounds_ratio E) + 1 are planned; `split` subtract or joint."""

    selection_budget_ratio: float = Field(0.03, gt=0, lt=1)
    clustering_rounds_ratio: float = Field(0.1, ge=0, le=1)
    split: Literal["subtract", "joint"] = "subtract"
    selection_score: Literal["accuracy", "neg_clipped_loss"] = "accuracy"
    loss_cap: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _cap(self) -> SelectingParams:
        if (self.selection_score == "neg_clipped_loss") != (self.loss_cap is not None):
            raise ValueError("selection_score neg_clipped_loss needs loss_cap (L_max), and loss_cap only applies to it")
        return self


class IFCAParams(SelectingParams):
    """IFCA with private selection (§6): `clusters` models, uniform random round-1 assignment; `ifca_round1:
    reference` follows the reference code (round 1 local DP training whose updates are discarded, round 2 uniform,
    floor(0.1 E) selections after rounds 2..floor(0.1 E) + 1)."""

    clusters: int = Field(ge=1, le=1000)
    ifca_round1: Literal["uniform", "reference"] = "uniform"


class RDPCFLParams(SelectingParams):
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


def built_with_data(run: RunFacts, **params: Any) -> Algorithm:
    """The clustered algorithms are built with their data (`dpfl.build_run`): their noise depends on the split."""
    raise AlgorithmError("algorithm: the clustered algorithms are built with their data (build_run): their noise "
                         "depends on the split", "algorithm")

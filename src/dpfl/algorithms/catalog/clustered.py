"""The clustered DP-FL algorithms (clustered_dpfl.md §5-§6): rdpcfl, ifca_dp, clustered_oracle, clustered_local and
mr_mtl. They are built with their data: each client's record count fixes its noise through the two-stage plan, the
Oracle needs the true clusters. So their factories read run.data, run.budgets, run.batch_sizes and run.seed besides
the local program's settings, and they return the per-client noise with the bundle (`ClusteredBuild`): they
calibrate their own noise, z_i being the smallest multiple of 0.01 whose plan (training events, plus the planned
private selections for rdpcfl and ifca_dp) meets client i's budget (`dpfl.privacy.two_stage.plan`).

| algorithm | clusters | training accountant | selections |
|---|---|---|---|
| rdpcfl | GMM on round-1 updates (M given or chosen) | full-batch round 1, then b | window from E_c |
| ifca_dp | M, random round-1 assignment | b in every round | rounds 1..floor(0.1 E) + 1 (reference: 2..) |
| clustered_oracle | the true clusters | b in every round | none |
| clustered_local | one per client (no communication) | b in every round | none |
| mr_mtl | none: personal models pulled to their mean (lam) | b in every round | none |
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.context import AlgorithmError, RunFacts, mechanism_of, validated
from dpfl.algorithms.catalog.validation import Params
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.clustered.aggregator import ClusteredAggregator
from dpfl.algorithms.server.mean_regularized import MeanRegularized
from dpfl.privacy import two_stage

__all__ = ["ClusteredBuild", "ClusteredParams", "IFCAParams", "MRMTLParams", "RDPCFLParams", "SelectingParams",
           "clustered_bundle", "clustered_local", "clustered_oracle", "ifca_dp", "mr_mtl", "rdpcfl"]

MECHANISMS = ("dpsgd",)
Conversion = Literal["dp_accounting", "classic"]
Score = Literal["accuracy", "neg_clipped_loss"]


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


@dataclass(frozen=True)
class ClusteredBuild:
    """A clustered algorithm's bundle with the noise it was calibrated with: pass `noise_multipliers` to
    `FederatedRun(noise_multipliers=...)`; `plans`: each client's two-stage plan."""

    algorithm: Algorithm
    noise_multipliers: list[float]
    plans: list[two_stage.TwoStagePlan]


def clustered_bundle(run: RunFacts, name: str, params: Any) -> ClusteredBuild:
    """The bundle and each client's noise for a clustered algorithm (every client in every round, K whole local
    epochs of plain DP-SGD with Poisson batches, the noise calibrated here)."""
    mechanism_of(run, name, MECHANISMS)
    data, budgets, batch_sizes = run.data, run.budgets, run.batch_sizes
    if data is None or budgets is None or batch_sizes is None:
        raise AlgorithmError(f"algorithm: {name} is built with its data (build_run): its noise depends on the split",
                             "algorithm")
    local = run.local_program(private=True)
    if run.selection.kind != "all":
        raise AlgorithmError(f"training.selection: {name} trains every client in every round (kind: all), got "
                             f"{run.selection.kind!r}", "training.selection")
    if run.local_epochs is None or run.local_epochs != int(run.local_epochs) or run.momentum:
        raise AlgorithmError(f"training: {name} runs K whole local epochs of plain DP-SGD (training.local_epochs an "
                             "integer, no momentum), as its accountant assumes", "training")
    if run.sampling != "poisson":
        raise AlgorithmError(f"privacy.sampling: {name} is accounted for Poisson batches", "privacy.sampling")
    if run.noise_multiplier is not None:
        raise AlgorithmError(f"privacy.noise_multiplier: {name} calibrates each client's noise from its budget (with "
                             "the selections it plans); leave it unset", "privacy.noise_multiplier")
    truth = data.info.get("true_cluster")
    if name == "clustered_oracle" and truth is None:
        raise AlgorithmError("data.partition: clustered_oracle needs the true clusters of data.partition 'clustered'",
                             "data.partition")
    rounds = run.rounds
    selecting = name in ("rdpcfl", "ifca_dp")
    round1 = params.round1_batch if name == "rdpcfl" else None
    reference_ifca = name == "ifca_dp" and params.ifca_round1 == "reference"
    if reference_ifca and math.floor(params.clustering_rounds_ratio * rounds) < 1:
        raise AlgorithmError(f"algorithm.params.ifca_round1: reference selects after rounds 2..floor(ratio E) + 1, "
                             f"none with E = {rounds} and clustering_rounds_ratio = {params.clustering_rounds_ratio}",
                             "algorithm.params.ifca_round1")
    plans = []
    for i, (budget, batch) in enumerate(zip(budgets, batch_sizes, strict=True)):
        n_i = data.clients[i].n_train
        try:
            options: dict[str, Any] = {"conversion": params.conversion, "selections": selecting,
                                       "round1_batch": round1}
            if selecting:
                options.update(selection_ratio=params.selection_budget_ratio, split=params.split,
                               clustering_rounds_ratio=params.clustering_rounds_ratio,
                               selection_rounds=getattr(params, "selection_rounds", "window"))
            if reference_ifca:  # no selection after the discarded round 1: floor(ratio E) of them
                options["n_sel"] = math.floor(params.clustering_rounds_ratio * rounds)
            plans.append(two_stage.plan(budget.epsilon, budget.delta, n_i, min(batch, n_i), int(run.local_epochs),
                                        rounds, **options))
        except ValueError as err:
            raise AlgorithmError(f"privacy.budgets: client {i}: {err}", "privacy.budgets") from None
    eps_sel = {p.eps_sel for p in plans}
    if selecting and len(eps_sel) > 1:
        raise AlgorithmError(f"privacy.budgets: {name}'s selections share one eps_sel = ratio x epsilon, so every "
                             "client needs the same budget", "privacy.budgets")
    common = dict(n_clients=data.n_clients, rounds=rounds, seed=run.seed)
    try:
        if name == "rdpcfl":
            aggregator: Any = ClusteredAggregator(
                "rdpcfl", eps_sel=plans[0].eps_sel, n_clusters=params.clusters,
                clustering_rounds_ratio=params.clustering_rounds_ratio, selection_rounds=params.selection_rounds,
                m_candidates=tuple(params.m_candidates), cluster_init=params.cluster_init,
                project=params.pca_project, scaler=params.scaler, score=params.selection_score,
                loss_cap=params.loss_cap, **common)
            local = replace(local, round1_batch=params.round1_batch)
        elif name == "ifca_dp":
            aggregator = ClusteredAggregator("ifca", eps_sel=plans[0].eps_sel, n_clusters=params.clusters,
                                             clustering_rounds_ratio=params.clustering_rounds_ratio,
                                             score=params.selection_score, loss_cap=params.loss_cap,
                                             ifca_round1=params.ifca_round1, **common)
        elif name == "mr_mtl":
            aggregator = MeanRegularized(data.n_clients)
            local = replace(local, spec=replace(local.spec, prox_mu=params.lam, prox_to="anchor"))
        else:
            assignment = tuple(truth) if name == "clustered_oracle" else tuple(range(data.n_clients))
            aggregator = ClusteredAggregator("fixed", assignment=assignment, **common)
    except ValueError as err:
        raise AlgorithmError(f"algorithm.params: {err}", "algorithm.params") from None
    if isinstance(aggregator, ClusteredAggregator):  # its privacy notes state what the noise was calibrated for
        worst = max(plans, key=lambda q: q.planned_epsilon)
        aggregator = replace(aggregator, privacy_plan={
            "eps_sel": worst.eps_sel, "n_sel_planned": worst.n_sel, "split": worst.split,
            "conversion": worst.conversion, "eps_clust": worst.eps_clust, "eps_train": worst.eps_train,
            "planned_epsilon_max": worst.planned_epsilon,
            "noise_grid": "z_i = the smallest multiple of 0.01 whose planned epsilon meets client i's budget"})
    algorithm = Algorithm(name, local, Selection("all"), aggregator=aggregator)
    return ClusteredBuild(algorithm, [p.noise_multiplier for p in plans], plans)


def rdpcfl(run: RunFacts, *, clusters: int | None = None,
           m_candidates: tuple[int, ...] | list[int] = tuple(range(2, 9)),
           selection_rounds: Literal["window", "every_round"] = "window", round1_batch: int | Literal["full"] = "full",
           cluster_init: Literal["initial", "trained_client0"] = "initial",
           pca_project: Literal["raw", "standardized"] = "raw", scaler: Literal["minmax", "standard"] = "minmax",
           selection_budget_ratio: float = 0.03, clustering_rounds_ratio: float = 0.1,
           split: Literal["subtract", "joint"] = "subtract", selection_score: Score = "accuracy",
           loss_cap: float | None = None, conversion: Conversion = "dp_accounting") -> ClusteredBuild:
    """R-DPCFL. Reads run.data, budgets, batch_sizes, seed, rounds and the local program's settings."""
    arguments = {**locals(), "m_candidates": list(m_candidates)}
    return clustered_bundle(run, "rdpcfl", validated(RDPCFLParams, "rdpcfl", arguments))


def ifca_dp(run: RunFacts, *, clusters: int, ifca_round1: Literal["uniform", "reference"] = "uniform",
            selection_budget_ratio: float = 0.03, clustering_rounds_ratio: float = 0.1,
            split: Literal["subtract", "joint"] = "subtract", selection_score: Score = "accuracy",
            loss_cap: float | None = None, conversion: Conversion = "dp_accounting") -> ClusteredBuild:
    """IFCA with private selection. Reads what rdpcfl reads."""
    return clustered_bundle(run, "ifca_dp", validated(IFCAParams, "ifca_dp", locals()))


def clustered_oracle(run: RunFacts, *, conversion: Conversion = "dp_accounting") -> ClusteredBuild:
    """One model per true cluster (run.data's `true_cluster`). Reads what rdpcfl reads."""
    return clustered_bundle(run, "clustered_oracle", validated(ClusteredParams, "clustered_oracle", locals()))


def clustered_local(run: RunFacts, *, conversion: Conversion = "dp_accounting") -> ClusteredBuild:
    """One model per client (no communication). Reads what rdpcfl reads."""
    return clustered_bundle(run, "clustered_local", validated(ClusteredParams, "clustered_local", locals()))


def mr_mtl(run: RunFacts, *, lam: float = 1.0, conversion: Conversion = "dp_accounting") -> ClusteredBuild:
    """MR-MTL: personal models pulled to their mean with weight lam. Reads what rdpcfl reads."""
    return clustered_bundle(run, "mr_mtl", validated(MRMTLParams, "mr_mtl", locals()))

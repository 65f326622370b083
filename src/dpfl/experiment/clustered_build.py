"""Build the clustered DP-FL algorithms of a config (clustered_dpfl.md §5-§6): they need the data to be built.

Why apart from `build.py`: these bundles depend on the split (each client's record count fixes its noise through the
two-stage plan, the Oracle needs the true clusters), so they are built after the data, and they calibrate their own
noise: z_i is the smallest multiple of 0.01 whose plan (training events, plus the planned private selections for
rdpcfl and ifca_dp) meets client i's budget (`dpfl.privacy.two_stage.plan`).

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
from dataclasses import replace
from typing import Any

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.clustered.aggregator import ClusteredAggregator
from dpfl.algorithms.server.mean_regularized import MeanRegularized
from dpfl.data.federated import FederatedDataset
from dpfl.experiment.config import ConfigError, RunConfig
from dpfl.privacy import two_stage
from dpfl.privacy.budgets import ClientBudget


def build_clustered(cfg: RunConfig, params: Any, local: Any, data: FederatedDataset, budgets: list[ClientBudget],
                    batch_sizes: list[int]) -> tuple[Algorithm, list[float], list[two_stage.TwoStagePlan]]:
    """(the algorithm, each client's noise multiplier, each client's plan) for a clustered config."""
    name, t = cfg.algorithm.name, cfg.training
    if t.selection.kind != "all":
        raise ConfigError(f"training.selection: {name} trains every client in every round (kind: all), got "
                          f"{t.selection.kind!r}", "training.selection")
    if t.local_epochs is None or t.local_epochs != int(t.local_epochs) or t.optimizer.momentum:
        raise ConfigError(f"training: {name} runs K whole local epochs of plain DP-SGD (training.local_epochs an "
                          "integer, no momentum), as its accountant assumes", "training")
    if cfg.privacy.sampling != "poisson":
        raise ConfigError(f"privacy.sampling: {name} is accounted for Poisson batches", "privacy.sampling")
    if cfg.privacy.noise_multiplier is not None:
        raise ConfigError(f"privacy.noise_multiplier: {name} calibrates each client's noise from its budget (with the "
                          "selections it plans); leave it unset", "privacy.noise_multiplier")
    truth = data.info.get("true_cluster")
    if name == "clustered_oracle" and truth is None:
        raise ConfigError("data.partition: clustered_oracle needs the true clusters of data.partition 'clustered'",
                          "data.partition")
    selecting = name in ("rdpcfl", "ifca_dp")
    round1 = params.round1_batch if name == "rdpcfl" else None
    reference_ifca = name == "ifca_dp" and params.ifca_round1 == "reference"
    if reference_ifca and math.floor(params.clustering_rounds_ratio * t.rounds) < 1:
        raise ConfigError(f"algorithm.params.ifca_round1: reference selects after rounds 2..floor(ratio E) + 1, none "
                          f"with E = {t.rounds} and clustering_rounds_ratio = {params.clustering_rounds_ratio}",
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
                options["n_sel"] = math.floor(params.clustering_rounds_ratio * t.rounds)
            plans.append(two_stage.plan(budget.epsilon, budget.delta, n_i, min(batch, n_i), int(t.local_epochs),
                                        t.rounds, **options))
        except ValueError as err:
            raise ConfigError(f"privacy.budgets: client {i}: {err}", "privacy.budgets") from None
    eps_sel = {p.eps_sel for p in plans}
    if selecting and len(eps_sel) > 1:
        raise ConfigError(f"privacy.budgets: {name}'s selections share one eps_sel = ratio x epsilon, so every client "
                          "needs the same budget", "privacy.budgets")
    common = dict(n_clients=data.n_clients, rounds=t.rounds, seed=cfg.seed)
    try:
        if name == "rdpcfl":
            aggregator = ClusteredAggregator(
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
        raise ConfigError(f"algorithm.params: {err}", "algorithm.params") from None
    if isinstance(aggregator, ClusteredAggregator):  # its privacy notes state what the noise was calibrated for
        worst = max(plans, key=lambda q: q.planned_epsilon)
        aggregator.privacy_plan = {
            "eps_sel": worst.eps_sel, "n_sel_planned": worst.n_sel, "split": worst.split,
            "conversion": worst.conversion, "eps_clust": worst.eps_clust, "eps_train": worst.eps_train,
            "planned_epsilon_max": worst.planned_epsilon,
            "noise_grid": "z_i = the smallest multiple of 0.01 whose planned epsilon meets client i's budget"}
    algorithm = Algorithm(name, local, Selection("all"), aggregator=aggregator)
    return algorithm, [p.noise_multiplier for p in plans], plans

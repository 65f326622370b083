"""Cluster models as server state (clustered_dpfl.md §5-§6): R-DPCFL, IFCA with private selection, fixed clusters.

The round loop stays generic; this stage uses the contract's hooks, each a function of the step's configuration
and the state passed in:
- `start_points`: each client trains from its cluster's model this round (per-cluster broadcast);
- `update`: theta_m <- theta_m + mean of the updates of the clients that trained cluster m (empty: unchanged);
- `model_choice` / `chosen`: after a selection round the server broadcasts all M models and each client reports,
  through the exponential mechanism, which one fits its data best (the loop runs the client side and records the
  cost on the ledger);
- `personal_models`: the model each client uses (its current cluster's), for the clients' accuracies.

The state is a dict: "models" (the cluster models, stacked `[M, ...]`; None until the first round), "posteriors"
(R-DPCFL's GMM posteriors pi `[n, M]`, a float64 tensor; None before the clustering and for IFCA / fixed clusters),
"assigned" (client -> the cluster a private selection chose), "facts" (the clustering's scores, E_c, the selections
made), "n_clusters" (M now: as configured, or as the clustering found it) and "trained" (client -> the cluster it
trained in the last round, set by `start_points`; a checkpoint written before it was kept resumes with {}).

Strategies:
- `rdpcfl`: round 1's updates (full-batch DP-SGD, the local program's `round1_batch`) are clustered by the PCA + GMM
  of `gmm.py` (M given or chosen by MSS; a fit whose posterior argmax puts every client in one cluster degrades the
  run to Global: one model, no selections, `degraded_to_global` in the metrics and the report); the cluster models
  start at the initial model (or client 0's round-1 model, `cluster_init="trained_client0"`, the reference code);
  rounds 2..E_c draw each client's cluster from its posterior pi_i afresh; private selections end the rounds of the
  window {E_c, ..., E_c + floor(0.1 E)} (or every round from E_c, `selection_rounds="every_round"`); assignments
  are frozen after the last one.
- `ifca`: round 1 assigns clients uniformly at random; private selections end rounds 1..floor(0.1 E) + 1.
  `ifca_round1="reference"` (the reference code): round 1 is plain local DP training whose updates the server
  discards (the cluster models stay at the initial model), round 2 assigns uniformly at random, and the selections
  end rounds 2..floor(0.1 E) + 1 (floor(0.1 E) of them: a selection after round 1 would compare M identical models).
- `fixed`: a given assignment (Oracle: the true clusters; Local: one cluster per client; Global: one cluster).
The global model the loop reports is the mean of the cluster models (not a method metric: read `acc_personal`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.client.private_selection import ModelChoice
from dpfl.algorithms.server.clustered.gmm import (
    M_CANDIDATES,
    ClusterFit,
    choose_clusters,
    fit_clusters,
    pca_features,
    second_stage_rounds,
)
from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
from dpfl.engine import params as P
from dpfl.seeding import Purpose, derive_seed, numpy_generator

STRATEGIES: tuple[str, ...] = ("rdpcfl", "ifca", "fixed")
IFCA_ROUND1: tuple[str, ...] = ("uniform", "reference")  # IFCA's round 1: the spec's (§6), or the reference code's
CLUSTER_DRAW_ROUND_KEY = 1  # numpy_generator(seed, CLUSTER, ...) rounds are offset by this: round 0 is IFCA's init


def _posteriors(state: dict[str, Any]) -> np.ndarray | None:
    """The state's posteriors as an array (a tensor in the state; an ndarray someone put there reads the same)."""
    posteriors = state["posteriors"]
    return None if posteriors is None else torch.as_tensor(posteriors).numpy()


def _global_model(models: P.Params) -> P.Params:
    return {n: t.mean(dim=0) for n, t in models.items()}


def _stacked(params: P.Params, m: int) -> P.Params:
    """`m` copies of `params`, stacked `[m, ...]`: the cluster models before any of them trained."""
    return {n: t.detach().unsqueeze(0).repeat(m, *([1] * t.ndim)).clone() for n, t in params.items()}


@dataclass(frozen=True)
class ClusteredAggregator(ServerStep):
    """See the module docstring. `rounds` is E; `seed` keys the cluster draws (seed, CLUSTER, round, client);
    `n_clusters` is M as configured (None: chosen by R-DPCFL's clustering, whose M is the state's)."""

    strategy: str
    n_clients: int
    rounds: int
    seed: int = 0
    n_clusters: int | None = None
    assignment: tuple[int, ...] | None = None
    eps_sel: float = 0.0
    clustering_rounds_ratio: float = 0.1
    selection_rounds: str = "window"
    m_candidates: tuple[int, ...] = M_CANDIDATES
    cluster_init: str = "initial"
    project: str = "raw"
    scaler: str = "minmax"
    privacy_plan: dict[str, Any] | None = field(default=None, repr=False)  # what the noise was calibrated for
    score: str = "accuracy"  # the selection score (private_selection.SCORES)
    loss_cap: float | None = None
    ifca_round1: str = "uniform"

    asks_clients = True  # R-DPCFL's private model selection (`model_choice`)
    personalises_starts = True
    linear_in_updates = False  # per-cluster means: no single weighted-sum noise statistic

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.strategy == "fixed":
            if self.assignment is None or len(self.assignment) != self.n_clients:
                raise ValueError(f"fixed clusters need an assignment of all {self.n_clients} clients")
            object.__setattr__(self, "assignment", tuple(int(a) for a in self.assignment))
            if min(self.assignment) < 0:
                raise ValueError("cluster ids must be >= 0")
            object.__setattr__(self, "n_clusters", max(self.assignment) + 1)
        elif self.eps_sel <= 0:
            raise ValueError(f"{self.strategy} selects clusters privately: eps_sel must be > 0, got {self.eps_sel}")
        if self.strategy == "ifca" and (self.n_clusters is None or self.n_clusters < 1):
            raise ValueError("IFCA needs the number of clusters M >= 1")
        if self.ifca_round1 not in IFCA_ROUND1:
            raise ValueError(f"ifca_round1 must be one of {', '.join(IFCA_ROUND1)}, got {self.ifca_round1!r}")
        if self.ifca_round1 == "reference" and self.strategy != "ifca":
            raise ValueError("ifca_round1='reference' applies to the ifca strategy only")
        if self.ifca_round1 == "reference" and not self.selection_rounds_planned():
            raise ValueError(f"ifca_round1='reference' selects at the end of rounds 2..floor(ratio E) + 1: with "
                             f"E = {self.rounds} and clustering_rounds_ratio = {self.clustering_rounds_ratio} that is "
                             "no selection at all")
        if self.strategy == "rdpcfl":
            second_stage_rounds(0.0, self.rounds)  # E >= 3
        if self.cluster_init not in ("initial", "trained_client0"):
            raise ValueError(f"cluster_init must be 'initial' or 'trained_client0', got {self.cluster_init!r}")
        if self.selection_rounds not in ("window", "every_round"):
            raise ValueError(f"selection_rounds must be 'window' or 'every_round', got {self.selection_rounds!r}")

    # ---- schedule (0-based rounds r; the spec's e = r + 1) -------------------------------------------
    def selection_rounds_planned(self, state: dict[str, Any] | None = None) -> list[int]:
        """The 0-based rounds that end with a private selection (known for rdpcfl once round 0 is clustered, i.e.
        from `state`'s facts; None: the state before round 1, which is all IFCA and fixed clusters need)."""
        if self.strategy == "fixed":
            return []
        n_sel = math.floor(self.clustering_rounds_ratio * self.rounds) + 1
        if self.strategy == "ifca":  # 0-based: rounds 0..n_sel-1, or 1..n_sel-1 after the reference's round 1
            return [r for r in range(self._discards_round1(), n_sel) if r < self.rounds - 1]
        facts = {} if state is None else state["facts"]
        if "e_c_effective" not in facts or facts.get("degraded_to_global"):
            return []  # not clustered yet, or one cluster: nothing to choose (and nothing spent on it)
        first = facts["e_c_effective"]  # e = E_c, i.e. r = E_c - 1
        last = self.rounds - 1 if self.selection_rounds == "every_round" else first + n_sel - 1
        return [e - 1 for e in range(first, last + 1) if e - 1 < self.rounds - 1]  # a selection needs a next round

    def cluster_of(self, state: dict[str, Any], client: int, round_: int) -> int:
        """The cluster client `client` trains in 0-based round `round_` at `state` (after round 0 for rdpcfl)."""
        if self.strategy == "fixed":
            return self.assignment[client]  # type: ignore[index]
        if client in state["assigned"]:
            return state["assigned"][client]
        if self.strategy == "ifca":  # round 1's uniform assignment (kept until a selection replaces it)
            return int(numpy_generator(self.seed, Purpose.CLUSTER, 0, client).integers(self.n_clusters))
        posteriors = _posteriors(state)
        assert posteriors is not None
        rng = numpy_generator(self.seed, Purpose.CLUSTER, round_ + CLUSTER_DRAW_ROUND_KEY, client)
        return int(rng.choice(len(posteriors[client]), p=posteriors[client]))  # stage 2: afresh

    def current(self, state: dict[str, Any]) -> dict[int, int]:
        """Each client's cluster at `state`: chosen, fixed, its last trained one, or its posterior argmax."""
        out, posteriors = {}, _posteriors(state)
        trained = state.get("trained", {})  # a checkpoint read directly (not resumed) may predate the key
        for c in range(self.n_clients):
            if c in state["assigned"] or self.strategy != "rdpcfl":
                out[c] = self.cluster_of(state, c, 0)
            elif c in trained:
                out[c] = trained[c]
            else:
                out[c] = int(np.argmax(posteriors[c]))  # type: ignore[index]
        return out

    # ---- the contract ------------------------------------------------------------------------------
    def init(self, params: P.Params) -> dict[str, Any]:  # noqa: ARG002
        """Before round 1: no cluster model yet (the first `start_points` makes them from the global model)."""
        return {"models": None, "posteriors": None, "assigned": {}, "facts": {}, "n_clusters": self.n_clusters,
                "trained": {}}

    def start_points(self, state: Any, global_params: P.Params, clients: Sequence[int],
                     round_: int) -> tuple[P.Params | None, dict[str, Any]]:
        """Each client's cluster model (None in round 1 of R-DPCFL and of the reference IFCA: everyone starts from
        the initial model), and the state recording which cluster each client trains."""
        models = state["models"]
        if models is None:
            models = _stacked(global_params, 1 if state["n_clusters"] is None else state["n_clusters"])
        if round_ == 0 and (self.strategy == "rdpcfl" or self._discards_round1()):
            return None, {**state, "models": models, "trained": {}}
        trained = {int(c): self.cluster_of(state, int(c), round_) for c in clients}
        idx = torch.as_tensor([trained[int(c)] for c in clients], dtype=torch.int64)
        starts = {n: t.index_select(0, idx.to(t.device)) for n, t in models.items()}
        return starts, {**state, "models": models, "trained": trained}

    def update(self, state: Any, params: P.Params, uploads: Any, inputs: RoundInputs) -> ServerUpdate:
        """R-DPCFL's round 1 clusters the uploads; the reference IFCA's round 1 moves nothing; otherwise each
        cluster model moves by the mean update of the clients that trained it (`start_points`' "trained")."""
        clients = [int(c) for c in inputs.view.clients]
        if self.strategy == "rdpcfl" and inputs.round_ == 0:
            state = self._cluster(state, params, uploads, clients)
        elif inputs.round_ == 0 and self._discards_round1():
            pass  # the reference IFCA's round 1: local training only, no cluster model moves
        else:
            assert state["models"] is not None
            trained = state["trained"]
            models = {n: t.clone() for n, t in state["models"].items()}  # the state passed in stays as it was
            for m in sorted(set(trained.values())):
                rows = torch.as_tensor([k for k, c in enumerate(clients) if trained[c] == m], dtype=torch.int64)
                for n, t in models.items():
                    t[m] += uploads[n].index_select(0, rows.to(uploads[n].device)).mean(dim=0).to(t.dtype)
            state = {**state, "models": models}
        return ServerUpdate(_global_model(state["models"]), state, self._diagnostics(state))

    def model_choice(self, state: Any, round_: int, global_params: P.Params) -> ModelChoice | None:  # noqa: ARG002
        """The selection question at the end of `round_`, if this round ends with one."""
        if round_ not in self.selection_rounds_planned(state):
            return None
        assert state["models"] is not None
        return ModelChoice(tuple(range(self.n_clients)), {n: t.clone() for n, t in state["models"].items()},
                           self.eps_sel, self.score, self.loss_cap)

    def chosen(self, state: Any, round_: int, picks: dict[int, int]) -> tuple[dict[str, Any], dict[str, Any]]:  # noqa: ARG002
        """The clients' private answers: their clusters from the next round on."""
        facts = state["facts"]
        new = {**state, "assigned": {**state["assigned"], **{int(c): int(m) for c, m in picks.items()}},
               "facts": {**facts, "selections_made": facts.get("selections_made", 0) + 1}}
        return new, self._diagnostics(new)

    def personal_models(self, state: Any, global_params: P.Params) -> dict[int, P.Params]:  # noqa: ARG002
        """The model each client uses: its current cluster's (before any clustering: none)."""
        if state is None or state["models"] is None or (self.strategy == "rdpcfl" and state["posteriors"] is None):
            return {}
        models = state["models"]
        return {c: {n: t[m] for n, t in models.items()} for c, m in self.current(state).items()}

    def privacy_notes(self, state: Any, history: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:  # noqa: ARG002
        """What the privacy report adds for this stage: the selections are releases too (clustered_dpfl.md §1)."""
        facts = {} if state is None else state["facts"]
        notes: dict[str, Any] = {
            "releases": "every upload (DP-SGD, sample level)"
                        + ("; round 1 at full batch (q = 1)" if self.strategy == "rdpcfl" else "")
                        + ("; round 1's uploads are charged but discarded (ifca_round1 = reference)"
                           if self._discards_round1() else "")
                        + ("; every private cluster selection (exponential mechanism by Gumbel-max, eps_sel-DP, "
                           "(eps_sel^2 / 8)-zCDP each, score " + ("= training accuracy in percent, sensitivity "
                           "100 / (N_i - 1))" if self.score == "accuracy" else f"= minus the mean loss clipped to "
                           f"{self.loss_cap:g}, sensitivity {self.loss_cap:g} / (N_i - 1))")
                           if self.strategy != "fixed" else ""),
            "adjacency": "add/remove one record (Poisson-sampled and full-batch Gaussian steps; the selection "
                         "score's sensitivity bounds removing one record)",
            "post_processing": "the GMM clustering, stage-2 cluster draws and per-cluster aggregation",
            "selections_made": facts.get("selections_made", 0),
        }
        if facts.get("degraded_to_global"):
            notes["degraded_to_global"] = ("the round-1 GMM put every client in one cluster: the run continued as "
                                           "Global (DP-FedAvg), with no private selection")
        if self.privacy_plan is not None:
            notes["plan"] = self.privacy_plan
        return notes

    # ---- internals ---------------------------------------------------------------------------------
    def _discards_round1(self) -> int:
        """1 if round 1 is the reference IFCA's local training (uploads discarded, no selection after it), else 0."""
        return int(self.strategy == "ifca" and self.ifca_round1 == "reference")

    def _diagnostics(self, state: dict[str, Any]) -> dict[str, Any]:
        """The round's metrics at `state`: the clustering's facts and each client's current cluster."""
        out = {k: v for k, v in state["facts"].items() if k != "posterior_argmax"}
        if state["models"] is not None and (self.strategy != "rdpcfl" or state["posteriors"] is not None):
            out["clusters"] = [m for _, m in sorted(self.current(state).items())]
        return out

    def _cluster(self, state: dict[str, Any], global_params: P.Params, uploads: P.Params,
                 clients: list[int]) -> dict[str, Any]:
        """R-DPCFL after round 1: GMM on the released updates (post-processing), cluster models, E_c."""
        if sorted(clients) != list(range(self.n_clients)):
            raise ValueError("R-DPCFL's round 1 needs every client's update (full participation)")
        order = np.argsort(clients)
        # the GMM is scikit-learn's: the updates go to the host once, in the single clustering round of the run
        x = P.flatten(uploads).to(torch.float64).cpu().numpy()[order]
        features = pca_features(x, project=self.project, scaler=self.scaler)
        gmm_seed = derive_seed(self.seed, int(Purpose.CLUSTER), 0, 1) % (2**32)
        fit: ClusterFit = (fit_clusters(features, self.n_clusters, gmm_seed) if self.n_clusters is not None
                           else choose_clusters(features, gmm_seed, self.m_candidates))
        facts = dict(state["facts"])
        if len(set(fit.assignment.tolist())) == 1:  # one cluster found: R-DPCFL is Global (DP-FedAvg) from here
            n_clusters, posteriors = 1, np.ones((self.n_clients, 1))
            facts["degraded_to_global"] = True
        else:
            n_clusters, posteriors = fit.n_clusters, fit.posteriors
        e_c, effective = second_stage_rounds(fit.mpo, self.rounds)
        pairs = [float(np.linalg.norm(fit.means[a] - fit.means[b]))
                 for a in range(fit.n_clusters) for b in range(a + 1, fit.n_clusters)]
        facts.update(n_clusters=fit.n_clusters, mss=fit.mss, mpo=fit.mpo, em_iterations=fit.em_iterations,
                     centre_distance=float(np.mean(pairs)) if pairs else 0.0,
                     gmm_means=fit.means.tolist(), gmm_radii=fit.radii.tolist(),
                     em_converged=fit.converged, e_c=e_c, e_c_effective=effective,
                     round1_clusters=fit.assignment.tolist())
        start = global_params
        if self.cluster_init == "trained_client0":
            k = clients.index(0)
            start = {n: global_params[n] + uploads[n][k].to(global_params[n].dtype) for n in global_params}
        # a tensor, not an ndarray: checkpoints load with torch.load(weights_only=True), which refuses numpy
        return {**state, "models": _stacked(start, n_clusters), "posteriors": torch.from_numpy(posteriors.copy()),
                "n_clusters": n_clusters, "facts": facts}

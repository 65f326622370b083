"""The float64 numerical reference of the splitting family on convex problems (operator_splitting.md §3-§9).

It lives with the reproduction code (`dpfl reproduce splitting`): the study compares iterates to theta* to 1e-8
and beyond, which the neural-network engine's float32 round loop is not built for. It keeps the run's contracts:
the same per-client `PrivacyLedger`, the same calibration (`calibrate_run`) and the same stop rules ("budget"
before a round that would take a participant over its budget, "rounds", and the study's own "residual" and
"diverged"). fedsplit / fedpi / fedrp on networks run in the one round loop (`dpfl.experiment.federated_run`).

Convex problems have closed-form local operators (the exact least-squares prox) and are compared to theta* to
1e-8 and beyond, so they run here on the problem's float64 tensors rather than through the neural-network
engine. Each round: draw S_t (recorded), eta_t from the schedule, the scheme's round (local operators, DP
release, server step, Anderson), then the per-client ledger records one event per upload, and the row logs the
objective, gap f(xbar) - f(theta*), ||xbar - theta*|| / ||theta*||, the fixed-point residual, eta_t, Anderson's
status and fallbacks, and bytes up and down.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.client.convex_clients import ConvexClients
from dpfl.algorithms.server.splitting.scheme import UnifiedSplitting, participants
from dpfl.data.synthetic import ConvexProblem, heterogeneity
from dpfl.privacy.budgets import ClientBudget
from dpfl.privacy.ledger import PrivacyLedger
from dpfl.privacy.run_calibration import PlannedRun, calibrate_run


@dataclass
class SplittingRunResult:
    history: list[dict[str, Any]]
    final: torch.Tensor  # the last reported model (xbar, its shadow, or the ergodic average)
    ledger: PrivacyLedger | None
    heterogeneity: float
    stop_reason: str
    noise_multiplier: float | None = None  # the DP noise the run used (given or calibrated)

    def rounds_to(self, fraction: float = 1e-8) -> int | None:
        """Rounds until the fixed-point residual is below `fraction` of its round-0 value (None if never)."""
        if not self.history or not self.history[0]["residual"] > 0:
            return None
        first = self.history[0]["residual"]
        for row in self.history:
            if row["residual"] <= fraction * first:
                return int(row["round"])
        return None


def run_splitting(
    problem: ConvexProblem | ConvexClients | Any,
    algorithm: UnifiedSplitting,
    rounds: int,
    *,
    seed: int = 0,
    x0: torch.Tensor | None = None,
    delta: float = 1e-5,
    budgets: ClientBudget | Sequence[ClientBudget] | None = None,
    accountant: str = "rdp",
    stop_residual: float | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> SplittingRunResult:
    """Run `rounds` rounds of `algorithm` on a convex problem (a ConvexProblem, its ConvexClients, or a wrapper such
    as MoreauEnvelope). `stop_residual` stops once the residual is below that fraction of its round-0 value. With
    `algorithm.dp` the ledger holds every client's events and rows carry the largest epsilon spent so far; `budgets`
    (one ClientBudget per client, or one for all) set each client's delta and epsilon budget, and calibrate the
    noise when `algorithm.dp` leaves it unset (`calibrate`). With a given noise, the run stops (stop_reason "budget")
    before a round in which a participant's upload would take it over its budget."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    fns = ConvexClients(problem) if isinstance(problem, ConvexProblem) else problem
    n, dim = fns.n_clients, fns.dim
    start = torch.zeros(dim, dtype=torch.float64) if x0 is None else torch.as_tensor(x0, dtype=torch.float64)
    if start.shape != (dim,):
        raise ValueError(f"x0 must have shape ({dim},), got {tuple(start.shape)}")
    per_client = None if budgets is None else ([budgets] * n if isinstance(budgets, ClientBudget) else list(budgets))
    if per_client is not None and len(per_client) != n:
        raise ValueError(f"budgets: {len(per_client)} given for {n} clients")
    dp = algorithm.dp
    if dp is not None and dp.noise_multiplier is None:
        if per_client is None:
            raise ValueError("the dp noise multiplier is unset: give it, or give budgets to calibrate it from")
        algorithm = calibrate(algorithm, per_client, rounds, fns.n_records.tolist(), accountant)
        dp = algorithm.dp
    server = algorithm.server(start, fns.n_records)
    theta = fns.theta_star.to(torch.float64)
    theta_norm = float(torch.linalg.vector_norm(theta))
    ledger = None
    if dp is not None:
        deltas = delta if per_client is None else {i: b.delta for i, b in enumerate(per_client)}
        eps = None if per_client is None else {i: b.epsilon for i, b in enumerate(per_client)}
        ledger = PrivacyLedger(range(n), deltas=deltas, budgets=eps, accountant=accountant, unit=dp.unit)
    history: list[dict[str, Any]] = []
    first_residual, stop, reported = None, "rounds", server.xbar
    for t in range(rounds):
        eta = algorithm.schedule(t)
        idx = participants(algorithm, n, seed, t)
        events = _participation_events(algorithm, fns.n_records, idx)
        if ledger is not None and per_client is not None and ledger.exceeding(events):
            stop = "budget"  # a participant's next upload would exceed its budget (given noise, not calibrated)
            break
        res = server.round(fns, idx, eta, seed, t)
        reported = res.reported
        if ledger is not None and events:
            for event, group in _grouped(events):
                ledger.record_many(group, t, event)
            ledger.close_round(t)
        row = _row(t, eta, res, fns, theta, theta_norm, [int(i) for i in idx],
                   server.window.fallbacks if server.window is not None else 0)
        if ledger is not None:
            row["epsilon_max"] = max(ledger.spent_all().values())
        history.append(row)
        if on_round is not None:
            on_round(row)
        first_residual = res.residual if first_residual is None else first_residual
        if not all(math.isfinite(v) for v in (row["objective"], res.residual)):
            stop = "diverged"
            break
        if stop_residual is not None and res.residual <= stop_residual * first_residual:
            stop = "residual"
            break
    label = algorithm.guarantee_label
    if label is not None:
        for row in history:
            row["label"] = label
    return SplittingRunResult(history, reported.clone(), ledger, heterogeneity(fns.problem), stop,
                              None if dp is None else dp.noise_multiplier)


def _participation_events(algorithm: UnifiedSplitting, n_records: torch.Tensor, idx: torch.Tensor) -> list[tuple]:
    """(client, DP event of its upload this round) for the participants idx; empty without DP. The event depends
    only on the client's record count, so clients with equal counts share one event object."""
    dp = algorithm.dp
    if dp is None:
        return []
    shared: dict[int, Any] = {}
    out = []
    for i in idx.tolist():
        records = int(n_records[i])
        if records not in shared:
            shared[records] = dp.event(records, algorithm.local.inner_steps(records))
        out.append((i, shared[records]))
    return out


def _grouped(events: list[tuple]) -> list[tuple[Any, list[int]]]:
    """The participants grouped by their (shared) event, for the ledger's record_many."""
    groups: dict[int, tuple[Any, list[int]]] = {}
    for client, event in events:
        groups.setdefault(id(event), (event, []))[1].append(client)
    return list(groups.values())


def calibrate(algorithm: UnifiedSplitting, budgets: Sequence[ClientBudget], rounds: int, records: Sequence[int],
              accountant: str = "rdp") -> UnifiedSplitting:
    """`algorithm` with its DP noise calibrated by dpfl's one calibration path (`calibrate_run`) so that every client
    stays within its budget even if it takes part in every round (worst-case participation: under client sampling
    some clients would otherwise be drawn more often than expected). One noise for all: the largest any client
    needs (update_gaussian is a common noise anyway; for dpsgd, clients with larger budgets get more noise than
    their own budget requires)."""
    dp, sel = algorithm.dp, algorithm.participation
    assert dp is not None
    common = dict(selection=sel.kind, k=sel.k, rate=sel.rate, participation="worst_case", accountant=accountant)
    if dp.mode == "update_gaussian":
        plan = PlannedRun("udp", list(budgets), rounds, **common)
    else:
        assert dp.batch is not None
        n = len(budgets)
        plan = PlannedRun("dpsgd", list(budgets), rounds, records=[int(m) for m in records], batch_sizes=[dp.batch] * n,
                          local_steps=[algorithm.local.inner_steps(int(m)) for m in records], local_sampling="poisson",
                          **common)
    noise = float(np.max(calibrate_run(plan).noise))
    return dataclasses.replace(algorithm, dp=dataclasses.replace(dp, noise_multiplier=noise))


def _row(t: int, eta: float, res, fns, theta: torch.Tensor, theta_norm: float, selected: list[int],
         fallbacks: int) -> dict[str, Any]:
    def distances(x: torch.Tensor, prefix: str) -> dict[str, float]:
        dist = float(torch.linalg.vector_norm(x - theta))
        return {f"{prefix}objective": fns.objective(x), f"{prefix}gap": fns.gap(x), f"{prefix}dist": dist,
                f"{prefix}rel_dist": dist / theta_norm if theta_norm > 0 else dist}

    row: dict[str, Any] = {"round": t + 1, "eta": eta, "participants": len(selected), **distances(res.xbar, ""),
                           "residual": res.residual, "anderson": res.anderson, "anderson_fallbacks": fallbacks,
                           "bytes_up": res.bytes_up, "bytes_down": res.bytes_down}
    if res.reported is not res.xbar:
        row.update(distances(res.reported, "reported_"))
    if len(selected) < fns.n_clients:
        row["selected"] = selected
    return row

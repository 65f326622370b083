"""The round loop of the splitting family on convex problems, in float64 (operator_splitting.md §3-§9).

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
    final: torch.Tensor  # the last reported model
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
    noise when `algorithm.dp` leaves it unset (`calibrate`)."""
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
    first_residual, stop = None, "rounds"
    fallbacks = 0
    for t in range(rounds):
        eta = algorithm.schedule(t)
        idx = participants(algorithm, n, seed, t)
        res = server.round(fns, idx, eta, seed, t)
        if ledger is not None and len(idx):
            for records in sorted({int(fns.n_records[i]) for i in idx}):
                group = [int(i) for i in idx if int(fns.n_records[i]) == records]
                ledger.record_many(group, t, dp.event(records, algorithm.local.inner_steps(records)))
            ledger.close_round(t)
        fallbacks += res.anderson.startswith("fallback")
        row = _row(t, eta, res, fns, theta, theta_norm, [int(i) for i in idx], fallbacks)
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
    return SplittingRunResult(history, _final(server), ledger, heterogeneity(fns.problem), stop,
                              None if dp is None else dp.noise_multiplier)


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


def _final(server) -> torch.Tensor:
    avg = server.average
    return avg.mean.clone() if avg is not None and avg.mean is not None else server.xbar.clone()


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

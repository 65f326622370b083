"""Robust-HDP: noise-aware aggregation that estimates each client's noise level from the uploads alone.

Spec heterogeneous_dp §4.4 (RHDP, ICML 2024, Algorithm 1). The server never reads epsilon: it stacks the
K client updates as the columns of M (p x K, float64), splits M into row blocks of `p_prime` rows, and
runs Principal Component Pursuit (`dpfl.algorithms.server.rpca.pcp`) on each block: the low-rank part L
holds the shared signal, the sparse part S the per-client noise. Client i's noise variance is estimated
as sigma_i^2 = sum_j ||S_j[:, i]||^2 (or Q ||S_1[:, i]||^2 with `blocks="first"`), and the update is

    w <- w + server_lr * sum_i w_i Δ_i,   w_i ∝ 1 / max(sigma_i^2, phi max_k sigma_k^2)

(uniform weights if every sigma_i^2 is 0). Because it uses only the uploads, its output is bit-identical
whatever epsilons the clients report (spec §6).

**State.** Unlike the other aggregators this one is stateful (a plain class, not a frozen dataclass):
- `weights(view)` returns the weights computed by the *last* `aggregate` call (they come from the
  uploads, which `weights` does not see); it is meant for the round's diagnostics, called after
  `aggregate`, and it checks that the view has the same clients in the same order.
- `schedule="once"` computes the weights at the first `aggregate` call and reuses them (the authors'
  code); it needs full participation, so every later round must show the same set of clients (the
  weights are matched by client id).
- `last_diagnostics` holds, per block, the PCP iterations, residual, convergence flag and rank(L), and
  the per-client sigma_i^2 estimates.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.server.rpca import MU_GROWTH, MU_NORMS, pcp
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import CheckpointedServerStep
from dpfl.engine import params as P

BLOCK_MODES = ("all", "first")
SCHEDULES = ("every_round", "once")


def _schedule_name(schedule: str) -> str:
    s = schedule.replace("-", "_") if isinstance(schedule, str) else schedule
    if s not in SCHEDULES:
        raise ValueError(f"Robust-HDP schedule must be one of {SCHEDULES} (or 'every-round'), got {schedule!r}")
    return s


def row_blocks(p: int, p_prime: int, blocks: str) -> list[tuple[int, int]]:
    """Row ranges [start, stop) of the blocks used: Q = floor(p / p') blocks of p' rows (rows past Q p'
    are ignored), or the single block [0, p) when p < p'. `first` keeps only the first block."""
    if p < p_prime:
        ranges = [(0, p)]
    else:
        ranges = [(j * p_prime, (j + 1) * p_prime) for j in range(p // p_prime)]
    return ranges[:1] if blocks == "first" else ranges


def noise_weights(sigma2: np.ndarray, floor: float = 1e-6) -> np.ndarray:
    """w_i ∝ 1 / max(sigma_i^2, floor * max_k sigma_k^2), normalised; uniform if every sigma_i^2 is 0."""
    sigma2 = np.asarray(sigma2, dtype=np.float64)
    k = len(sigma2)
    top = float(sigma2.max(initial=0.0))
    if k == 0:
        return np.zeros(0)
    if top <= 0.0:
        return np.full(k, 1.0 / k)
    inv = 1.0 / np.maximum(sigma2, floor * top)
    return inv / inv.sum()


class RobustHDP(CheckpointedServerStep):
    """Robust-HDP aggregator (spec §4.4). See the module docstring for the statefulness of `weights`.

    Options: `p_prime` (block rows, default 200,000), `blocks` (`all` | `first`), `schedule` (`every_round` |
    `once`; `every-round` accepted), and the PCP settings: `mu_norm`, the initial mu's rule (`spectral` |
    `entrywise` | `max_col_sum`; None: spectral when mu grows, else entrywise; `rpca`'s docstring), `lam` (default
    1/sqrt(max(p_j, K))), `tol` (relative, 1e-7), `tol_abs` (absolute, overrides `tol`; the code's call used 5e-8),
    `max_iter` (10,000), `mu_growth` (>= 1, default 1.5; 1 keeps mu constant, as the authors' code did) and
    `mu_max` (default 1e7 times each block's initial mu); `floor` phi (1e-6) and `server_lr`.
    """

    privileged = False

    def __init__(self, p_prime: int = 200_000, blocks: str = "all", schedule: str = "every_round",
                 mu_norm: str | None = None, lam: float | None = None, tol: float = 1e-7,
                 tol_abs: float | None = None, max_iter: int = 10_000, mu_growth: float = MU_GROWTH,
                 mu_max: float | None = None, floor: float = 1e-6, server_lr: float = 1.0) -> None:
        if isinstance(p_prime, bool) or not isinstance(p_prime, (int, np.integer)) or p_prime < 1:
            raise ValueError(f"p_prime must be a positive integer, got {p_prime!r}")
        if blocks not in BLOCK_MODES:
            raise ValueError(f"Robust-HDP blocks must be one of {BLOCK_MODES}, got {blocks!r}")
        if mu_norm is not None and mu_norm not in MU_NORMS:
            raise ValueError(f"Robust-HDP mu_norm must be one of {MU_NORMS}, got {mu_norm!r}")
        if lam is not None and not lam > 0:
            raise ValueError(f"lam must be > 0, got {lam}")
        if not tol > 0:
            raise ValueError(f"tol must be > 0, got {tol}")
        if tol_abs is not None and not tol_abs > 0:
            raise ValueError(f"tol_abs must be > 0, got {tol_abs}")
        if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
            raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
        if not mu_growth >= 1.0:
            raise ValueError(f"mu_growth must be >= 1, got {mu_growth}")
        if mu_max is not None and not mu_max > 0:
            raise ValueError(f"mu_max must be > 0, got {mu_max}")
        if not 0.0 <= floor < 1.0:
            raise ValueError(f"floor must be in [0, 1), got {floor}")
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        self.p_prime = int(p_prime)
        self.blocks = blocks
        self.schedule = _schedule_name(schedule)
        self.mu_norm = mu_norm
        self.lam = lam
        self.tol = tol
        self.tol_abs = tol_abs
        self.max_iter = int(max_iter)
        self.mu_growth = mu_growth
        self.mu_max = mu_max
        self.floor = floor
        self.server_lr = server_lr
        self._last_clients: torch.Tensor | None = None
        self._last_weights: torch.Tensor | None = None
        self._once: dict[int, float] | None = None  # client id -> weight, for schedule="once"
        self.last_diagnostics: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return (f"RobustHDP(p_prime={self.p_prime}, blocks={self.blocks!r}, schedule={self.schedule!r}, "
                f"mu_norm={self.mu_norm!r}, server_lr={self.server_lr})")

    # -- estimation ---------------------------------------------------------------------------------
    def estimate_noise(self, M: np.ndarray) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """sigma_i^2 per column of M (p x K) from the sparse parts of the blocks' PCP, and per-block info."""
        p, k = M.shape
        ranges = row_blocks(p, self.p_prime, self.blocks)
        q = max(1, p // self.p_prime)  # number of blocks in the split, whichever are used
        sigma2 = np.zeros(k)
        infos = []
        for start, stop in ranges:
            _, S, info = pcp(M[start:stop], lam=self.lam, tol=self.tol, max_iter=self.max_iter,
                             mu_norm=self.mu_norm, tol_abs=self.tol_abs, mu_growth=self.mu_growth,
                             mu_max=self.mu_max)
            if not info.converged:
                warnings.warn(f"Robust-HDP: PCP on rows [{start}, {stop}) did not converge in {info.iterations} "
                              f"iterations (relative residual {info.rel_residual:.3g})", RuntimeWarning, stacklevel=3)
            sigma2 += np.einsum("ij,ij->j", S, S)
            infos.append({"rows": (start, stop), "iterations": info.iterations, "converged": info.converged,
                          "residual": info.residual, "rel_residual": info.rel_residual, "rank": info.rank,
                          "lam": info.lam, "mu": info.mu})
        if self.blocks == "first":
            sigma2 *= q
        return sigma2, infos

    def _compute_weights(self, uploads: P.Params) -> tuple[torch.Tensor, dict[str, Any]]:
        M = P.flatten(uploads).detach().to(torch.float64).cpu().numpy().T  # p x K, clients as columns
        if not np.isfinite(M).all():
            raise ValueError("Robust-HDP got a non-finite client update")
        sigma2, infos = self.estimate_noise(M)
        w = noise_weights(sigma2, self.floor)
        return torch.from_numpy(w), {"blocks": infos, "sigma2": sigma2.tolist()}

    def diagnostics(self) -> dict[str, Any]:
        """The round's metrics: the robust PCA's iterations, convergence, relative residual and rank(L) per row
        block, and the per-client noise estimates sigma_i^2 (only the reuse flag when schedule "once" reused
        its weights)."""
        d = self.last_diagnostics or {}
        out: dict[str, Any] = {"pcp_reused": bool(d.get("reused", False))}
        blocks = d.get("blocks") or []
        if blocks:
            out.update(pcp_iterations=[b["iterations"] for b in blocks],
                       pcp_converged=all(b["converged"] for b in blocks),
                       pcp_rel_residual=[b["rel_residual"] for b in blocks], pcp_rank=[b["rank"] for b in blocks])
        if d.get("sigma2"):
            out["sigma2_estimate"] = d["sigma2"]
        return out

    # -- checkpointed state (schedule "once" reuses its round-1 weights) ------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"once": None if self._once is None else dict(self._once)}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore `state_dict()` output; None resets to the state before round 1."""
        once = None if state is None else state["once"]
        self._once = None if once is None else {int(c): float(w) for c, w in once.items()}

    # -- aggregator protocol ------------------------------------------------------------------------
    def aggregate(self, global_params: P.Params, uploads: P.Params, view: ServerView, seed: int,
                  round_: int) -> P.Params:
        """w + server_lr * sum_i w_i Δ_i with noise-aware weights from the uploads (never from epsilon)."""
        k = next(iter(uploads.values())).shape[0] if uploads else 0
        if k != len(view):
            raise ValueError(f"Robust-HDP got {k} uploads for {len(view)} clients in the view")
        clients = view.clients.clone()
        if k == 0:  # nobody to aggregate: the model stays
            self._last_clients, self._last_weights = clients, torch.zeros(0, dtype=torch.float64)
            self.last_diagnostics = {"round": round_, "blocks": [], "sigma2": [], "reused": False}
            return {n: t.clone() for n, t in global_params.items()}
        if self.schedule == "once" and self._once is not None:
            ids = [int(c) for c in clients]
            if len(set(ids)) != len(ids) or set(ids) != set(self._once):
                raise ValueError("Robust-HDP schedule 'once' needs full participation: this round's clients "
                                 f"{sorted(ids)} differ from the first round's {sorted(self._once)}")
            w = torch.tensor([self._once[c] for c in ids], dtype=torch.float64)
            diag: dict[str, Any] = {"blocks": [], "sigma2": None, "reused": True}
        else:
            if self.schedule == "once" and len(view) != view.expected_clients:
                raise ValueError("Robust-HDP schedule 'once' needs full participation: "
                                 f"{len(view)} clients selected, {view.expected_clients} expected")
            w, diag = self._compute_weights(uploads)
            diag["reused"] = False
            if self.schedule == "once":
                self._once = {int(c): float(wi) for c, wi in zip(clients, w, strict=True)}
        self._last_clients, self._last_weights = clients, w
        self.last_diagnostics = {"round": round_, **diag}
        mean = {n: torch.einsum("k,k...->...", w.to(u.dtype), u) for n, u in uploads.items()}
        return P.axpy(self.server_lr, mean, global_params)

    @property
    def last_weights(self) -> torch.Tensor | None:
        """The float64 weights of the last `aggregate` call (None before the first)."""
        return self._last_weights

    def aggregation_weights(self, view: ServerView, channel: object, dim: int) -> torch.Tensor:
        return self.weights(view)

    def weights(self, view: ServerView) -> torch.Tensor:
        """The weights of the last `aggregate` call (Robust-HDP's weights come from the uploads).

        For diagnostics after `aggregate`; raises if nothing was aggregated yet or the view's clients
        differ from those of the last aggregated round.
        """
        if self._last_weights is None or self._last_clients is None:
            raise ValueError("Robust-HDP weights come from the uploads: call aggregate() for the round first")
        if not torch.equal(view.clients, self._last_clients):
            raise ValueError("Robust-HDP weights(view): the view's clients differ from the last aggregated round's")
        return self._last_weights.to(torch.float32)


"""Robust-HDP: noise-aware aggregation that estimates each client's noise level from the uploads alone.

Spec heterogeneous_dp §4.4 (RHDP, ICML 2024, Algorithm 1). The server never reads epsilon: it stacks the
K client updates as the columns of M (p x K, float64), splits M into row blocks of `p_prime` rows, and
runs Principal Component Pursuit (`dpfl.algorithms.server.rpca.pcp`) on each block: the low-rank part L
holds the shared signal, the sparse part S the per-client noise. Client i's noise variance is estimated
as sigma_i^2 = sum_j ||S_j[:, i]||^2 (or Q ||S_1[:, i]||^2 with `blocks="first"`), and the update is

    w <- w + server_lr * sum_i w_i Δ_i,   w_i ∝ 1 / max(sigma_i^2, phi max_k sigma_k^2)

(uniform weights if every sigma_i^2 is 0). Because it uses only the uploads, its output is bit-identical
whatever epsilons the clients report (spec §6).

**State** (`init`, returned by `update`; the step itself is configuration only): a dict with
- `once`: for `schedule="once"`, client id -> weight from the first update, reused every later round (the authors'
  code); it needs full participation, so every later round must show the same set of clients (the weights are
  matched by client id). None before the first round, and always with `every_round`.
- `last`: {"clients": int64 [K], "weights": float64 [K]} of the update that returned the state (None before the
  first): the weights come from the uploads, which the round's diagnostics (`aggregation_weights`) do not see.
  A checkpoint written before this key existed resumes with None (the loop reads it only after an update).
The PCP runs in float64 on the uploads' device (`rpca`); the state's tensors stay on the CPU.
`update`'s metrics are the robust PCA's iterations, convergence, relative residual and rank(L) per row block, and the
per-client sigma_i^2 estimates.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.server.rpca import MU_GROWTH, MU_NORMS, pcp
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
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


def noise_weights(sigma2, floor: float = 1e-6) -> torch.Tensor:
    """w_i ∝ 1 / max(sigma_i^2, floor * max_k sigma_k^2), normalised; uniform if every sigma_i^2 is 0.

    float64, on `sigma2`'s device (a tensor) or the CPU (a sequence or array)."""
    sigma2 = torch.as_tensor(sigma2, dtype=torch.float64)
    k = sigma2.numel()
    if k == 0:
        return sigma2.new_zeros(0)
    top = float(sigma2.max())
    if top <= 0.0:
        return sigma2.new_full((k,), 1.0 / k)
    inv = 1.0 / torch.clamp_min(sigma2, floor * top)
    return inv / inv.sum()


def last_weights(state: dict[str, Any]) -> torch.Tensor | None:
    """The float64 weights of the update that returned `state` (None before the first)."""
    last = state.get("last")
    return None if last is None else last["weights"]


def round_weights(state: dict[str, Any], view: ServerView) -> torch.Tensor:
    """The weights (float32) of the update that returned `state`, for that round's diagnostics.

    Raises if `state` comes from no update, or the view's clients differ from those of the update's round.
    """
    last = state.get("last")
    if last is None:
        raise ValueError("Robust-HDP weights come from the uploads: call update() for the round first")
    if not torch.equal(view.clients, last["clients"]):
        raise ValueError("Robust-HDP weights: the view's clients differ from those of the round that gave the state")
    return last["weights"].to(torch.float32)


def pcp_metrics(diag: dict[str, Any]) -> dict[str, Any]:
    """The round's metrics from its estimation record: the robust PCA's iterations, convergence, relative residual
    and rank(L) per row block, and the per-client noise estimates sigma_i^2 (only the reuse flag when schedule
    "once" reused its weights)."""
    out: dict[str, Any] = {"pcp_reused": bool(diag.get("reused", False))}
    blocks = diag.get("blocks") or []
    if blocks:
        out.update(pcp_iterations=[b["iterations"] for b in blocks],
                   pcp_converged=all(b["converged"] for b in blocks),
                   pcp_rel_residual=[b["rel_residual"] for b in blocks], pcp_rank=[b["rank"] for b in blocks])
    if diag.get("sigma2"):
        out["sigma2_estimate"] = diag["sigma2"]
    return out


@dataclass(frozen=True)
class RobustHDP(ServerStep):
    """Robust-HDP aggregator (spec §4.4). See the module docstring for its state.

    Options: `p_prime` (block rows, default 200,000), `blocks` (`all` | `first`), `schedule` (`every_round` |
    `once`; `every-round` accepted), and the PCP settings: `mu_norm`, the initial mu's rule (`spectral` |
    `entrywise` | `max_col_sum`; None: spectral when mu grows, else entrywise; `rpca`'s docstring), `lam` (default
    1/sqrt(max(p_j, K))), `tol` (relative, 1e-7), `tol_abs` (absolute, overrides `tol`; the code's call used 5e-8),
    `max_iter` (10,000), `mu_growth` (>= 1, default 1.5; 1 keeps mu constant, as the authors' code did) and
    `mu_max` (default 1e7 times each block's initial mu); `floor` phi (1e-6) and `server_lr`.
    """

    privileged = False

    p_prime: int = 200_000
    blocks: str = "all"
    schedule: str = "every_round"
    mu_norm: str | None = None
    lam: float | None = None
    tol: float = 1e-7
    tol_abs: float | None = None
    max_iter: int = 10_000
    mu_growth: float = MU_GROWTH
    mu_max: float | None = None
    floor: float = 1e-6
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        p_prime, max_iter = self.p_prime, self.max_iter
        if isinstance(p_prime, bool) or not isinstance(p_prime, (int, np.integer)) or p_prime < 1:
            raise ValueError(f"p_prime must be a positive integer, got {p_prime!r}")
        if self.blocks not in BLOCK_MODES:
            raise ValueError(f"Robust-HDP blocks must be one of {BLOCK_MODES}, got {self.blocks!r}")
        if self.mu_norm is not None and self.mu_norm not in MU_NORMS:
            raise ValueError(f"Robust-HDP mu_norm must be one of {MU_NORMS}, got {self.mu_norm!r}")
        if self.lam is not None and not self.lam > 0:
            raise ValueError(f"lam must be > 0, got {self.lam}")
        if not self.tol > 0:
            raise ValueError(f"tol must be > 0, got {self.tol}")
        if self.tol_abs is not None and not self.tol_abs > 0:
            raise ValueError(f"tol_abs must be > 0, got {self.tol_abs}")
        if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
            raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
        if not self.mu_growth >= 1.0:
            raise ValueError(f"mu_growth must be >= 1, got {self.mu_growth}")
        if self.mu_max is not None and not self.mu_max > 0:
            raise ValueError(f"mu_max must be > 0, got {self.mu_max}")
        if not 0.0 <= self.floor < 1.0:
            raise ValueError(f"floor must be in [0, 1), got {self.floor}")
        if not self.server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {self.server_lr}")
        object.__setattr__(self, "p_prime", int(p_prime))
        object.__setattr__(self, "schedule", _schedule_name(self.schedule))
        object.__setattr__(self, "max_iter", int(max_iter))

    def __repr__(self) -> str:
        return (f"RobustHDP(p_prime={self.p_prime}, blocks={self.blocks!r}, schedule={self.schedule!r}, "
                f"mu_norm={self.mu_norm!r}, server_lr={self.server_lr})")

    # -- estimation ---------------------------------------------------------------------------------
    def estimate_noise(self, M: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        """sigma_i^2 per column of M (p x K; float64 on M's device) from the sparse parts of the blocks' PCP, and
        per-block info."""
        M = torch.as_tensor(M)
        p, k = M.shape
        ranges = row_blocks(p, self.p_prime, self.blocks)
        q = max(1, p // self.p_prime)  # number of blocks in the split, whichever are used
        sigma2 = M.new_zeros(k, dtype=torch.float64)
        infos = []
        for start, stop in ranges:
            _, S, info = pcp(M[start:stop], lam=self.lam, tol=self.tol, max_iter=self.max_iter,
                             mu_norm=self.mu_norm, tol_abs=self.tol_abs, mu_growth=self.mu_growth,
                             mu_max=self.mu_max)
            if not info.converged:
                warnings.warn(f"Robust-HDP: PCP on rows [{start}, {stop}) did not converge in {info.iterations} "
                              f"iterations (relative residual {info.rel_residual:.3g})", RuntimeWarning, stacklevel=3)
            sigma2 += torch.einsum("ij,ij->j", S, S)
            infos.append({"rows": (start, stop), "iterations": info.iterations, "converged": info.converged,
                          "residual": info.residual, "rel_residual": info.rel_residual, "rank": info.rank,
                          "lam": info.lam, "mu": info.mu})
        if self.blocks == "first":
            sigma2 *= q
        return sigma2, infos

    def noise_aware_weights(self, uploads: P.Params) -> tuple[torch.Tensor, dict[str, Any]]:
        """The float64 weights of the uploads `[K, ...]` (on their device) and their estimation record: per row
        block the PCP's iterations, residuals, convergence, rank(L), lam and mu (`blocks`), and the sigma_i^2
        estimates."""
        M = P.flatten(uploads).detach().to(torch.float64).T  # p x K, clients as columns, on the uploads' device
        if not bool(torch.isfinite(M).all()):
            raise ValueError("Robust-HDP got a non-finite client update")
        sigma2, infos = self.estimate_noise(M)
        w = noise_weights(sigma2, self.floor)
        return w, {"blocks": infos, "sigma2": sigma2.tolist()}

    # -- the server step ----------------------------------------------------------------------------
    def init(self, params: P.Params) -> dict[str, Any]:
        """No weights yet: `once` is filled by the first update of schedule "once", `last` by every update."""
        return {"once": None, "last": None}

    def update(self, state: dict[str, Any], params: P.Params, uploads: P.Params, inputs: RoundInputs) -> ServerUpdate:
        """w + server_lr * sum_i w_i Δ_i with noise-aware weights from the uploads (never from epsilon)."""
        view = inputs.view
        k = next(iter(uploads.values())).shape[0] if uploads else 0
        if k != len(view):
            raise ValueError(f"Robust-HDP got {k} uploads for {len(view)} clients in the view")
        clients = view.clients.clone()
        once = state["once"]
        once = None if once is None else {int(c): float(w) for c, w in once.items()}
        if k == 0:  # nobody to aggregate: the model stays
            last = {"clients": clients, "weights": torch.zeros(0, dtype=torch.float64)}
            return ServerUpdate({n: t.clone() for n, t in params.items()}, {**state, "once": once, "last": last},
                                pcp_metrics({}))
        if self.schedule == "once" and once is not None:
            ids = [int(c) for c in clients]
            if len(set(ids)) != len(ids) or set(ids) != set(once):
                raise ValueError("Robust-HDP schedule 'once' needs full participation: this round's clients "
                                 f"{sorted(ids)} differ from the first round's {sorted(once)}")
            w = torch.tensor([once[c] for c in ids], dtype=torch.float64)
            diag: dict[str, Any] = {"blocks": [], "sigma2": None, "reused": True}
        else:
            if self.schedule == "once" and len(view) != view.expected_clients:
                raise ValueError("Robust-HDP schedule 'once' needs full participation: "
                                 f"{len(view)} clients selected, {view.expected_clients} expected")
            w, diag = self.noise_aware_weights(uploads)
            if self.schedule == "once":
                once = {int(c): float(wi) for c, wi in zip(clients, w, strict=True)}
        mean = {n: torch.einsum("k,k...->...", w.to(device=u.device, dtype=u.dtype), u) for n, u in uploads.items()}
        # the state is host-side (K numbers): checkpoints and the round's diagnostics read it on the CPU
        new_state = {**state, "once": once, "last": {"clients": clients, "weights": w.cpu()}}
        return ServerUpdate(P.axpy(self.server_lr, mean, params), new_state, pcp_metrics(diag))

    def aggregation_weights(self, state: dict[str, Any], view: ServerView, channel: object,
                            dim: int) -> torch.Tensor:
        return round_weights(state, view)

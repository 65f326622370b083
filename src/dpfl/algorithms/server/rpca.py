"""Robust PCA by Principal Component Pursuit (PCP), solved with the inexact augmented Lagrangian method.

PCP (Candès, Li, Ma, Wright, "Robust Principal Component Analysis?", JACM 2011) splits a matrix into a
low-rank part and a sparse part,

    min ||L||_* + lam ||S||_1   subject to   L + S = M,

and the inexact ALM of Lin, Chen, Ma (arXiv 1009.5055) alternates singular-value thresholding on L,
entrywise soft-thresholding on S and a dual ascent step on Y (spec heterogeneous_dp §4.4, step 3):

    L <- SVT_{1/mu}(M - S + Y/mu)
    S <- shrink_{lam/mu}(M - L + Y/mu)
    Y <- Y + mu (M - L - S)          (mu <- min(rho mu, mu_max) when mu_growth rho > 1)

until ||M - L - S||_F < tol ||M||_F (or < tol_abs). Everything runs in float64 NumPy.

The default lam = 1/sqrt(max(m, n)) and mu = m n / (4 ||M||_1). The norm in mu is the entrywise l1 norm
by default (standard PCP, spec §9.11); `mu_norm="max_col_sum"` uses the largest absolute column sum,
which is what the Robust-HDP authors' code computed (`np.linalg.norm(D, ord=1)`). The PCP optimum does
not depend on mu; mu only changes the speed and the iterate reached at a given tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MU_NORMS = ("entrywise", "max_col_sum")


@dataclass(frozen=True)
class PCPInfo:
    """How a PCP solve went: iterations run, whether the residual reached the tolerance, and the end state."""

    iterations: int
    converged: bool
    residual: float  # ||M - L - S||_F at the last iterate
    rel_residual: float  # residual / ||M||_F (0 when M = 0)
    tol_abs: float  # the absolute tolerance actually used
    rank: int  # number of nonzero singular values kept by the last SVT
    lam: float
    mu: float  # the initial mu
    mu_final: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def soft_threshold(x: np.ndarray, tau: float) -> np.ndarray:
    """shrink_tau(x) = sign(x) max(|x| - tau, 0), entrywise."""
    return x - np.clip(x, -tau, tau)  # equal to the formula above, in fewer passes


def svt(x: np.ndarray, tau: float) -> tuple[np.ndarray, int]:
    """SVT_tau(X) = U diag(max(s - tau, 0)) V^T (thin SVD), and the number of singular values kept.

    For tall matrices (m >= 4n, the Robust-HDP shape: parameters x clients) the thin SVD is taken from
    the eigendecomposition of the n x n Gram matrix, SVT_tau(X) = X V_r diag(1 - tau/s_r) V_r^T, which
    is about 10x faster. Squaring loses accuracy on singular values below ~sqrt(eps) s_max, so this
    path is used only when every kept singular value is >= 1e-4 s_max (relative eigenvalue error
    <~ 1e-8); otherwise, and for other shapes, LAPACK's SVD is used.
    """
    m, n = x.shape
    if m >= 4 * n:
        evals, v = np.linalg.eigh(x.T @ x)
        s = np.sqrt(np.maximum(evals[::-1], 0.0))
        v = v[:, ::-1]
        keep = s > tau
        r = int(np.count_nonzero(keep))
        if r == 0:
            return np.zeros_like(x), 0
        if s[r - 1] >= 1e-4 * s[0]:
            vr = v[:, :r]
            return (x @ vr) * (1.0 - tau / s[:r]) @ vr.T, r
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    s = s - tau
    r = int(np.count_nonzero(s > 0))
    if r == 0:
        return np.zeros_like(x), 0
    return (u[:, :r] * s[:r]) @ vt[:r], r


def mu_default(m: np.ndarray, mu_norm: str = "entrywise") -> float:
    """mu = m n / (4 ||M||_1) with the entrywise l1 norm or the largest absolute column sum."""
    if mu_norm not in MU_NORMS:
        raise ValueError(f"mu_norm must be one of {MU_NORMS}, got {mu_norm!r}")
    a = np.abs(m)
    norm = float(a.sum()) if mu_norm == "entrywise" else float(a.sum(axis=0).max(initial=0.0))
    return float(m.shape[0] * m.shape[1] / (4.0 * norm)) if norm > 0 else float("inf")


def pcp(
    M,
    lam: float | None = None,
    mu: float | None = None,
    tol: float = 1e-7,
    max_iter: int = 1000,
    mu_norm: str = "entrywise",
    *,
    tol_abs: float | None = None,
    mu_growth: float = 1.0,
    mu_max: float | None = None,
) -> tuple[np.ndarray, np.ndarray, PCPInfo]:
    """Principal Component Pursuit of a 2-D matrix `M` (NumPy array or torch tensor) by inexact ALM.

    Returns `(L, S, info)` as float64 NumPy arrays with L + S ≈ M. `lam` defaults to 1/sqrt(max(m, n)),
    `mu` to m n / (4 ||M||_1) with `mu_norm` choosing the norm. The loop stops when
    ||M - L - S||_F < tol ||M||_F, or < `tol_abs` when given (which overrides `tol`), or after
    `max_iter` iterations (`info.converged` is then False). `mu_growth` rho >= 1 multiplies mu after each
    iteration, capped at `mu_max` (default: unbounded); rho = 1 (default) keeps mu constant, as the
    Robust-HDP code does.
    """
    if hasattr(M, "detach"):  # torch tensor
        M = M.detach().cpu().numpy()
    M = np.array(M, dtype=np.float64, copy=True)
    if M.ndim != 2 or M.size == 0:
        raise ValueError(f"pcp needs a non-empty 2-D matrix, got shape {M.shape}")
    if not np.isfinite(M).all():
        raise ValueError("pcp needs a finite matrix (found NaN or inf)")
    if mu_norm not in MU_NORMS:
        raise ValueError(f"mu_norm must be one of {MU_NORMS}, got {mu_norm!r}")
    if not (isinstance(max_iter, (int, np.integer)) and max_iter >= 1):
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    if tol_abs is None and not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    if tol_abs is not None and not tol_abs > 0:
        raise ValueError(f"tol_abs must be > 0, got {tol_abs}")
    if not mu_growth >= 1.0:
        raise ValueError(f"mu_growth must be >= 1, got {mu_growth}")
    if mu_max is not None and not mu_max > 0:
        raise ValueError(f"mu_max must be > 0, got {mu_max}")
    m, n = M.shape
    lam = 1.0 / np.sqrt(max(m, n)) if lam is None else float(lam)
    if not lam > 0:
        raise ValueError(f"lam must be > 0, got {lam}")

    norm_m = float(np.linalg.norm(M))
    if norm_m == 0.0:  # L = S = 0 is exact
        z = np.zeros_like(M)
        mu0 = float("nan") if mu is None else float(mu)
        return z, z.copy(), PCPInfo(0, True, 0.0, 0.0, 0.0 if tol_abs is None else float(tol_abs), 0, lam, mu0, mu0)
    mu = mu_default(M, mu_norm) if mu is None else float(mu)
    if not (mu > 0 and np.isfinite(mu)):
        raise ValueError(f"mu must be a positive finite number, got {mu}")
    mu_cap = float("inf") if mu_max is None else max(float(mu_max), mu)
    thresh = float(tol_abs) if tol_abs is not None else tol * norm_m

    S = np.zeros_like(M)
    Y = np.zeros_like(M)
    L = np.zeros_like(M)
    mu_k, rank, residual, it, converged = mu, 0, norm_m, 0, False
    for it in range(1, max_iter + 1):
        inv = 1.0 / mu_k
        T = M + inv * Y
        L, rank = svt(T - S, inv)
        T -= L
        S = soft_threshold(T, lam * inv)
        R = M - L
        R -= S
        residual = float(np.linalg.norm(R))
        R *= mu_k
        Y += R
        if residual < thresh:
            converged = True
            break
        if mu_growth > 1.0:
            mu_k = min(mu_k * mu_growth, mu_cap)
    return L, S, PCPInfo(it, converged, residual, residual / norm_m, thresh, rank, lam, mu, mu_k)

"""Robust PCA by Principal Component Pursuit (PCP), solved with the inexact augmented Lagrangian method.

PCP (Candès, Li, Ma, Wright, "Robust Principal Component Analysis?", JACM 2011) splits a matrix into a
low-rank part and a sparse part,

    min ||L||_* + lam ||S||_1   subject to   L + S = M,

and the inexact ALM of Lin, Chen, Ma (arXiv 1009.5055) alternates singular-value thresholding on L,
entrywise soft-thresholding on S and a dual ascent step on Y (spec heterogeneous_dp §4.4, step 3):

    L <- SVT_{1/mu}(M - S + Y/mu)
    S <- shrink_{lam/mu}(M - L + Y/mu)
    Y <- Y + mu (M - L - S)          (mu <- min(rho mu, mu_max) when mu_growth rho > 1)

until ||M - L - S||_F < tol ||M||_F (or < tol_abs). Everything runs in torch on the input's device, in float64
unless `dtype` says otherwise (issue 67: the server step follows the uploads' device; a NumPy input is solved on
the CPU). This is a port of the earlier NumPy solver, which tests/algorithms/rpca_numpy.py keeps as the reference:
the same iteration, the same routes and the same operations per entry; on the CPU the two agree to rounding (the
BLAS behind torch and NumPy sum in different orders: tests/algorithms/test_rpca_torch.py states the tolerance).

By default mu grows by `mu_growth` rho = 1.5 after every iteration, capped at `mu_max` = 1e7 mu_0: the standard
inexact ALM (spec §4.4 as revised 2026-12; at a constant mu a Robust-HDP solve took thousands of iterations, 5,459
at p = 1e5, n = 30). A growing mu starts where Lin, Chen and Ma start it, mu_0 = 1.25 / ||M||_2 (`mu_norm=
"spectral"`, the default when mu grows). Deviation from the spec's text, which keeps mu_0 = m n / (4 ||M||_1): that
mu_0 is ~50x larger, and grown from it the loop meets the primal stopping rule within a dozen iterations, far from
the optimum (Robust-HDP's weights then carry 17x the oracle's noise on the test problem, against 1.0005 at a
constant mu and 1.009 from LCM's mu_0; tests/algorithms/test_robust_hdp.py). `mu_growth=1.0` keeps mu constant
from m n / (4 ||M||_1), as the Robust-HDP authors' code did. Known limit of the default (issue 67, reported to the
spec's owners): on the thesis's Table 3.4 setting rho = 1.5 meets the primal stopping rule on another iterate than a
constant mu (rank 17-20 against 10-13; Robust-HDP weights 1-15% off, a strict xfail in test_robust_hdp.py), and a
tighter tol does not help; rho = 1.02 reaches the constant mu's weights, L and S in ~250 iterations.

The default lam = 1/sqrt(max(m, n)). At a constant mu the initial mu is m n / (4 ||M||_1), with the entrywise l1
norm by default (standard PCP, spec §9.11); `mu_norm="max_col_sum"` uses the largest absolute column sum, which is
what the Robust-HDP authors' code computed (`np.linalg.norm(D, ord=1)`). The PCP optimum does not depend on mu; mu
only changes the speed and the iterate reached at a given tolerance.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from dataclasses import dataclass

import torch

MU_NORMS = ("entrywise", "max_col_sum", "spectral")
MU_GROWTH = 1.5  # rho, the default growth of mu per iteration (spec §4.4)
MU_MAX_FACTOR = 1e7  # the default cap of a growing mu: 1e7 mu_0 (spec §4.4)


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
    svt_fallbacks: int = 0  # iterations whose n x n SVT needed the QR route (tall/wide matrices only)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def soft_threshold(x: torch.Tensor, tau: float) -> torch.Tensor:
    """shrink_tau(x) = sign(x) max(|x| - tau, 0), entrywise."""
    return x - x.clamp(-tau, tau)  # equal to the formula above, in fewer passes


# SVT of a tall m x n matrix (m >= GRAM_MIN_ASPECT n, the Robust-HDP shape: parameters x clients) works on
# an n x n problem. SVT_tau(X) = X V_r diag(1 - tau/s_r) V_r^T needs only the right singular vectors and
# singular values, which come from the eigendecomposition of the Gram matrix X^T X when that is accurate
# enough, else from the SVD of the R factor of X = QR (Householder QR is backward stable, so R has X's
# singular values and right singular vectors to O(eps s_max), like a dense SVD).
#
# Gram, not QR, first: on this project's 2-core machine syrk (X^T X) of a 200,000 x 100 block takes ~0.1 s on
# one thread against ~1.4 s for geqrf (and ~3.3 s for the thin SVD), and the Gram matrix can be summed chunk
# by chunk inside the pass that builds X, so it costs no extra sweep over memory. Its weakness is that it
# squares the condition number: eigenvalues carry an absolute error ~eps s_max^2, so a singular value s has
# a relative error ~eps (s_max/s)^2 and the SVT output an absolute error ~eps s_max^2 / s_r, s_r the smallest
# singular value kept. The Gram result is therefore used only when s_r >= GRAM_MIN_RATIO s_max (SVT error
# <~ 1e4 eps s_max ~ 2e-12 s_max, relative to ||SVT(X)|| >= s_max - tau); otherwise that iteration falls back
# to the QR route (counted in PCPInfo.svt_fallbacks). A randomized SVD is not used: it is not exact, and
# early PCP iterates are full rank.
GRAM_MIN_ASPECT = 4
GRAM_MIN_RATIO = 1e-4
# rows per chunk of the fused PCP sweeps on the CPU: ~512 KiB of each m x n operand (L2-sized). On an accelerator
# the sweep is one chunk (the whole block): a chunk costs ~15 kernel launches, and the device has no L2 to fit.
CHUNK_BYTES = 1 << 19
# CPU threads inside pcp(): 1 (measured with the NumPy solver in benchmarks/server_steps.py: the fused sweeps issue
# many small BLAS calls, and multithreaded BLAS on a shared 2-core machine was several times slower); None leaves
# the process's setting alone. No effect on other devices.
BLAS_THREADS: int | None = 1


def _gram_factors(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Singular values (descending) and right singular vectors of X from its Gram matrix g = X^T X."""
    evals, v = torch.linalg.eigh(g)
    return evals.flip(0).clamp_min(0.0).sqrt(), v.flip(1)


def _qr_factors(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Singular values (descending) and right singular vectors of a tall X from the SVD of R in X = QR."""
    r = torch.linalg.qr(x, mode="r").R
    _, s, vh = torch.linalg.svd(r)
    return s, vh.T


def _kept(s_host: list[float], tau: float) -> int:
    return sum(1 for v in s_host if v > tau)  # s is sorted descending


def _gram_accurate(s_host: list[float], tau: float) -> bool:
    r = _kept(s_host, tau)
    return r == 0 or s_host[r - 1] >= GRAM_MIN_RATIO * s_host[0]


def _shrink_map(s: torch.Tensor, v: torch.Tensor, tau: float, r: int
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(left, right) with SVT_tau(X) = (X @ left) @ right, or X @ right when left is None (r > n/2), for the r
    singular values kept; r = 0 gives (None, None) and SVT_tau(X) = 0."""
    if r == 0:
        return None, None
    vr = v[:, :r].contiguous()
    f = 1.0 - tau / s[:r]
    if 2 * r <= v.shape[0]:  # two thin products, 2 m n r flops
        return vr, f[:, None] * vr.T
    return None, (vr * f) @ vr.T  # one n x n operator, m n^2 flops


def _apply(x: torch.Tensor, left: torch.Tensor | None, right: torch.Tensor) -> torch.Tensor:
    return x @ right if left is None else (x @ left) @ right


def svt(x: torch.Tensor, tau: float) -> tuple[torch.Tensor, int]:
    """SVT_tau(X) = U diag(max(s - tau, 0)) V^T (thin SVD), and the number of singular values kept.

    Tall matrices (m >= 4n) go through the n x n problem (Gram matrix, or QR when the Gram matrix is not
    accurate enough: see the comment above); other shapes use LAPACK's thin SVD. On `x`'s device and dtype.
    """
    m, n = x.shape
    if m >= GRAM_MIN_ASPECT * n:
        s, v = _gram_factors(x.T @ x)
        s_host = s.tolist()
        if not _gram_accurate(s_host, tau):
            s, v = _qr_factors(x)
            s_host = s.tolist()
        r = _kept(s_host, tau)
        left, right = _shrink_map(s, v, tau, r)
        return (torch.zeros_like(x), 0) if right is None else (_apply(x, left, right), r)
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    s = s - tau
    r = _kept(s.tolist(), 0.0)
    if r == 0:
        return torch.zeros_like(x), 0
    return (u[:, :r] * s[:r]) @ vh[:r], r


def default_mu_norm(mu_growth: float) -> str:
    """The initial mu's rule when none is chosen: LCM's 1.25 / ||M||_2 for a growing mu, m n / (4 ||M||_1) for a
    constant one."""
    return "spectral" if mu_growth > 1.0 else "entrywise"


def mu_default(m: torch.Tensor, mu_norm: str = "entrywise") -> float:
    """The initial mu: m n / (4 ||M||_1) with the entrywise l1 norm or the largest absolute column sum, or
    1.25 / ||M||_2 (`spectral`, Lin, Chen and Ma's start for a growing mu; ||M||_2 from the smaller Gram matrix)."""
    if mu_norm not in MU_NORMS:
        raise ValueError(f"mu_norm must be one of {MU_NORMS}, got {mu_norm!r}")
    m = torch.as_tensor(m)
    if mu_norm == "spectral":
        gram = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
        top = float(torch.linalg.eigvalsh(gram)[-1]) if gram.numel() else 0.0
        return 1.25 / math.sqrt(top) if top > 0 else float("inf")
    a = m.abs()
    norm = float(a.sum()) if mu_norm == "entrywise" else (float(a.sum(0).max()) if a.numel() else 0.0)
    return float(m.shape[0] * m.shape[1] / (4.0 * norm)) if norm > 0 else float("inf")


def pcp(
    M,
    lam: float | None = None,
    mu: float | None = None,
    tol: float = 1e-7,
    max_iter: int = 10_000,
    mu_norm: str | None = None,
    *,
    tol_abs: float | None = None,
    mu_growth: float = MU_GROWTH,
    mu_max: float | None = None,
    blas_threads: int | None = BLAS_THREADS,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, PCPInfo]:
    """Principal Component Pursuit of a 2-D matrix `M` (torch tensor, or anything `torch.as_tensor` takes) by
    inexact ALM.

    Returns `(L, S, info)` as `dtype` (float64 by default) tensors on `M`'s device with L + S ≈ M; `M` is not
    changed. `lam` defaults to 1/sqrt(max(m, n)), `mu` to the rule `mu_norm` names (None: `spectral` when mu grows,
    else `entrywise`; module docstring). The loop stops when ||M - L - S||_F < tol ||M||_F, or < `tol_abs` when
    given (which overrides `tol`), or after `max_iter` iterations (default 10,000 as in spec §4.4;
    `info.converged` is then False). `mu_growth` rho >= 1 multiplies mu after each iteration (default 1.5), capped
    at `mu_max` (default 1e7 times the initial mu); rho = 1 keeps mu constant, as the Robust-HDP code does.
    `blas_threads` caps torch's CPU threads for the call (None: leave them; no effect off the CPU).

    Tall (m >= 4n) and wide (n >= 4m, solved transposed: every step commutes with transposition) matrices
    run the same iteration in fused row-chunk sweeps with an n x n SVT (see `svt`); the iterates equal
    those of the dense-SVD loop up to rounding. Each iteration reads a few numbers back to the host (the
    singular values that decide the rank and the route, and the residual), so a solve on an accelerator syncs
    twice per iteration: the stopping rule needs them.
    """
    M = torch.as_tensor(M).detach().to(dtype=dtype)
    if M.ndim != 2 or M.numel() == 0:
        raise ValueError(f"pcp needs a non-empty 2-D matrix, got shape {tuple(M.shape)}")
    if not bool(torch.isfinite(M).all()):
        raise ValueError("pcp needs a finite matrix (found NaN or inf)")
    if mu_norm is not None and mu_norm not in MU_NORMS:
        raise ValueError(f"mu_norm must be one of {MU_NORMS}, got {mu_norm!r}")
    if not (_is_int(max_iter) and max_iter >= 1):
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    if tol_abs is None and not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    if tol_abs is not None and not tol_abs > 0:
        raise ValueError(f"tol_abs must be > 0, got {tol_abs}")
    if not mu_growth >= 1.0:
        raise ValueError(f"mu_growth must be >= 1, got {mu_growth}")
    if mu_max is not None and not mu_max > 0:
        raise ValueError(f"mu_max must be > 0, got {mu_max}")
    if blas_threads is not None and not (_is_int(blas_threads) and blas_threads >= 1):
        raise ValueError(f"blas_threads must be a positive integer or None, got {blas_threads!r}")
    max_iter = int(max_iter)
    m, n = M.shape
    lam = 1.0 / math.sqrt(max(m, n)) if lam is None else float(lam)
    if not lam > 0:
        raise ValueError(f"lam must be > 0, got {lam}")

    norm_m = float(torch.linalg.norm(M))
    if norm_m == 0.0:  # L = S = 0 is exact
        z = torch.zeros_like(M)
        mu0 = float("nan") if mu is None else float(mu)
        return z, z.clone(), PCPInfo(0, True, 0.0, 0.0, 0.0 if tol_abs is None else float(tol_abs), 0, lam, mu0,
                                     mu0)
    mu = mu_default(M, mu_norm or default_mu_norm(mu_growth)) if mu is None else float(mu)
    if not (mu > 0 and math.isfinite(mu)):
        raise ValueError(f"mu must be a positive finite number, got {mu}")
    mu_cap = MU_MAX_FACTOR * mu if mu_max is None else max(float(mu_max), mu)
    thresh = float(tol_abs) if tol_abs is not None else tol * norm_m

    with _thread_limit(blas_threads, M.device):
        if m >= GRAM_MIN_ASPECT * n:
            L, S, state = _pcp_tall(M, lam, mu, thresh, max_iter, mu_growth, mu_cap)
        elif n >= GRAM_MIN_ASPECT * m:
            Lt, St, state = _pcp_tall(M.T.contiguous(), lam, mu, thresh, max_iter, mu_growth, mu_cap)
            L, S = Lt.T.contiguous(), St.T.contiguous()
        else:
            L, S, state = _pcp_dense(M, lam, mu, thresh, max_iter, mu_growth, mu_cap)
    it, converged, residual, rank, mu_k, fallbacks = state
    return L, S, PCPInfo(it, converged, residual, residual / norm_m, thresh, rank, lam, mu, mu_k, fallbacks)


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


@contextlib.contextmanager
def _thread_limit(threads: int | None, device: torch.device):
    if threads is None or device.type != "cpu" or torch.get_num_threads() == threads:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _pcp_dense(M, lam, mu, thresh, max_iter, mu_growth, mu_cap):
    """The inexact ALM loop with a dense thin SVD per iteration (matrices within a factor 4 of square)."""
    S = torch.zeros_like(M)
    Y = torch.zeros_like(M)
    L = torch.zeros_like(M)
    mu_k, rank, residual, it, converged = mu, 0, float("inf"), 0, False
    for it in range(1, max_iter + 1):  # noqa: B007 (the count is returned)
        inv = 1.0 / mu_k
        T = M + inv * Y
        L, rank = svt(T - S, inv)
        T -= L
        S = soft_threshold(T, lam * inv)
        R = M - L
        R -= S
        residual = float(torch.linalg.norm(R))
        R *= mu_k
        Y += R
        if residual < thresh:
            converged = True
            break
        if mu_growth > 1.0:
            mu_k = min(mu_k * mu_growth, mu_cap)
    return L, S, (it, converged, residual, rank, mu_k, 0)


def _pcp_tall(M, lam, mu, thresh, max_iter, mu_growth, mu_cap):
    """The same iteration as `_pcp_dense` for a tall M (m >= 4n), in one fused sweep per iteration.

    Iteration k needs the n x n Gram matrix of A_k = (M + Y_k/mu_k) - S_k before it can form L_k. Each
    row chunk of the sweep computes L, S, the residual and Y of iteration k in cache, then (mu_{k+1} does
    not depend on the data) A_{k+1} of the same chunk and its contribution to the next Gram matrix, so M,
    S and Y are read once and S, Y written once per iteration. A_k is recomputed from M, S, Y (which the
    sweep reads anyway) instead of being stored. Every entry goes through the same floating-point
    operations as in the dense loop. S and Y are double-buffered, so the last iteration's inputs survive
    and its L is recomputed once at the end instead of being stored every iteration. Off the CPU the sweep is
    a single chunk (`CHUNK_BYTES`).
    """
    m, n = M.shape
    rows = max(1, min(m, CHUNK_BYTES // (M.element_size() * n))) if M.device.type == "cpu" else m
    bounds = [(a, min(a + rows, m)) for a in range(0, m, rows)]
    S, S_next = torch.zeros_like(M), torch.empty_like(M)
    Y, Y_next = torch.zeros_like(M), torch.empty_like(M)
    T_buf, A_buf, C_buf, R_buf = (M.new_empty((rows, n)) for _ in range(4))
    mu_k, rank, residual, it, converged, fallbacks = mu, 0, float("inf"), 0, False, 0
    left = right = None

    def chunk_a(a: int, b: int, inv: float, S: torch.Tensor, Y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = torch.mul(Y[a:b], inv, out=T_buf[: b - a])
        T += M[a:b]  # = M + inv * Y, the same rounding
        return T, torch.sub(T, S[a:b], out=A_buf[: b - a])

    inv = 1.0 / mu_k
    gram = M.new_zeros((n, n))
    for a, b in bounds:  # the first iteration's Gram matrix (S = Y = 0: A = M)
        A = chunk_a(a, b, inv, S, Y)[1]
        gram += A.T @ A
    for it in range(1, max_iter + 1):  # noqa: B007 (the count is returned)
        inv = 1.0 / mu_k
        s, v = _gram_factors(gram)
        s_host = s.tolist()
        if not _gram_accurate(s_host, inv):
            fallbacks += 1
            A_full = torch.empty_like(M)
            for a, b in bounds:
                A_full[a:b] = chunk_a(a, b, inv, S, Y)[1]
            s, v = _qr_factors(A_full)
            s_host = s.tolist()
            del A_full
        rank = _kept(s_host, inv)
        left, right = _shrink_map(s, v, inv, rank)
        shrink = lam * inv
        mu_next = min(mu_k * mu_growth, mu_cap) if mu_growth > 1.0 else mu_k
        inv_next = 1.0 / mu_next
        gram = M.new_zeros((n, n))
        sq = M.new_zeros(())
        for a, b in bounds:
            T, A = chunk_a(a, b, inv, S, Y)
            R = R_buf[: b - a]
            if rank:
                L = _apply(A, left, right)
                T -= L
                torch.sub(M[a:b], L, out=R)
            else:
                R.copy_(M[a:b])
            C = torch.clamp(T, -shrink, shrink, out=C_buf[: b - a])
            S_c = torch.sub(T, C, out=S_next[a:b])  # soft_threshold(T, shrink)
            R -= S_c
            flat = R.reshape(-1)
            sq += flat @ flat
            R *= mu_k
            torch.add(Y[a:b], R, out=Y_next[a:b])
            A = chunk_a(a, b, inv_next, S_next, Y_next)[1]  # the next iteration's A, still in cache
            gram += A.T @ A
        residual = math.sqrt(float(sq))
        S, S_next = S_next, S
        Y, Y_next = Y_next, Y
        if residual < thresh:
            converged = True
            break
        mu_k = mu_next
    # The last iteration's L from its inputs (now in S_next, Y_next), with the same chunks and operations.
    L = torch.zeros_like(M)
    if rank:
        for a, b in bounds:
            L[a:b] = _apply(chunk_a(a, b, inv, S_next, Y_next)[1], left, right)
    return L, S, (it, converged, residual, rank, mu_k, fallbacks)

"""Low-dimensional subspaces of public updates for PFA (spec heterogeneous_dp §4.2).

A `Subspace` is an affine subspace μ + span(V) with V (p × k) orthonormal; its projection is
P(x) = μ + V Vᵀ (x − μ). `fit_subspace` builds one from the |S_pub| × p matrix U of public updates
in one of the four modes of §4.2, with an exact (thin SVD) or a Lanczos solver. Everything is float64, on the
device of U (issue 67); random draws come from the generator passed in, on its device, and are moved to U's (m or
p × k numbers), so a CPU generator gives the same subspace on every device.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

SUBSPACES = ("centered", "second-moment", "mean-outer", "random")
SOLVERS = ("exact", "lanczos")

RANK_TOL = 1e-12  # singular values <= RANK_TOL * s_max are dropped (spec §4.2, exact solver)
GRAM_MIN_ASPECT = 4  # the exact solver works on the m × m problem when p >= 4 m
GRAM_MIN_RATIO = 1e-4  # ... through the Gram matrix when the k wanted singular values are >= 1e-4 s_max
BREAKDOWN_TOL = 1e-10  # Lanczos stops when beta_j <= BREAKDOWN_TOL * beta_1


@dataclass(frozen=True)
class Subspace:
    """The affine subspace μ + span(V); V is p × k with orthonormal columns (k may be 0)."""

    mu: torch.Tensor  # float64 [p]
    V: torch.Tensor  # float64 [p, k]

    @property
    def k(self) -> int:
        return self.V.shape[1]

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """μ + V Vᵀ (x − μ) for x of shape [p] or [n, p] (float64)."""
        c = x - self.mu
        return self.mu + (c @ self.V) @ self.V.T

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        """Vᵀ (x − μ): the k coordinates of x in the subspace (what a PFA+ client would upload)."""
        return (x - self.mu) @ self.V


def _truncate_warn(k: int, available: int, what: str, stacklevel: int = 3) -> int:
    if k > available:
        warnings.warn(f"PFA: k={k} truncated to {available} ({what})", RuntimeWarning, stacklevel=stacklevel)
        return available
    return k


def top_right_singular_exact(A: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k right singular vectors of A (m × p, float64) as a p × k' matrix, k' <= numerical rank.

    A wide A (p >= 4m: public clients × parameters) is solved through an m × m problem, never a p × p one
    and never the p-column SVD: first the Gram matrix A Aᵀ (v_i = Aᵀu_i / s_i, then one thin QR makes V
    orthonormal to machine precision), used when the k singular values wanted are all >= 1e-4 s_max, so
    that squaring the condition number costs at most ~1e4 eps (and they are certainly above the rank
    cutoff); otherwise the QR route, A = (QR)ᵀ and the SVD of the m × m R, which resolves singular values
    down to ~eps s_max like a dense SVD and applies the 1e-12 rank cutoff. Other shapes take the thin SVD.
    Singular vectors are defined up to sign (and, for repeated singular values, rotation); the projection
    V Vᵀ is what PFA uses.
    """
    if A.numel() == 0:
        return A.new_zeros((A.shape[1], 0))
    m, p = A.shape
    if p >= GRAM_MIN_ASPECT * m:
        V = _top_right_gram(A, k)
        return V if V is not None else _top_right_qr(A, k)
    _, s, Vh = torch.linalg.svd(A, full_matrices=False)
    rank = int((s > RANK_TOL * s[0]).sum()) if s.numel() and s[0] > 0 else 0
    k = _truncate_warn(k, rank, "numerical rank of the public updates")
    return Vh[:k].T.contiguous()


def _top_right_gram(A: torch.Tensor, k: int) -> torch.Tensor | None:
    """V from the eigendecomposition of A Aᵀ, or None when the Gram matrix cannot resolve the top k."""
    evals, W = torch.linalg.eigh(A @ A.T)
    s = evals.flip(0).clamp_min(0.0).sqrt()
    if not s[0] > 0 or k > A.shape[0] or not bool(s[k - 1] >= GRAM_MIN_RATIO * s[0]):
        return None
    V = A.T @ (W.flip(1)[:, :k] / s[:k])
    Q, R = torch.linalg.qr(V)  # V is orthonormal to ~eps (s_max/s_k)^2: one QR pass makes VᵀV = I
    return Q * _signs(R)


def _signs(R: torch.Tensor) -> torch.Tensor:
    """sign(diag R), with 1 where the diagonal is 0 (makes a QR factor's columns unique), on R's device."""
    d = torch.diagonal(R)
    return torch.where(d != 0, torch.sign(d), torch.ones((), dtype=d.dtype, device=d.device))


def _top_right_qr(A: torch.Tensor, k: int) -> torch.Tensor:
    """V from the QR of Aᵀ (p × m) and the SVD of the m × m factor: A = RᵀQᵀ = U S (Q Vhᵀ)ᵀ."""
    Q, R = torch.linalg.qr(A.T)
    _, s, Vh = torch.linalg.svd(R.T)
    rank = int((s > RANK_TOL * s[0]).sum()) if s.numel() and s[0] > 0 else 0
    k = _truncate_warn(k, rank, "numerical rank of the public updates", stacklevel=4)
    return (Q @ Vh[:k].T).contiguous()


def top_right_singular_lanczos(A: torch.Tensor, k: int, iters: int, generator: torch.Generator) -> torch.Tensor:
    """Top-k right singular vectors of A (m × p) by Lanczos on v ↦ Aᵀ(A v) (p × p, i.e. (Aᵀ)(Aᵀ)ᵀ).

    Starts from a random unit vector Aᵀr/‖Aᵀr‖ (r drawn from `generator`), fully reorthogonalises every step, stops
    on breakdown (β_j <= 1e-10 · β_1) or after `iters` steps, and returns the top-k Ritz vectors whose
    Ritz values exceed (1e-12)² of the largest (squared singular values, matching the exact solver).
    """
    p = A.shape[1]
    if A.numel() == 0 or p == 0:
        return A.new_zeros((p, 0))
    n_steps = min(iters, p)
    # The Krylov space of AᵀA from a start vector in A's row space has dimension <= rank(A) <= m, so
    # rows are allocated for m + 2 vectors and grown only if the iteration runs on (not iters × p floats).
    Q = A.new_zeros((min(n_steps, A.shape[0] + 1) + 1, p))
    alphas: list[torch.Tensor] = []  # 0-d tensors on A's device: only beta is read on the host (breakdown test)
    betas: list[float] = []
    # a random unit vector in the row space of A (Aᵀr, r ~ N(0, I_m) from the round seed): the Krylov space
    # then never picks up null-space directions, which would otherwise give spurious Ritz values ~1e-16·s_max²
    q = A.T @ _draw((A.shape[0],), generator, A.device)
    if q.norm() == 0:
        return A.new_zeros((p, 0))
    Q[0] = q / q.norm()
    beta1 = None
    m = 0
    for j in range(n_steps):
        w = A.T @ (A @ Q[j])
        alpha = Q[j] @ w
        # full reorthogonalisation (twice is enough) against every Lanczos vector so far
        for _ in range(2):
            w = w - Q[: j + 1].T @ (Q[: j + 1] @ w)
        alphas.append(alpha)
        m = j + 1
        beta = float(w.norm())
        if beta1 is None:
            # scale for the breakdown test; max with |α_1| guards a start vector that is an eigenvector
            beta1 = max(beta, abs(float(alpha)))
        if beta <= BREAKDOWN_TOL * beta1 or j == n_steps - 1:
            break
        betas.append(beta)
        if j + 1 >= Q.shape[0]:
            Q = torch.cat([Q, Q.new_zeros((min(Q.shape[0], n_steps + 1 - Q.shape[0]), p))])
        Q[j + 1] = w / beta
    # the m x m tridiagonal problem on the host (m <= rank + 1 numbers; LAPACK, whatever A's device)
    T = torch.diag(torch.stack(alphas).cpu())
    if m > 1:
        off = torch.tensor(betas[: m - 1], dtype=torch.float64)
        T = T + torch.diag(off, 1) + torch.diag(off, -1)
    theta, S = torch.linalg.eigh(T)
    order = torch.argsort(theta, descending=True)
    theta, S = theta[order], S[:, order]
    top = float(theta[0]) if theta.numel() else 0.0
    rank = int((theta > RANK_TOL**2 * top).sum()) if top > 0 else 0
    k = _truncate_warn(k, rank, "numerical rank of the public updates (Lanczos)")
    V = Q[:m].T @ S[:, :k].to(Q.device)
    # Ritz vectors are orthonormal up to rounding; one QR pass makes VᵀV = I to machine precision
    if k:
        V, R = torch.linalg.qr(V)
        V = V * _signs(R)
    return V


def _draw(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """Standard normal float64 numbers from `generator` on its own device, then on `device`."""
    return torch.randn(shape, generator=generator, dtype=torch.float64, device=generator.device).to(device)


def fit_subspace(
    U: torch.Tensor,
    k: int,
    mode: str = "centered",
    solver: str = "exact",
    *,
    d_pub: torch.Tensor | None = None,
    lanczos_iters: int = 256,
    generator: torch.Generator | None = None,
    random_center: bool = False,
) -> Subspace:
    """The PFA subspace of the public updates U (m × p, float64) in mode `mode` (spec §4.2 table).

    - `centered`: μ = row mean of U if m > 1 else 0; V = top-k right singular vectors of U − 1μᵀ.
    - `second-moment`: μ = 0; V = top-k right singular vectors of U.
    - `mean-outer`: μ = 0; V = d_pub/‖d_pub‖ (rank 1; needs `d_pub`, k must be 1).
    - `random`: μ = 0 (or the centred μ with `random_center`); V = Q of the QR of a p × min(k, p)
      standard Gaussian drawn from `generator`.
    k is capped at p and at the numerical rank (a RuntimeWarning says so).
    """
    if mode not in SUBSPACES:
        raise ValueError(f"subspace must be one of {SUBSPACES}, got {mode!r}")
    if solver not in SOLVERS:
        raise ValueError(f"svd_solver must be one of {SOLVERS}, got {solver!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if U.dim() != 2 or U.shape[0] < 1:
        raise ValueError(f"U must be a non-empty m × p matrix, got shape {tuple(U.shape)}")
    U = U.to(torch.float64)
    m, p = U.shape
    zero = U.new_zeros(p)
    centred_mu = U.mean(0) if m > 1 else zero
    if mode == "mean-outer":
        if k != 1:
            raise ValueError("subspace 'mean-outer' is rank 1 (Algorithm 3 literal); k > 1 is an error")
        if d_pub is None:
            raise ValueError("subspace 'mean-outer' needs d_pub")
        d = d_pub.to(torch.float64).reshape(p)
        norm = d.norm()
        V = (d / norm).unsqueeze(1) if norm > 0 else U.new_zeros((p, 0))
        return Subspace(zero, V)
    if mode == "random":
        if generator is None:
            raise ValueError("subspace 'random' needs a generator (the round seed)")
        kk = _truncate_warn(k, p, "tensor size")
        G = _draw((p, kk), generator, U.device)
        V, _ = torch.linalg.qr(G)
        return Subspace(centred_mu if random_center else zero, V)
    mu = centred_mu if mode == "centered" else zero
    A = U - mu
    if solver == "exact":
        V = top_right_singular_exact(A, min(k, p))
    else:
        if generator is None:
            raise ValueError("the Lanczos solver needs a generator (the round seed) for its start vector")
        V = top_right_singular_lanczos(A, min(k, p), lanczos_iters, generator)
    return Subspace(mu, V)


def principal_angles(V1: torch.Tensor, V2: torch.Tensor) -> torch.Tensor:
    """Principal angles (radians, ascending) between span(V1) and span(V2), both orthonormal p × k.

    Computed from sines (‖(I − V1V1ᵀ)V2‖ singular values), accurate for small angles.
    """
    R = V2 - V1 @ (V1.T @ V2)
    s = torch.linalg.svdvals(R).clamp(max=1.0)
    return torch.sort(torch.arcsin(s)).values

"""The three GDP bounds on Noisy-FedAvg / Noisy-FedProx, for every T at once (spec fdp_accounting.md §3–§4).

Inputs are the normalised sequences γ̃_t = Δ_t/s_t (shift over the noise the adversary cannot remove) and
ρ̃_t = ρ_t·s_{t−1}/s_t. Each function returns μ for T = 1..len(γ̃).

- `composition_mu` (rigorous, any view): μ(T) = √Σ_{t<T} γ̃_t².
- `shifted_mu` (rigorous with λ ∈ [0, 1]; final model under the aggregate view): the bounded least-squares value
  F*(T) of §4.2, computed exactly as the greatest convex minorant (pool-adjacent-violators in log space).
  `shifted_mu_nnls` is the dense bounded-least-squares reference for one T (tests).
- `h0_mu`: the paper's Cauchy–Schwarz value H_0 (λ unconstrained), which can be smaller than any valid bound.
- `paper_claimed_mu`: the paper's printed closed forms. NOT guarantees (§4.4).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import lsq_linear

from dpfl.privacy.fdp_sensitivity import c_min, z_min

__all__ = ["PAPER_VARIANTS", "composition_mu", "h0_mu", "paper_claimed_mu", "shifted_mu", "shifted_mu_nnls"]

PAPER_VARIANTS = ("printed", "eta-consistent", "h0")


def _as_arrays(gamma: np.ndarray, rho: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    g = np.asarray(gamma, dtype=np.float64)
    if g.ndim != 1 or g.size == 0 or np.any(g < 0) or not np.all(np.isfinite(g)):
        raise ValueError("γ̃ must be a non-empty 1-d array of finite values >= 0")
    if rho is None:
        return g, None
    r = np.asarray(rho, dtype=np.float64)
    if r.shape != g.shape or np.any(r <= 0) or not np.all(np.isfinite(r)):
        raise ValueError("ρ̃ must be finite, > 0 and as long as γ̃")
    return g, r


def composition_mu(gamma: np.ndarray) -> np.ndarray:
    """μ_comp(T) for T = 1..len(γ̃): each round is a Gaussian mechanism given the whole history."""
    g, _ = _as_arrays(gamma)
    return np.sqrt(np.cumsum(g * g))


def _log_increments(g: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log ΔA_t, log ΔB_t) = (log γ̃_t − q_{t+1}, −2 q_{t+1}) with q_s = Σ_{j<s} ln ρ̃_j (§3, overflow-safe)."""
    q_next = np.cumsum(np.log(r))
    with np.errstate(divide="ignore"):
        log_a = np.log(g) - q_next
    return log_a, -2 * q_next


def h0_mu(gamma: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """μ_H0(T) = √(A_T²/B_T): the paper's value with λ unconstrained (NOT a guarantee when it beats `shifted_mu`)."""
    g, r = _as_arrays(gamma, rho)
    log_a, log_b = _log_increments(g, r)
    la, lb = np.logaddexp.accumulate(log_a), np.logaddexp.accumulate(log_b)
    return np.exp(la - lb / 2)


def shifted_mu(gamma: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """μ_shift(T) = √F*(T) for every T, by pool-adjacent-violators on the points (B_s, A_s) (exact, O(T) amortised).

    Segments of the stack have increasing slopes ΔA/ΔB; a new elementary segment whose slope is not above the top's
    is merged into it. F*(t+1) is the sum of (ΔA)²/ΔB over the stack after step t.
    """
    g, r = _as_arrays(gamma, rho)
    log_a, log_b = _log_increments(g, r)
    stack_a: list[float] = []
    stack_b: list[float] = []
    stack_cost: list[float] = []
    total = 0.0
    out = np.empty(g.size)
    for t in range(g.size):
        la, lb = float(log_a[t]), float(log_b[t])
        while stack_a and stack_a[-1] - stack_b[-1] >= la - lb:
            la, lb = np.logaddexp(la, stack_a.pop()), np.logaddexp(lb, stack_b.pop())
            total -= stack_cost.pop()
        cost = math.exp(2 * la - lb) if la > -math.inf else 0.0
        stack_a.append(la)
        stack_b.append(lb)
        stack_cost.append(cost)
        total += cost
        out[t] = math.sqrt(max(total, 0.0))
    return out


def shifted_mu_nnls(gamma: np.ndarray, rho: np.ndarray) -> float:
    """μ_shift at T = len(γ̃) from the dense bounded least squares min_{a ≥ 0} ‖D a + γ̃‖² (exact BVLS; T ≤ 2000)."""
    g, r = _as_arrays(gamma, rho)
    T = g.size
    if T == 1:
        return float(g[0])
    D = np.zeros((T, T - 1))
    for s in range(T):
        if s >= 1:
            D[s, s - 1] = r[s]
        if s <= T - 2:
            D[s, s] = -1.0
    sol = lsq_linear(D, -g, bounds=(0, np.inf), method="bvls", tol=1e-15)
    resid = D @ sol.x + g
    return float(math.sqrt(resid @ resid))


def _tanh_ratio(T: np.ndarray, ell: float) -> np.ndarray:
    """coth(ℓ/2)·tanh(Tℓ/2) = ((ρ+1)/(ρ−1))·((ρ^T−1)/(ρ^T+1)) with ρ = e^ℓ; T·(1 − (T²−1)ℓ²/12) for ℓ < 1e-8."""
    if ell < 1e-8:
        return T * (1 - (T * T - 1) * ell * ell / 12)
    return np.tanh(T * ell / 2) / math.tanh(ell / 2)


def paper_claimed_mu(algo: str, schedule: str, T: np.ndarray, *, eta: float, K: int, V: float, m: int, sigma: float,
                     L: float, alpha: float | None = None, variant: str = "printed", c: float | None = None,
                     z: float | None = None) -> np.ndarray:
    """The paper's closed forms (a)–(d) and FedProx at rounds `T`, in its aggregate final-model view (noise σ/√m).

    NOT a guarantee: see spec §4.4. `variant` "printed" evaluates the theorems as stated; "eta-consistent" restores
    the η missing from the printed cyclic and continuous prefactors. (Variant "h0" is `h0_mu` on exact sequences.)
    """
    if variant not in ("printed", "eta-consistent"):
        raise ValueError(f"variant must be 'printed' or 'eta-consistent' here, got {variant!r}")
    T = np.asarray(T, dtype=np.float64)
    scale = 2 * V / (math.sqrt(m) * sigma)
    if algo == "fedprox":
        if alpha is None or not alpha > L:
            raise ValueError("the paper's FedProx bound needs alpha > L")
        ell = math.log(alpha / (alpha - L))
        return scale / alpha * np.sqrt((2 * alpha - L) / L * np.tanh(T * ell / 2))
    eta_factor = eta if variant == "eta-consistent" else 1.0
    if schedule == "constant":
        return scale * eta * K * np.sqrt(_tanh_ratio(T, K * math.log1p(eta * L)))
    if schedule == "cyclic":
        c = c_min(K) if c is None else c
        return scale * c * eta_factor * math.log(K + 1) * np.sqrt(_tanh_ratio(T, c * eta * L * math.log(K + 1)))
    if schedule == "stagewise":
        return scale * eta * K * np.sqrt(2 - 1 / T)
    if schedule == "continuous":
        z = z_min(K) if z is None else z
        return scale * z * eta_factor * np.sqrt(2 - 1 / T)
    raise ValueError(f"unknown schedule {schedule!r}")

"""Per-round sensitivities of Noisy-FedAvg / Noisy-FedProx (spec fdp_accounting.md §3).

One averaged round φ(w) = (1/m)Σ_i w_{i,K,t}(w) has a data sensitivity γ_t (same start, neighbouring data: one record
of one client replaced, its clipped gradients differing by at most 2V at every local step) and a model sensitivity ρ_t
(same data, different starts; needs the smoothness constant L, an assumption for neural networks).

`mode="exact"` uses the per-step products; `mode="paper"` the paper's surrogates (its sensitivity table), with the
smallest c and z for which they upper-bound the exact forms (c_min, z_min). Step sizes come as an array η[T, K].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["ALGORITHMS", "SCHEDULES", "Sensitivities", "c_min", "harmonic", "sensitivities", "step_sizes", "z_min"]

ALGORITHMS = ("fedavg", "fedprox")
SCHEDULES = ("constant", "cyclic", "stagewise", "continuous")


def step_sizes(schedule: str, eta: float, T: int, K: int) -> np.ndarray:
    """η[t, k]: constant η; cyclic η/(k+1); stage-wise η/(t+1); continuous η/(tK+k+1)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if not eta > 0 or T < 1 or K < 1:
        raise ValueError(f"need η > 0, T >= 1, K >= 1; got η={eta!r}, T={T!r}, K={K!r}")
    t = np.arange(T, dtype=np.float64)[:, None]
    k = np.arange(K, dtype=np.float64)[None, :]
    if schedule == "constant":
        return np.full((T, K), float(eta))
    if schedule == "cyclic":
        return np.broadcast_to(eta / (k + 1), (T, K)).copy()
    if schedule == "stagewise":
        return np.broadcast_to(eta / (t + 1), (T, K)).copy()
    return eta / (t * K + k + 1)


def harmonic(n: int) -> float:
    """H_n = Σ_{i ≤ n} 1/i."""
    return float(np.sum(1.0 / np.arange(1, n + 1))) if n > 0 else 0.0


def c_min(K: int) -> float:
    """The smallest c for which the paper's cyclic surrogates bound the exact forms: H_K / ln(K+1)."""
    return harmonic(K) / math.log(K + 1)


def z_min(K: int) -> float:
    """The smallest z for the continuous surrogates: H_K / ln 2 (the supremum over t is at t = 0)."""
    return harmonic(K) / math.log(2)


@dataclass(frozen=True)
class Sensitivities:
    """γ[T] and ρ[T] (None without L) of one run's schedule; `m` is the number of uploads averaged per round."""

    algo: str
    mode: str
    gamma: np.ndarray
    rho: np.ndarray | None
    m: int


def _suffix_products(factors: np.ndarray) -> np.ndarray:
    """out[t, k] = Π_{j=k+1}^{K−1} factors[t, j] (1 for k = K−1)."""
    T, K = factors.shape
    out = np.ones((T, K))
    for k in range(K - 2, -1, -1):
        out[:, k] = out[:, k + 1] * factors[:, k + 1]
    return out


def sensitivities(algo: str, eta: np.ndarray, V: float, m: int, *, L: float | None = None, alpha: float | None = None,
                  mode: str = "exact", schedule: str | None = None, c: float | None = None,
                  z: float | None = None) -> Sensitivities:
    """γ_t and ρ_t for every round of the step-size array `eta` [T, K] (spec §3)."""
    eta = np.asarray(eta, dtype=np.float64)
    if eta.ndim != 2 or eta.size == 0 or not np.all(eta > 0):
        raise ValueError("eta must be a [T, K] array of positive step sizes")
    if algo not in ALGORITHMS:
        raise ValueError(f"algo must be one of {', '.join(ALGORITHMS)}, got {algo!r}")
    if not V > 0 or m < 1:
        raise ValueError(f"need V > 0 and m >= 1, got V={V!r}, m={m!r}")
    if L is not None and not L >= 0:
        raise ValueError(f"the smoothness constant L must be >= 0, got {L!r}")
    if algo == "fedprox" and (alpha is None or not alpha >= 0):
        raise ValueError(f"fedprox needs alpha >= 0, got {alpha!r}")
    if mode not in ("exact", "paper"):
        raise ValueError(f"mode must be 'exact' or 'paper', got {mode!r}")
    if mode == "paper":
        return _paper(algo, eta, V, m, L, alpha, schedule, c, z)
    if algo == "fedavg" or alpha == 0:
        gamma = 2 * V / m * eta.sum(axis=1)
        rho = None if L is None else np.prod(1 + eta * L, axis=1)
        return Sensitivities(algo, mode, gamma, rho, m)
    d = np.abs(1 - eta * alpha)
    gamma = 2 * V / m * (eta * _suffix_products(d)).sum(axis=1)
    rho = None
    if L is not None:
        cf = d + eta * L
        rho = np.prod(cf, axis=1) + alpha * (eta * _suffix_products(cf)).sum(axis=1)
    return Sensitivities(algo, mode, gamma, rho, m)


def _paper(algo: str, eta: np.ndarray, V: float, m: int, L: float | None, alpha: float | None,
           schedule: str | None, c: float | None, z: float | None) -> Sensitivities:
    """The paper's surrogates (η-consistent γ); they need the schedule's base rate η = eta[0, 0]."""
    T, K = eta.shape
    base = float(eta[0, 0])
    t = np.arange(T, dtype=np.float64)
    if algo == "fedprox":
        if L is None or not alpha > L:
            raise ValueError("the paper's FedProx surrogates need L and alpha > L")
        return Sensitivities(algo, "paper", np.full(T, 2 * V / (m * alpha)), np.full(T, alpha / (alpha - L)), m)
    if schedule not in SCHEDULES:
        raise ValueError(f"mode='paper' needs the schedule name ({', '.join(SCHEDULES)}), got {schedule!r}")
    if schedule == "constant":
        gamma = np.full(T, 2 * base * V * K / m)
        rho = None if L is None else np.full(T, (1 + base * L) ** K)
    elif schedule == "cyclic":
        c = c_min(K) if c is None else c
        gamma = np.full(T, 2 * c * base * V * math.log(K + 1) / m)
        rho = None if L is None else np.full(T, (1.0 + K) ** (c * base * L))
    elif schedule == "stagewise":
        gamma = 2 * base * V * K / (m * (t + 1))
        rho = None if L is None else (1 + base * L / (t + 1)) ** K
    else:
        z = z_min(K) if z is None else z
        gamma = 2 * z * base * V * np.log((t + 2) / (t + 1)) / m
        rho = None if L is None else ((t + 2) / (t + 1)) ** (z * base * L)
    return Sensitivities(algo, "paper", gamma, rho, m)

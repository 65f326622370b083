"""The analytic Gaussian mechanism's calibration (Balle & Wang, "Improving the Gaussian Mechanism for Differential
Privacy", ICML 2018, arXiv 1805.06530, Theorem 8): the smallest σ with which x + N(0, σ^2) of an ℓ2-sensitivity-Δ
query is (ε, δ)-DP, for any ε > 0 (the classical σ = Δ √(2 ln(1.25/δ)) / ε needs ε < 1 and is loose).

(ε, δ)-DP holds iff Φ(Δ/(2σ) - εσ/Δ) - e^ε Φ(-Δ/(2σ) - εσ/Δ) <= δ; the left side decreases in σ, so bisection
on it finds the smallest σ to within `rtol`, rounded up (never below the exact value).
"""

from __future__ import annotations

import math

from scipy.special import log_ndtr, ndtr

from dpfl.privacy.calibration import MIN_NOISE_MULTIPLIER


def privacy_profile(sigma: float, eps: float, sensitivity: float = 1.0) -> float:
    """δ(ε) of the Gaussian mechanism with noise σ: exact (Theorem 8)."""
    a = sensitivity / (2 * sigma)
    b = eps * sigma / sensitivity
    second = math.exp(eps + log_ndtr(-a - b)) if eps + log_ndtr(-a - b) > -745 else 0.0
    return float(ndtr(a - b)) - second


def analytic_gaussian_sigma(eps: float, delta: float, sensitivity: float = 1.0, rtol: float = 1e-12) -> float:
    """The smallest σ (to rtol, from above) making the Gaussian mechanism (ε, δ)-DP."""
    if not eps > 0 or not 0 < delta < 1 or not sensitivity > 0:
        raise ValueError(f"need ε > 0, 0 < δ < 1 and a positive sensitivity, got {eps}, {delta}, {sensitivity}")
    lo, hi = MIN_NOISE_MULTIPLIER * sensitivity, sensitivity
    if privacy_profile(lo, eps, sensitivity) <= delta:  # the search's floor already suffices: no real protection
        raise ValueError(f"target_epsilon={eps:g} is met by noise_multiplier < {MIN_NOISE_MULTIPLIER} for delta="
                         f"{delta:g}; such a target gives no meaningful protection, lower it")
    while privacy_profile(hi, eps, sensitivity) > delta:
        lo, hi = hi, 2 * hi
    while hi - lo > rtol * hi:
        mid = (lo + hi) / 2
        if privacy_profile(mid, eps, sensitivity) > delta:
            lo = mid
        else:
            hi = mid
    return hi

"""Gaussian differential privacy (Dong, Roth, Su 2022): exact conversions, stable for large μ.

μ-GDP holds iff (ε, δ(ε))-DP holds for every ε ≥ 0 with δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2). The naive formula
is inf·0 = NaN once e^ε overflows (μ = 50, ε ≈ 1462), so δ is evaluated in log space with the normal log-CDF
(spec fdp_accounting.md §2). Pure NumPy/SciPy.
"""

from __future__ import annotations

import math

from scipy.optimize import brentq
from scipy.stats import norm

__all__ = ["gdp_delta", "gdp_eps", "gdp_log_delta", "gdp_mu_for", "gdp_to_rdp", "rdp_classical_eps"]

XTOL = 1e-12


def _check(mu: float) -> float:
    mu = float(mu)
    if not mu >= 0 or math.isinf(mu):
        raise ValueError(f"a GDP parameter μ must be finite and >= 0, got {mu!r}")
    return mu


def gdp_log_delta(eps: float, mu: float) -> float:
    """log δ(ε) of μ-GDP; −inf when δ = 0 (μ = 0, or the two terms cancel exactly)."""
    mu = _check(mu)
    if eps < 0:
        raise ValueError(f"ε must be >= 0, got {eps!r}")
    if mu == 0:
        return -math.inf
    a, b = -eps / mu + mu / 2, -eps / mu - mu / 2
    log_a, log_b = float(norm.logcdf(a)), float(norm.logcdf(b))
    ratio = eps + log_b - log_a  # log of e^ε Φ(b) / Φ(a), < 0 whenever δ > 0
    if ratio >= 0:
        return -math.inf
    return log_a + math.log1p(-math.exp(ratio))


def gdp_delta(eps: float, mu: float) -> float:
    """δ(ε) of μ-GDP (exact)."""
    return math.exp(gdp_log_delta(eps, mu))


def gdp_eps(mu: float, delta: float) -> float:
    """The smallest ε with (ε, δ)-DP for μ-GDP: the root of log δ(ε) = log δ (Brent, xtol 1e-12)."""
    mu = _check(mu)
    if not 0 < delta < 1:
        raise ValueError(f"δ must be in (0, 1), got {delta!r}")
    if mu == 0 or 2 * norm.cdf(mu / 2) - 1 <= delta:
        return 0.0
    target = math.log(delta)

    def gap(eps: float) -> float:
        return gdp_log_delta(eps, mu) - target

    hi = max(1.0, mu * mu)
    while gap(hi) > 0:
        hi *= 2
    return float(brentq(gap, 0.0, hi, xtol=XTOL, maxiter=500))


def gdp_mu_for(eps: float, delta: float) -> float:
    """The largest μ such that μ-GDP implies (ε, δ)-DP (δ(ε; μ) increases in μ)."""
    if eps < 0 or not 0 < delta < 1:
        raise ValueError(f"need ε >= 0 and δ in (0, 1), got ε={eps!r}, δ={delta!r}")
    target = math.log(delta)

    def gap(mu: float) -> float:
        return gdp_log_delta(eps, mu) - target

    lo, hi = 1e-12, 1.0
    while gap(hi) < 0:
        lo, hi = hi, hi * 2
    return float(brentq(gap, lo, hi, xtol=XTOL, maxiter=500))


def gdp_to_rdp(mu: float, zeta: float) -> float:
    """μ-GDP implies (ζ, ζμ²/2)-RDP for every ζ > 1."""
    if not zeta > 1:
        raise ValueError(f"an RDP order must be > 1, got {zeta!r}")
    return zeta * _check(mu) ** 2 / 2


def rdp_classical_eps(mu: float, delta: float) -> float:
    """min_ζ [ζμ²/2 + log(1/δ)/(ζ−1)] = μ²/2 + μ√(2 log(1/δ)): the classical RDP conversion, for comparison only
    (never smaller than the exact `gdp_eps`)."""
    mu = _check(mu)
    return mu * mu / 2 + mu * math.sqrt(2 * math.log(1 / delta))

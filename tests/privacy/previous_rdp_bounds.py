"""The large-noise bounds of ``dpfl.privacy.rdp_curves`` as written before they were vectorised (commit 04a1c4d),
kept verbatim as a reference: ``test_rdp_vectorised`` checks the vectorised code against them where the curves
do not come from dp_accounting's formulas (above the switch noise). ``test_accountant_extremes`` validated
these against exact arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special

STABLE_MARGIN = 1e-9
MAX_STABLE_ORDER = 100_000
MAX_STABLE_WOR_ORDER = 2048
_TINY = float(np.nextafter(0.0, 1.0))
_DX = 0.05


def _round_up(values: np.ndarray) -> np.ndarray:
    """Relative margin for rounding, plus a few subnormal steps (absorbed by any normal value)."""
    return np.maximum(values, 0.0) * (1.0 + STABLE_MARGIN) + 8 * _TINY


def _log_expm1(x: np.ndarray, log_x: np.ndarray) -> np.ndarray:
    """log(expm1(x)) for x > 0 given both x and log x (x may have underflowed to 0)."""
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        return np.where(
            x > 1.0,
            x + np.log1p(-np.exp(-x)),
            np.where(x > 1e-5, np.log(np.expm1(x)), log_x + np.log1p(x / 2.0 + x * x / 6.0)),
        )


def _gaussian_bound(orders: Sequence[float], z: float) -> np.ndarray:
    """``alpha / (2 z^2)``, without overflow: the RDP of the unsampled Gaussian, a bound for every leaf."""
    with np.errstate(over="ignore", under="ignore"):
        return _round_up(np.asarray(orders, dtype=np.float64) * (0.5 / z) / z)


def _log_a_integer(q: float, z: float, order: int) -> float:
    """log A_order of the Poisson-subsampled Gaussian (Mironov et al. 2019), free of cancellation.

    A_k = sum_i Binomial(k, q)[i] exp(i (i - 1) / (2 z^2)) = 1 + sum_{i >= 2} Binomial(k, q)[i] expm1(...),
    summed in log space; returns log1p of the (non-negative) sum.
    """
    i = np.arange(2, order + 1, dtype=np.float64)
    log_pmf = (
        special.gammaln(order + 1.0) - special.gammaln(i + 1.0) - special.gammaln(order - i + 1.0)
        + i * math.log(q) + (order - i) * math.log1p(-q)
    )
    log_x = np.log(i * (i - 1.0) / 2.0) - 2.0 * math.log(z)  # x = i (i - 1) / (2 z^2), kept in log space
    with np.errstate(under="ignore"):
        x = np.exp(log_x)
    log_s = float(special.logsumexp(log_pmf + _log_expm1(x, log_x)))
    return log_s + math.log1p(math.exp(-log_s)) if log_s > 0.0 else math.log1p(math.exp(log_s))


def _poisson_bound(q: float, z: float, orders: Sequence[float]) -> np.ndarray:
    """Per-order RDP bound of the Poisson-subsampled Gaussian for large z (see the module docstring)."""
    log_a: dict[int, float] = {1: 0.0}

    def at(k: int) -> float:
        if k not in log_a:
            log_a[k] = _log_a_integer(q, z, k)
        return log_a[k]

    gaussian = _gaussian_bound(orders, z)
    out = np.empty(len(orders))
    for j, alpha in enumerate(orders):
        if alpha > MAX_STABLE_ORDER:
            out[j] = gaussian[j]
            continue
        k = math.floor(alpha)
        t = alpha - k
        value = at(k) if t == 0.0 else (1.0 - t) * at(k) + t * at(k + 1)  # chord of the convex log A
        out[j] = value / (alpha - 1.0)
    return np.minimum(_round_up(out), gaussian)


def _log_forward_differences(sigma: float, k_max: int) -> np.ndarray:
    """log of the even forward differences Delta^k f(-1), k = 0, 2, ..., of f(x) = exp(x (x + 1) / (2 sigma^2)).

    dp_accounting forms these by differencing values that all round to ~1 for a large sigma, so they
    cancel to noise. Here, with c = 1 / (2 sigma^2) and Y ~ N(0, 2c), f(x) = exp(-c/4) E[exp((x + 1/2) Y)],
    so Delta^k f(-1) = exp(-c/4) E[exp(-Y/2) (e^Y - 1)^k]: for even k a positive integrand, integrated by the
    trapezoid rule in log space (spectrally accurate for this smooth, Gaussian-tailed integrand).
    Returns an array indexed by k (odd entries unused).
    """
    s = 1.0 / sigma  # Y = s X with X ~ N(0, 1)
    log_s = -math.log(sigma)
    ks = np.arange(0, k_max + 1, 2, dtype=np.float64)
    upper = max(math.sqrt(k_max), k_max * s) + math.sqrt(k_max) + 40.0
    x = np.arange(-(math.sqrt(k_max) + 40.0), upper, _DX)
    sx = s * x
    with np.errstate(divide="ignore", under="ignore", over="ignore", invalid="ignore"):
        mid = np.clip(sx, -50.0, 50.0)
        log_abs_expm1 = np.where(  # log |e^{sx} - 1|, with s x possibly subnormal or large
            np.abs(sx) < 1e-5,
            log_s + np.log(np.abs(x)) + sx / 2.0,
            np.where(sx > 1.0, sx + np.log1p(-np.exp(-np.maximum(sx, 1.0))), np.log(np.abs(np.expm1(mid)))),
        )
        log_integrand = (-sx / 2.0 - x * x / 2.0)[None, :] + ks[:, None] * log_abs_expm1[None, :]
        log_integrand[0] = -x * x / 2.0 - sx / 2.0  # k = 0 (0 * log 0)
    log_c = -math.log(2.0) + 2.0 * log_s
    out = np.full(k_max + 1, -np.inf)
    out[::2] = (special.logsumexp(log_integrand, axis=1) + math.log(_DX / math.sqrt(2.0 * math.pi))
                - math.exp(log_c) / 4.0)
    out[0] = 0.0
    return out


def _wor_log_a_integer(q: float, sigma: float, order: int, log_deltas: np.ndarray) -> float:
    """dp_accounting's without-replacement bound (Wang, Balle, Kasiviswanathan 2019, Thm 27) at an integer
    order, every term in log space: the same expression as ``_compute_rdp_sample_wor_gaussian_int``'s exact
    branch (also used above its order 256, where dp_accounting switches to the looser Stirling branch)."""
    log_c = -math.log(2.0) - 2.0 * math.log(sigma)
    c = math.exp(log_c)
    log_f2 = math.log(2.0) + log_c  # func(2) = 2 c
    f2 = math.exp(log_f2)
    log_f2m1 = float(_log_expm1(np.array(f2), np.array(log_f2)))
    i = np.arange(2, order + 1, dtype=np.float64)
    log_comb = special.gammaln(order + 1.0) - special.gammaln(i + 1.0) - special.gammaln(order - i + 1.0)
    lo = log_deltas[(2 * np.floor(i / 2.0)).astype(int)]
    hi = log_deltas[(2 * np.ceil(i / 2.0)).astype(int)]
    cgf = c * (i - 1.0) * i  # cgf(i - 1)
    s = np.minimum(math.log(4.0) + 0.5 * (lo + hi), math.log(2.0) + cgf)
    s[0] = min(math.log(4.0) + log_f2m1, f2 + math.log(2.0))  # i = 2
    log_s = float(special.logsumexp(s + i * math.log(q) + log_comb))
    return log_s + math.log1p(math.exp(-log_s)) if log_s > 0.0 else math.log1p(math.exp(log_s))


def _wor_bound(q: float, sigma: float, orders: Sequence[float]) -> np.ndarray:
    """Per-order without-replacement RDP bound for large sigma (integer orders as dp_accounting, fractional
    ones by its own interpolation, Corollary 10 of WBK19); the unsampled Gaussian above MAX_STABLE_WOR_ORDER."""
    gaussian = _gaussian_bound(orders, sigma)
    top = max((math.ceil(a) for a in orders if a <= MAX_STABLE_WOR_ORDER), default=1)
    log_deltas = _log_forward_differences(sigma, top + 1 + (top + 1) % 2)
    log_a: dict[int, float] = {1: 0.0}

    def at(k: int) -> float:
        if k not in log_a:
            log_a[k] = _wor_log_a_integer(q, sigma, k, log_deltas)
        return log_a[k]

    out = np.empty(len(orders))
    for j, alpha in enumerate(orders):
        if alpha > MAX_STABLE_WOR_ORDER:
            out[j] = gaussian[j]
            continue
        k = math.floor(alpha)
        t = alpha - k
        out[j] = (at(k) if t == 0.0 else (1.0 - t) * at(k) + t * at(k + 1)) / (alpha - 1.0)
    return np.minimum(_round_up(out), gaussian)


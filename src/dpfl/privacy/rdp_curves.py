"""Cached per-step RDP curves, so composing many identical events is ``count * curve``.

A federated run composes the same few mechanisms thousands of times (every step of every round of
every client). dp_accounting's ``RdpAccountant`` recomputes the subsampled-Gaussian RDP series on each
``compose``; here each *leaf* mechanism's curve (one value per order) is computed once by that
accountant and reused. ``SelfComposedDpEvent`` multiplies and ``ComposedDpEvent`` adds, exactly as
``RdpAccountant`` does, so the result equals ``RdpAccountant(orders).compose(event).rdp`` (checked in
the tests).

Leaves are keyed by ``(kind, q, z, population, sample_size)`` as carried by the event (for fixed-size
sampling z is the event's multiplier, i.e. already halved), plus the orders and the relation.

Numerical regimes of the Gaussian-family leaves
-----------------------------------------------
dp_accounting's formulas are exact in the range DP-SGD uses, but not over the whole float range: for a
tiny z, ``sigma**2`` underflows (ZeroDivisionError, or NaN that ``compute_epsilon`` turns into epsilon = 0);
for a huge z, ``sigma**2`` overflows (OverflowError), the without-replacement bound takes ``log(0)``
(ValueError), and the Poisson series cancels (``A_alpha`` is ``1 + tiny`` summed in log space), so its
RDP comes out too small by a relative ``~3e-16 z^2 / q``, then negative (which ``compute_epsilon`` also
turns into epsilon = 0). Every value returned here is therefore an upper bound computed as follows:

* ``z < Z_NO_PRIVACY`` (1e-100): +inf at every order. Always a valid bound; the true RDP there exceeds
  ~1e199 (alpha - 1) at order alpha for any sampling rate, so nothing meaningful is lost.
* ``Z_NO_PRIVACY <= z <= z_switch``: dp_accounting, unchanged (every value in the range the tests
  compare against dp_accounting and Opacus comes from here). A NaN or negative order (never seen in this
  range) is replaced by the unsampled Gaussian bound ``alpha / (2 z^2)``.
* ``z > z_switch``: ``min(curve(z_switch), B(z))`` per order. ``curve(z_switch)`` is valid for every
  larger z because adding independent Gaussian noise is post-processing (RDP never increases with z), and
  it makes the curve continuous and non-increasing across the switch. ``B`` is dp_accounting's own bound
  evaluated so that it stays accurate for large z, capped by the unsampled Gaussian ``alpha / (2 z^2)``
  (sampling only amplifies privacy; for plain Gaussians that is ``B`` itself):
  - Poisson: the same ``A_alpha`` as dp_accounting, written as
    ``log1p(sum_{i>=2} Binomial(alpha, q)[i] * expm1(i (i - 1) / (2 z^2)))`` (non-negative terms, so no
    cancellation) at integer orders; at a fractional order the chord between its two integer neighbours
    (``log A_alpha`` is convex in alpha and ``log A_1 = 0``, so the chord lies above it).
  - Fixed size: Wang-Balle-Kasiviswanathan's Theorem 27 exactly as dp_accounting's exact branch writes it,
    but with its forward differences of ``exp(x (x + 1) / (2 z^2))`` computed as positive Gaussian
    integrals (``_log_forward_differences``) instead of by differencing numbers that all round to 1 (in
    dp_accounting that cancellation makes the bound *rise* with z from z ~ 8 on); fractional orders by its
    interpolation (Corollary 10).
  ``B`` carries a relative margin of 1e-9 against rounding and is never below the smallest positive float.
  ``z_switch`` (the event's multiplier) is 1e150 for plain Gaussians (exact formula until ``z**2``
  overflows), 4 for fixed-size sampling (nominal z = 8: dp_accounting's bound is still monotone and
  agrees with ``B`` to 1e-9), and ``1e3 sqrt(q)`` for Poisson sampling (dp_accounting's relative error ~3e-10).

Hence epsilon is +inf as z -> 0, tends to 0 (or to the conversion's floor for a tiny delta) as z -> inf,
never raises on a finite z >= 0, and is non-increasing in z across the float range.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
from collections.abc import Iterator, Sequence

import dp_accounting as dpa
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy import special

from dpfl.privacy.events import neighboring_relation
from dpfl.privacy.orders import normalize_orders

__all__ = ["RDP_CURVES", "Z_NO_PRIVACY", "RdpCurveCache", "leaf_key", "rdp_curve", "switch_noise"]

Z_NO_PRIVACY = 1e-100  # below: +inf RDP (see the module docstring)
Z_SWITCH_GAUSSIAN = 1e150  # dp_accounting's alpha / (2 z**2) until z**2 overflows (~1.3e154)
Z_SWITCH_FIXED = 4.0  # dp_accounting's without-replacement bound: its forward differences cancel above ~7
POISSON_SWITCH_SCALE = 1e3  # dp_accounting's Poisson series up to z = 1e3 sqrt(q): relative error ~3e-10
STABLE_MARGIN = 1e-9  # relative margin on the large-z bounds, against rounding
MAX_STABLE_ORDER = 100_000  # above: the Poisson large-z bound uses the unsampled Gaussian (a finite sum per order)
MAX_STABLE_WOR_ORDER = 2048  # above: the fixed-size large-z bound uses the unsampled Gaussian (quadrature cost)
_TINY = float(np.nextafter(0.0, 1.0))
_DX = 0.05  # trapezoid step for the forward differences: the integrand's peaks have width ~1, error ~exp(-8000)

_NEIGHBOR_REL = {
    "add_remove": dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": dpa.NeighboringRelation.REPLACE_ONE,
}


@contextlib.contextmanager
def _quiet_non_convergence() -> Iterator[None]:
    """Silence absl warnings while dp_accounting computes a curve.

    dp_accounting logs one warning per fractional order whose series does not converge (and then
    excludes that order: a valid, merely unused bound). Calibration would print thousands of them, and
    emitting them costs more than the computation. Raising the logger level (not filtering records)
    skips building the records; it briefly affects absl warnings from other threads too.
    """
    logger = logging.getLogger("absl")
    previous = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


def leaf_key(event: dpa.DpEvent) -> tuple:
    """``(kind, q, z, population, sample_size)`` for Gaussian-family leaves; ``("other", repr)`` else."""
    if isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        return ("poisson", float(event.sampling_probability), float(event.event.noise_multiplier), None, None)
    if isinstance(event, dpa.SampledWithoutReplacementDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        n, m = int(event.source_dataset_size), int(event.sample_size)
        return ("fixed", m / n, float(event.event.noise_multiplier), n, m)
    if isinstance(event, dpa.GaussianDpEvent):
        return ("gaussian", 1.0, float(event.noise_multiplier), None, None)
    return ("other", repr(event), None, None, None)


class RdpCurveCache:
    """LRU cache of per-step RDP curves of leaf events; composes trees of them by vector arithmetic."""

    def __init__(self, maxsize: int = 4096) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._store: collections.OrderedDict[tuple, np.ndarray] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._store)

    def clear(self) -> None:
        with self._lock:
            self._store.clear()
            self.hits = self.misses = 0

    def curve(self, event: dpa.DpEvent, orders: Sequence[float] | None = None) -> np.ndarray:
        """RDP of ``event`` at each order (a new array), under the event's neighbouring relation."""
        ords = normalize_orders(orders)
        relation = neighboring_relation(event)
        return np.array(self._curve(event, ords, relation), dtype=np.float64)

    def leaf_curve(self, event: dpa.DpEvent, orders: tuple[float, ...], relation: str) -> np.ndarray:
        """Read-only cached RDP curve of one leaf event (computed by dp_accounting on a miss)."""
        key = (leaf_key(event), orders, relation)
        with self._lock:
            hit = self._store.get(key)
            if hit is not None:
                self._store.move_to_end(key)
                self.hits += 1
                return hit
        value = self._compute_leaf(event, orders, relation)
        value.setflags(write=False)
        with self._lock:
            self.misses += 1
            self._store[key] = value
            self._store.move_to_end(key)
            while len(self._store) > self.maxsize:
                self._store.popitem(last=False)
        return value

    def _curve(self, event: dpa.DpEvent, orders: tuple[float, ...], relation: str) -> np.ndarray:
        if isinstance(event, dpa.SelfComposedDpEvent):
            count = int(event.count)
            if count < 0:
                raise ValueError(f"SelfComposedDpEvent count must be >= 0, got {count}")
            if count == 0:
                return np.zeros(len(orders))
            return count * self._curve(event.event, orders, relation)
        if isinstance(event, dpa.ComposedDpEvent):
            total = np.zeros(len(orders))
            for sub in event.events:
                total = total + self._curve(sub, orders, relation)
            return total
        if isinstance(event, dpa.NoOpDpEvent):
            return np.zeros(len(orders))
        if isinstance(event, dpa.NonPrivateDpEvent):
            return np.full(len(orders), np.inf)
        return self.leaf_curve(event, orders, relation)

    def _compute_leaf(self, event: dpa.DpEvent, orders: tuple[float, ...], relation: str) -> np.ndarray:
        kind, q, z, _, m = leaf_key(event)
        if kind == "other":
            return _dp_accounting_curve(event, orders, relation)
        if not z >= 0.0:  # NaN or negative: dpfl's events never carry one (events.py validates)
            raise ValueError(f"noise multiplier must be >= 0, got {z} in {event!r}")
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"sampling probability must be in [0, 1], got {q} in {event!r}")
        if (kind == "poisson" and q == 0.0) or (kind == "fixed" and m == 0):
            return np.zeros(len(orders))  # nobody is sampled: the output does not depend on the data
        if z == math.inf:
            return np.zeros(len(orders))  # infinite noise: the output does not depend on the data
        if z < Z_NO_PRIVACY:
            # Includes z = 0 (no noise: the output reveals the sample; dp_accounting returns inf for the
            # Poisson and Gaussian cases and divides by zero in the without-replacement bound).
            return np.full(len(orders), np.inf)
        z_switch = switch_noise(kind, q)
        if z <= z_switch:
            curve = _dp_accounting_curve(event, orders, relation)
            bad = np.isnan(curve) | (curve < 0.0)
            if bad.any():
                curve = np.where(bad, _gaussian_bound(orders, z), curve)
            return curve
        reference = self.leaf_curve(_with_noise(event, z_switch), orders, relation)
        if q == 1.0 or kind == "gaussian":
            bound = _gaussian_bound(orders, z)
        elif kind == "poisson":
            bound = _poisson_bound(q, z, orders)
        else:
            bound = _wor_bound(q, z, orders)
        return np.minimum(reference, bound)


def switch_noise(kind: str, q: float) -> float:
    """Noise multiplier above which a leaf's curve is ``min(curve(switch), stable bound)``."""
    if kind == "gaussian" or q == 1.0:
        return Z_SWITCH_GAUSSIAN
    if kind == "fixed":
        return Z_SWITCH_FIXED
    return POISSON_SWITCH_SCALE * math.sqrt(q)


def _dp_accounting_curve(event: dpa.DpEvent, orders: tuple[float, ...], relation: str) -> np.ndarray:
    accountant = rdp_lib.RdpAccountant(list(orders), _NEIGHBOR_REL[relation])
    with _quiet_non_convergence():
        accountant.compose(event)
    return np.asarray(accountant.rdp, dtype=np.float64)


def _with_noise(event: dpa.DpEvent, z: float) -> dpa.DpEvent:
    """The same Gaussian-family leaf with noise multiplier ``z``."""
    if isinstance(event, dpa.PoissonSampledDpEvent):
        return dpa.PoissonSampledDpEvent(event.sampling_probability, dpa.GaussianDpEvent(z))
    if isinstance(event, dpa.SampledWithoutReplacementDpEvent):
        return dpa.SampledWithoutReplacementDpEvent(event.source_dataset_size, event.sample_size, dpa.GaussianDpEvent(z))
    return dpa.GaussianDpEvent(z)


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
    out[::2] = special.logsumexp(log_integrand, axis=1) + math.log(_DX / math.sqrt(2.0 * math.pi)) - math.exp(log_c) / 4.0
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


RDP_CURVES = RdpCurveCache()


def rdp_curve(event: dpa.DpEvent, orders: Sequence[float] | None = None) -> np.ndarray:
    """Per-order RDP of ``event`` via the process-wide cache ``RDP_CURVES``."""
    return RDP_CURVES.curve(event, orders)


"""Cached per-step RDP curves, so composing many identical events is ``count * curve``.

A federated run composes the same few mechanisms thousands of times (every step of every round of
every client). dp_accounting's ``RdpAccountant`` recomputes the subsampled-Gaussian RDP series on each
``compose``; here each *leaf* mechanism's curve (one value per order) is computed once and reused.
``SelfComposedDpEvent`` multiplies and ``ComposedDpEvent`` adds, exactly as ``RdpAccountant`` does, so the
result equals ``RdpAccountant(orders).compose(event).rdp`` (checked in the tests).

Leaves are keyed by ``(kind, q, z, population, sample_size)`` as carried by the event (for fixed-size
sampling z is the event's multiplier, i.e. already halved), plus the orders and the relation.

How a Gaussian-family leaf is computed
--------------------------------------
dp_accounting's formulas, vectorised over the orders with numpy/scipy (log space, ``gammaln``, segment
sums) instead of its per-order Python loops (its without-replacement bound took ~0.3-0.5 s per curve,
the Poisson one ~30 ms; here both take about a millisecond). The bounds are the same, term by term:

* Plain Gaussian: ``alpha / (2 z^2)``.
* Poisson (Mironov, Talwar, Zhang 2019), integer orders: ``log A_alpha`` with
  ``A_alpha = sum_i Binomial(alpha, q)[i] exp(i (i - 1) / (2 z^2))``, written as
  ``log1p(sum_{i>=2} Binomial(alpha, q)[i] expm1(i (i - 1) / (2 z^2)))`` (the same number; non-negative terms,
  so no cancellation). Fractional orders: dp_accounting's two-sided series (``_compute_log_a_frac``) with the
  same terms, the same order of summation (a cumulative log-add) and the same stopping rule (both halves
  decreasing and 30 nats below the running total; an order whose series has not stopped after 1000 terms is
  +inf, i.e. unused, as dp_accounting does).
* Fixed size (Wang, Balle, Kasiviswanathan 2019, Theorem 27, as dp_accounting's
  ``_compute_rdp_sample_wor_gaussian_int``): for integer orders up to 256 the exact sum with
  ``min(log 4 + (log Delta^lo + log Delta^hi) / 2, log 2 + cgf(i - 1))`` per term, above 256 its cgf-only
  ("Stirling") terms; fractional orders by the interpolation of Corollary 10. dp_accounting forms the even
  forward differences ``Delta^k f(-1)`` of ``f(x) = exp(x (x + 1) / (2 sigma^2))`` by repeated differencing
  (O(alpha^2) per order); here they are computed once per sigma for all orders, to the same values
  (``_log_forward_differences``): as the alternating sum for sigma < 0.5, where its last term dominates, and
  as positive Gaussian integrals otherwise.

Numerical regimes of the Gaussian-family leaves
-----------------------------------------------
dp_accounting's formulas are exact in the range DP-SGD uses, but its arithmetic fails over the whole float
range: for a tiny z, ``sigma**2`` underflows (ZeroDivisionError, or NaN that ``compute_epsilon`` turns into
epsilon = 0); for a huge z, ``sigma**2`` overflows (OverflowError), the without-replacement bound takes
``log(0)`` (ValueError), and the Poisson series cancels (``A_alpha`` is ``1 + tiny`` summed in log space), so
its RDP comes out too small by a relative ``~3e-16 z^2 / q``, then negative (which ``compute_epsilon`` also
turns into epsilon = 0). Every value returned here is therefore an upper bound computed as follows:

* ``z < Z_NO_PRIVACY`` (1e-100): +inf at every order. Always a valid bound; the true RDP there exceeds
  ~1e199 (alpha - 1) at order alpha for any sampling rate, so nothing meaningful is lost.
* ``Z_NO_PRIVACY <= z <= z_switch``: dp_accounting's bound as above (``_exact_curve``; every value in the range
  the tests compare against dp_accounting and Opacus comes from here, and agrees with dp_accounting to 1e-9
  relative). A NaN or negative order (never seen in this range) is replaced by the unsampled Gaussian bound
  ``alpha / (2 z^2)``.
* ``z > z_switch``: ``min(curve(z_switch), B(z))`` per order. ``curve(z_switch)`` is valid for every
  larger z because adding independent Gaussian noise is post-processing (RDP never increases with z), and
  it makes the curve continuous and non-increasing across the switch. ``B`` is dp_accounting's own bound
  evaluated so that it stays accurate for large z, capped by the unsampled Gaussian ``alpha / (2 z^2)``
  (sampling only amplifies privacy; for plain Gaussians that is ``B`` itself):
  - Poisson: ``A_alpha`` in the cancellation-free form above at integer orders; at a fractional order the
    chord between its two integer neighbours (``log A_alpha`` is convex in alpha and ``log A_1 = 0``, so the
    chord lies above it).
  - Fixed size: Theorem 27 exactly as dp_accounting's exact branch writes it (also above its order 256),
    with the forward differences computed as positive Gaussian integrals instead of by differencing numbers
    that all round to 1 (in dp_accounting that cancellation makes the bound *rise* with z from z ~ 8 on);
    fractional orders by its interpolation (Corollary 10).
  ``B`` carries a relative margin of 1e-9 against rounding and is never below the smallest positive float.
  ``z_switch`` (the event's multiplier) is 1e150 for plain Gaussians (exact formula until ``z**2``
  overflows), 4 for fixed-size sampling (nominal z = 8: dp_accounting's bound is still monotone and
  agrees with ``B`` to 1e-9), and ``1e3 sqrt(q)`` for Poisson sampling (dp_accounting's relative error ~3e-10).

Hence epsilon is +inf as z -> 0, tends to 0 (or to the conversion's floor for a tiny delta) as z -> inf,
never raises on a finite z >= 0, and is non-increasing in z across the float range.

One file over 600 lines on purpose: every bound is checked term by term against dp_accounting's, and the
stable forms share their series helpers; kept together they read beside the formulas they replace.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import math
import threading
from collections.abc import Iterator, Sequence

import dp_accounting as dpa
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy import special

from dpfl.privacy.events import neighboring_relation
from dpfl.privacy.orders import normalize_orders, orders_array

__all__ = ["RDP_CURVES", "Z_NO_PRIVACY", "RdpCurveCache", "leaf_key", "rdp_curve", "switch_noise"]

Z_NO_PRIVACY = 1e-100  # below: +inf RDP (see the module docstring)
Z_SWITCH_GAUSSIAN = 1e150  # dp_accounting's alpha / (2 z**2) until z**2 overflows (~1.3e154)
Z_SWITCH_FIXED = 4.0  # dp_accounting's without-replacement bound: its forward differences cancel above ~7
POISSON_SWITCH_SCALE = 1e3  # dp_accounting's Poisson series up to z = 1e3 sqrt(q): relative error ~3e-10
STABLE_MARGIN = 1e-9  # relative margin on the large-z bounds, against rounding
MAX_STABLE_ORDER = 100_000  # above: the Poisson large-z bound uses the unsampled Gaussian (a finite sum per order)
MAX_STABLE_WOR_ORDER = 2048  # above: the fixed-size large-z bound uses the unsampled Gaussian (quadrature cost)
WOR_EXACT_MAX_ORDER = 256  # dp_accounting's max_alpha: exact Theorem 27 up to this order, cgf-only terms above
_TINY = float(np.nextafter(0.0, 1.0))
_LOG2 = math.log(2.0)
_LOG4 = math.log(4.0)
_LOG_HALF = math.log(0.5)
_SQRT2 = 2**0.5  # as dp_accounting's _log_erfc writes it
_FRAC_CHUNKS = (24, 64, 160, 400, rdp_lib._MAX_STEPS_LOG_A_FRAC)  # noqa: SLF001 - fractional series, terms by chunk
# Forward differences (see _log_forward_differences)
_DIRECT_SIGMA = 0.5  # below: the alternating sum, whose last term dominates (no cancellation)
_WINDOW = 10.0  # quadrature window: +-10 around each peak of a log-concave integrand of curvature >= 1 (e^-50)
_STEP = 0.3  # trapezoid step: peaks have curvature <= 2 there, so the error is ~exp(-pi^2 / step^2) ~ e^-110
_NEWTON_STEPS = 12  # locating the peaks (monotone convergence; the windows need them to ~0.1)

_NEIGHBOR_REL = {
    "add_remove": dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": dpa.NeighboringRelation.REPLACE_ONE,
}


@contextlib.contextmanager
def _quiet_non_convergence() -> Iterator[None]:
    """Silence absl warnings while dp_accounting computes a curve (events other than Gaussian-family leaves).

    dp_accounting logs one warning per order whose series does not converge (and then excludes that order:
    a valid, merely unused bound); emitting them costs more than the computation. Raising the logger level
    (not filtering records) skips building the records; it briefly affects absl warnings from other threads.
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
        """Read-only cached RDP curve of one leaf event (computed as the module docstring says on a miss)."""
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
            curve = _exact_curve(kind, q, z, orders)
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
        return dpa.SampledWithoutReplacementDpEvent(event.source_dataset_size, event.sample_size,
                                                    dpa.GaussianDpEvent(z))
    return dpa.GaussianDpEvent(z)


# ---------------------------------------------------------------------------------------------------------
# Vectorised building blocks
# ---------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Terms:
    """The terms i = 2..k of every integer order k of a tuple, flattened order after order."""

    k: np.ndarray  # the order of each term (float)
    i: np.ndarray  # the term's index (float)
    starts: np.ndarray  # where each order's run begins (its i = 2 term)
    counts: np.ndarray  # terms per order (k - 1)
    log_comb: np.ndarray  # log Binomial(k, i), computed as dp_accounting's _log_comb
    lo: np.ndarray  # 2 floor(i / 2): forward-difference indices of Theorem 27's terms
    hi: np.ndarray  # 2 ceil(i / 2)


@functools.lru_cache(maxsize=256)
def _terms(ks: tuple[int, ...]) -> _Terms:
    counts = np.array(ks, dtype=np.int64) - 1
    starts = np.zeros(len(ks), dtype=np.int64)
    starts[1:] = np.cumsum(counts)[:-1]
    k = np.repeat(np.array(ks, dtype=np.float64), counts)
    i = (np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts) + 2).astype(np.float64)
    log_comb = special.gammaln(k + 1) - special.gammaln(i + 1) - special.gammaln(k - i + 1)
    lo = (2 * np.floor(i / 2.0)).astype(np.int64)
    hi = (2 * np.ceil(i / 2.0)).astype(np.int64)
    for a in (k, i, starts, counts, log_comb, lo, hi):
        a.setflags(write=False)
    return _Terms(k, i, starts, counts, log_comb, lo, hi)


@dataclasses.dataclass(frozen=True)
class _Interpolation:
    """For the orders up to a limit: the integer orders k >= 2 whose log A is needed (each order's floor and
    ceiling), and where each order finds them in ``[0 (log A_1), log A_k for k in ks...]``."""

    within: np.ndarray  # bool per order: order <= limit
    ks: tuple[int, ...]
    floor_pos: np.ndarray  # per order within the limit
    ceil_pos: np.ndarray
    t: np.ndarray  # order - floor(order)


@functools.lru_cache(maxsize=256)
def _interpolation(orders: tuple[float, ...], limit: float) -> _Interpolation:
    a = np.asarray(orders, dtype=np.float64)
    within = a <= limit
    floors = np.floor(a[within]).astype(np.int64)
    ceils = np.ceil(a[within]).astype(np.int64)
    ks = tuple(sorted({int(k) for k in np.concatenate([floors, ceils]) if k >= 2}))
    position = {1: 0, **{k: j + 1 for j, k in enumerate(ks)}}
    out = _Interpolation(
        within,
        ks,
        np.array([position[int(k)] for k in floors], dtype=np.int64),
        np.array([position[int(k)] for k in ceils], dtype=np.int64),
        a[within] - floors,
    )
    for arr in (out.within, out.floor_pos, out.ceil_pos, out.t):
        arr.setflags(write=False)
    return out


def _interpolate(plan: _Interpolation, log_a: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """``((1 - t) log A_floor + t log A_ceil) / (alpha - 1)`` for the orders within the plan's limit
    (dp_accounting's Corollary-10 interpolation; the plain value at integer orders)."""
    values = np.concatenate([[0.0], log_a])
    x, y, t = values[plan.floor_pos], values[plan.ceil_pos], plan.t
    with np.errstate(invalid="ignore"):
        mixed = np.where(t == 0.0, x, (1 - t) * x + t * y)
    return mixed / (alphas[plan.within] - 1)


def _log1p_exp(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)) without overflow."""
    with np.errstate(over="ignore"):
        return np.where(x > 0.0, x + np.log1p(np.exp(-x)), np.log1p(np.exp(x)))


def _log1p_sum_exp(values: np.ndarray, terms: _Terms) -> np.ndarray:
    """Per order of ``terms``: ``log(1 + sum_i exp(values_i))`` (dp_accounting's log_a, which starts at log 1)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        peak = np.maximum.reduceat(values, terms.starts)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        total = np.add.reduceat(np.exp(values - np.repeat(peak, terms.counts)), terms.starts)
        return _log1p_exp(peak + np.log(total))


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


# ---------------------------------------------------------------------------------------------------------
# dp_accounting's curves (Z_NO_PRIVACY <= z <= z_switch)
# ---------------------------------------------------------------------------------------------------------
def _exact_curve(kind: str, q: float, z: float, orders: tuple[float, ...]) -> np.ndarray:
    """dp_accounting's RDP of a Gaussian-family leaf (``_compute_rdp_poisson_subsampled_gaussian``,
    ``_compute_rdp_sample_wor_gaussian`` or the plain Gaussian), vectorised; 0 < q <= 1, z > 0."""
    alphas = orders_array(orders)
    if kind == "gaussian" or q == 1.0:
        return alphas / (2 * z**2)
    if kind == "poisson":
        out = np.empty(len(alphas))
        integer = alphas == np.floor(alphas)
        ks = tuple(int(a) for a in alphas[integer])
        if ks:
            out[integer] = _poisson_log_a_int(q, z, ks) / (alphas[integer] - 1)
        if not integer.all():
            out[~integer] = _poisson_log_a_frac(q, z, alphas[~integer]) / (alphas[~integer] - 1)
        return out
    plan = _interpolation(orders, math.inf)
    return _interpolate(plan, _wor_log_a_int(q, z, plan.ks, WOR_EXACT_MAX_ORDER), alphas)


def _poisson_log_a_int(q: float, z: float, ks: tuple[int, ...]) -> np.ndarray:
    """log A_k of the Poisson-subsampled Gaussian (Mironov et al. 2019) at integer orders k >= 2, free of
    cancellation: A_k = 1 + sum_{i >= 2} Binomial(k, q)[i] expm1(i (i - 1) / (2 z^2)), summed in log space."""
    terms = _terms(ks)
    log_pmf = terms.log_comb + terms.i * math.log(q) + (terms.k - terms.i) * math.log1p(-q)
    pairs = terms.i * terms.i - terms.i  # i (i - 1)
    with np.errstate(under="ignore", divide="ignore"):
        if Z_NO_PRIVACY <= z <= 1e100:  # z**2 is a normal float: dp_accounting's own exponent
            x = pairs / (2 * (z**2))
            log_x = np.log(x)
        else:  # kept in log space: x underflows for a huge z
            log_x = np.log(pairs / 2.0) - 2.0 * math.log(z)
            x = np.exp(log_x)
    return _log1p_sum_exp(log_pmf + _log_expm1(x, log_x), terms)


def _poisson_log_a_frac(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """dp_accounting's ``_compute_log_a_frac`` at each (fractional) alpha: the same terms, summed in the same
    order (a running log-add), stopped at the same term (both halves decreasing and 30 below the running
    total); +inf where the series has not stopped within ``_MAX_STEPS_LOG_A_FRAC`` terms."""
    log_q, log1mq = math.log(q), math.log1p(-q)
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    scale = math.sqrt(2) * sigma
    two_var = 2 * (sigma**2)
    out = np.full(len(alphas), np.inf)
    rows = np.arange(len(alphas))
    sum0 = np.full(len(alphas), -np.inf)  # running log-sums and last terms of the two halves
    sum1 = sum0.copy()
    last0 = sum0.copy()
    last1 = sum0.copy()
    start = 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        for stop in _FRAC_CHUNKS:
            if rows.size == 0:
                break
            i = np.arange(start, stop, dtype=np.float64)[None, :]
            a = alphas[rows][:, None]
            log_coef = special.gammaln(a + 1) - special.gammaln(i + 1) - special.gammaln(a - i + 1)
            j = a - i
            log_t0 = log_coef + i * log_q + j * log1mq
            log_t1 = log_coef + j * log_q + i * log1mq
            log_e0 = _LOG_HALF + (_LOG2 + special.log_ndtr(-((i - z0) / scale) * _SQRT2))
            log_e1 = _LOG_HALF + (_LOG2 + special.log_ndtr(-((z0 - j) / scale) * _SQRT2))
            s0 = log_t0 + (i * i - i) / two_var + log_e0
            s1 = log_t1 + (j * j - j) / two_var + log_e1
            run0 = np.logaddexp.accumulate(np.column_stack([sum0, s0]), axis=1)[:, 1:]
            run1 = np.logaddexp.accumulate(np.column_stack([sum1, s1]), axis=1)[:, 1:]
            total = np.logaddexp(run0, run1)
            prev0 = np.column_stack([last0, s0[:, :-1]])
            prev1 = np.column_stack([last1, s1[:, :-1]])
            stops = (s0 < prev0) & (s1 < prev1) & (np.maximum(s0, s1) < total - 30)
            done = stops.any(axis=1)
            first = stops.argmax(axis=1)
            out[rows[done]] = total[done, first[done]]
            keep = ~done
            rows = rows[keep]
            sum0, sum1, last0, last1 = run0[keep, -1], run1[keep, -1], s0[keep, -1], s1[keep, -1]
            start = stop
    return out


def _wor_log_a_int(q: float, sigma: float, ks: tuple[int, ...], exact_up_to: int) -> np.ndarray:
    """log A_k of the without-replacement bound (Wang, Balle, Kasiviswanathan 2019, Theorem 27) at integer
    orders k >= 2, as dp_accounting's ``_compute_rdp_sample_wor_gaussian_int`` writes it: the exact sum for
    k <= ``exact_up_to`` (dp_accounting: 256), its cgf-only terms above; every term in log space."""
    log_q = math.log(q)
    log_c = -_LOG2 - 2.0 * math.log(sigma)  # c = 1 / (2 sigma^2)
    two_var = 2.0 * sigma**2 if Z_NO_PRIVACY <= sigma <= 1e100 else None
    c = math.exp(log_c)
    log_f2 = _LOG2 + log_c  # func(2) = 2 c
    f2 = math.exp(log_f2)
    log_f2m1 = float(_log_expm1(np.array(f2), np.array(log_f2)))
    first = min(_LOG4 + log_f2m1, f2 + _LOG2)  # the i = 2 term's factor
    out = np.empty(len(ks))
    exact = [j for j, k in enumerate(ks) if k <= exact_up_to]
    cgf_only = [j for j, k in enumerate(ks) if k > exact_up_to]
    for rows, with_differences in ((exact, True), (cgf_only, False)):
        if not rows:
            continue
        terms = _terms(tuple(ks[j] for j in rows))
        with np.errstate(over="ignore"):
            cgf = (terms.i - 1) * terms.i / two_var if two_var is not None else c * (terms.i - 1) * terms.i
        factor = _LOG2 + cgf
        if with_differences:
            log_deltas = _log_forward_differences(sigma, int(terms.hi.max()))
            factor = np.minimum(_LOG4 + 0.5 * (log_deltas[terms.lo] + log_deltas[terms.hi]), factor)
        factor[terms.starts] = first
        out[rows] = _log1p_sum_exp(factor + terms.i * log_q + terms.log_comb, terms)
    return out


def _log_forward_differences(sigma: float, k_max: int) -> np.ndarray:
    """log of the even forward differences Delta^k f(-1), k = 0, 2, ..., k_max, of f(x) = exp(x (x + 1) / (2 sigma^2)).

    The values dp_accounting's ``_get_forward_diffs`` computes by repeated differencing (which cancels to
    noise for a large sigma: every f(x) rounds to ~1). Returns an array indexed by k (odd entries unused).
    """
    out = np.full(k_max + 1, -np.inf)
    out[0] = 0.0
    if k_max >= 2:
        ks = np.arange(2, k_max + 1, 2, dtype=np.float64)
        out[2::2] = _differences_by_sum(sigma, ks) if sigma < _DIRECT_SIGMA else _differences_by_quadrature(sigma, ks)
    return out


def _differences_by_sum(sigma: float, ks: np.ndarray) -> np.ndarray:
    """log Delta^k f(-1) = log sum_j (-1)^(k-j) Binomial(k, j) f(j - 1), for sigma < 0.5.

    There f(k - 1) = exp(c k (k - 1)) outweighs the other terms together (c = 1 / (2 sigma^2) > 2: the next
    one is k exp(-2 c (k - 1)) <= 4% of it), so the alternating sum loses no precision.
    """
    log_comb_pos, log_comb_neg, pairs = _alternating_terms(int(ks[-1]))
    exponent = pairs / (2.0 * sigma**2)  # (j - 1) j / (2 sigma^2)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        return _log_diff(_logsumexp_rows(log_comb_pos + exponent), _logsumexp_rows(log_comb_neg + exponent))


@functools.lru_cache(maxsize=16)
def _alternating_terms(k_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For even k = 2..k_max (rows) and j = 0..k_max: log Binomial(k, j) where (-1)^(k-j) is +1 (else -inf),
    the same where it is -1, and (j - 1) j."""
    k = np.arange(2, k_max + 1, 2, dtype=np.float64)[:, None]
    j = np.arange(k_max + 1, dtype=np.float64)[None, :]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_comb = special.gammaln(k + 1) - special.gammaln(j + 1) - special.gammaln(k - j + 1)
    inside = j <= k
    positive = inside & (j % 2 == 0)  # k is even
    pos = np.where(positive, log_comb, -np.inf)
    neg = np.where(inside & ~positive, log_comb, -np.inf)
    pairs = (j - 1) * j
    for a in (pos, neg, pairs):
        a.setflags(write=False)
    return pos, neg, pairs


def _logsumexp_rows(values: np.ndarray) -> np.ndarray:
    """log sum exp along each row (rows of -inf give -inf)."""
    peak = values.max(axis=1)
    safe = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore", under="ignore"):
        return safe + np.log(np.exp(values - safe[:, None]).sum(axis=1))


def _log_diff(log_a: np.ndarray, log_b: np.ndarray) -> np.ndarray:
    """log(exp(log_a) - exp(log_b)) for log_a > log_b."""
    with np.errstate(divide="ignore", under="ignore"):
        return log_a + np.log1p(-np.exp(log_b - log_a))


def _differences_by_quadrature(sigma: float, ks: np.ndarray) -> np.ndarray:
    """log Delta^k f(-1) as positive Gaussian integrals, for sigma >= 0.5.

    With c = 1 / (2 sigma^2), s = 1 / sigma and X ~ N(0, 1): f(x) = exp(-c/4) E[exp((x + 1/2) s X)], so
    Delta^k f(-1) = exp(-c/4) E[exp(-s X / 2) (e^{s X} - 1)^k]: for even k a positive integrand. On each
    half-line its log, g_k(x) = -s x / 2 - x^2 / 2 + k log|e^{s x} - 1|, is concave with curvature >= 1, so
    the mass lies within +-``_WINDOW`` of the half-line's peak (the rest is below e^-50 of it). Each k is
    integrated by the trapezoid rule (step ``_STEP``, spectrally accurate for these smooth integrands) over
    those windows of one shared grid, in log space.
    """
    s = 1.0 / sigma
    log_s = -math.log(sigma)
    root_k = np.sqrt(ks)
    if s >= 1e-5:
        # Peaks: roots of x + s/2 - k s / (1 - e^{-s x}) (x > 0) and of y - s/2 - k s / (e^{s y} - 1) at x = -y;
        # both increasing and concave, so Newton from the right of the root converges monotonically.
        pos = root_k + ks * s
        neg = root_k + s / 2
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for _ in range(_NEWTON_STEPS):
                e = -np.expm1(-s * pos)
                pos = pos - (pos + s / 2 - ks * s / e) / (1 + ks * s * s * (1 - e) / (e * e))
                e = np.expm1(s * neg)
                neg = neg - (neg - s / 2 - ks * s / e) / (1 + ks * s * s * (1 + e) / (e * e))
    else:  # the integrand is |X|^k e^{-X^2/2} up to O(s): peaks at +-sqrt(k)
        pos = neg = root_k
    width = int(math.ceil(2 * _WINDOW / _STEP)) + 2
    x_min = -(float(neg.max()) + _WINDOW) - _STEP
    left = np.floor((-neg - _WINDOW - x_min) / _STEP).astype(np.int64)
    right = np.maximum(np.floor((pos - _WINDOW - x_min) / _STEP).astype(np.int64), left + width)  # overlap: contiguous
    x = x_min + _STEP * np.arange(int(right.max()) + width)
    u = s * x
    with np.errstate(divide="ignore", under="ignore"):
        if s >= 1e-5:
            log_abs_expm1 = np.maximum(u, 0.0) + np.log(-np.expm1(-np.abs(u)))
        else:  # s x may be subnormal: log|e^u - 1| = log s + log|x| + u/2 + u^2/24 - u^4/2880 + O(u^6)
            log_abs_expm1 = log_s + np.log(np.abs(x)) + u * (0.5 + u * (1.0 / 24.0 - u * u / 2880.0))
    base = -0.5 * u - 0.5 * x * x
    offsets = np.arange(width)
    index = np.concatenate([left[:, None] + offsets, right[:, None] + offsets], axis=1)
    log_integrand = log_abs_expm1[index]
    log_integrand *= ks[:, None]
    log_integrand += base[index]
    peak = log_integrand.max(axis=1)
    log_integrand -= peak[:, None]
    np.exp(log_integrand, out=log_integrand)
    return peak + np.log(log_integrand.sum(axis=1)) + (math.log(_STEP / math.sqrt(2.0 * math.pi)) - 0.125 * s * s)


# ---------------------------------------------------------------------------------------------------------
# Large-z bounds B (z > z_switch)
# ---------------------------------------------------------------------------------------------------------
def _poisson_bound(q: float, z: float, orders: Sequence[float]) -> np.ndarray:
    """Per-order RDP bound of the Poisson-subsampled Gaussian for large z (see the module docstring): the chord of
    the convex log A at fractional orders."""
    return _large_z_bound(orders, z, MAX_STABLE_ORDER, lambda ks: _poisson_log_a_int(q, z, ks))


def _wor_bound(q: float, sigma: float, orders: Sequence[float]) -> np.ndarray:
    """Per-order without-replacement RDP bound for large sigma (integer orders as dp_accounting's exact branch,
    fractional ones by its interpolation, Corollary 10 of WBK19); the unsampled Gaussian above MAX_STABLE_WOR_ORDER."""
    return _large_z_bound(orders, sigma, MAX_STABLE_WOR_ORDER,
                          lambda ks: _wor_log_a_int(q, sigma, ks, MAX_STABLE_WOR_ORDER))


def _large_z_bound(orders: Sequence[float], z: float, max_order: int, log_a_int) -> np.ndarray:
    """log A from ``log_a_int(integer orders)`` up to ``max_order``, interpolated at fractional orders, with a
    rounding margin, capped by the unsampled Gaussian ``alpha / (2 z^2)`` (which also covers higher orders)."""
    ords = tuple(float(a) for a in orders)
    alphas = np.asarray(ords, dtype=np.float64)
    gaussian = _gaussian_bound(alphas, z)
    plan = _interpolation(ords, max_order)
    out = gaussian.copy()
    if plan.within.any():
        log_a = log_a_int(plan.ks) if plan.ks else np.zeros(0)
        out[plan.within] = _interpolate(plan, log_a, alphas)
    return np.minimum(_round_up(out), gaussian)


RDP_CURVES = RdpCurveCache()


def rdp_curve(event: dpa.DpEvent, orders: Sequence[float] | None = None) -> np.ndarray:
    """Per-order RDP of ``event`` via the process-wide cache ``RDP_CURVES``."""
    return RDP_CURVES.curve(event, orders)

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
  it makes the curve continuous and non-increasing across the switch. ``B`` is a bound that is stable for
  large z: the unsampled Gaussian ``alpha / (2 z^2)`` (sampling only amplifies privacy) for plain and
  fixed-size leaves; for Poisson leaves the same ``A_alpha`` as dp_accounting but written as
  ``log1p(sum_{i>=2} Binomial(alpha, q)[i] * expm1(i (i - 1) / (2 z^2)))`` (non-negative terms, so no
  cancellation) at integer orders, and at a fractional order the chord between its two integer
  neighbours (``log A_alpha`` is convex in alpha, ``log A_1 = 0``). ``B`` carries a relative margin of
  1e-9 against rounding and is never below the smallest positive float.
  ``z_switch`` is 1e150 for plain Gaussians (exact formula until ``z**2`` overflows), 1e4 for fixed-size
  sampling, and ``1e3 sqrt(q)`` for Poisson sampling (where dp_accounting's relative error is ~3e-10).

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
Z_SWITCH_FIXED = 1e4  # dp_accounting's without-replacement bound loses ~1e-16 z^2 relative, raises at ~3e8
POISSON_SWITCH_SCALE = 1e3  # dp_accounting's Poisson series up to z = 1e3 sqrt(q): relative error ~3e-10
STABLE_MARGIN = 1e-9  # relative margin on the large-z bounds, against rounding
MAX_STABLE_ORDER = 100_000  # above: the Poisson large-z bound uses the unsampled Gaussian (a finite sum per order)
_TINY = float(np.nextafter(0.0, 1.0))

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
        if (kind == "poisson" and q == 0.0) or (kind == "fixed" and m == 0):
            return np.zeros(len(orders))  # nobody is sampled: the output does not depend on the data
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
        if kind == "poisson" and q < 1.0:
            bound = _poisson_bound(q, z, orders)
        else:
            bound = _gaussian_bound(orders, z)  # exact for plain Gaussians, a valid bound for fixed-size sampling
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
    return np.maximum(values * (1.0 + STABLE_MARGIN), _TINY)


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
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        x = np.exp(log_x)
        log_expm1 = np.where(
            x > 1.0,
            x + np.log1p(-np.exp(-x)),
            np.where(x > 1e-5, np.log(np.expm1(x)), log_x + np.log1p(x / 2.0 + x * x / 6.0)),
        )
    log_s = float(special.logsumexp(log_pmf + log_expm1))
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


RDP_CURVES = RdpCurveCache()


def rdp_curve(event: dpa.DpEvent, orders: Sequence[float] | None = None) -> np.ndarray:
    """Per-order RDP of ``event`` via the process-wide cache ``RDP_CURVES``."""
    return RDP_CURVES.curve(event, orders)


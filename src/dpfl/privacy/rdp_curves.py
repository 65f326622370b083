"""Cached per-step RDP curves, so composing many identical events is ``count * curve``.

A federated run composes the same few mechanisms thousands of times (every step of every round of
every client). dp_accounting's ``RdpAccountant`` recomputes the subsampled-Gaussian RDP series on each
``compose``; here each *leaf* mechanism's curve (one value per order) is computed once by that
accountant and reused. ``SelfComposedDpEvent`` multiplies and ``ComposedDpEvent`` adds, exactly as
``RdpAccountant`` does, so the result equals ``RdpAccountant(orders).compose(event).rdp`` (checked in
the tests).

Leaves are keyed by ``(kind, q, z, population, sample_size)`` as carried by the event (for fixed-size
sampling z is the event's multiplier, i.e. already halved), plus the orders and the relation.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence

import dp_accounting as dpa
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dpfl.privacy.events import neighboring_relation
from dpfl.privacy.orders import normalize_orders

__all__ = ["RDP_CURVES", "RdpCurveCache", "leaf_key", "rdp_curve"]

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

    @staticmethod
    def _compute_leaf(event: dpa.DpEvent, orders: tuple[float, ...], relation: str) -> np.ndarray:
        kind, q, z, _, m = leaf_key(event)
        if kind != "other" and z == 0.0:
            # No noise: the output reveals the sample. dp_accounting returns inf for the Poisson and
            # Gaussian cases and divides by zero in the without-replacement bound; make all inf.
            sampled_nobody = (kind == "poisson" and q == 0.0) or (kind == "fixed" and m == 0)
            return np.zeros(len(orders)) if sampled_nobody else np.full(len(orders), np.inf)
        accountant = rdp_lib.RdpAccountant(list(orders), _NEIGHBOR_REL[relation])
        with _quiet_non_convergence():
            accountant.compose(event)
        return np.asarray(accountant.rdp, dtype=np.float64)


RDP_CURVES = RdpCurveCache()


def rdp_curve(event: dpa.DpEvent, orders: Sequence[float] | None = None) -> np.ndarray:
    """Per-order RDP of ``event`` via the process-wide cache ``RDP_CURVES``."""
    return RDP_CURVES.curve(event, orders)


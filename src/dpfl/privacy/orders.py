"""The RDP orders dpfl's RDP accountant optimises over, and why these.

Each order alpha gives a valid (epsilon, delta) bound; the reported epsilon is the minimum over the
orders, so adding orders can only tighten it, at the cost of computing more of the RDP curve.

* ``1 + x/10`` for x = 1..99 and the integers 12..64: the set of the heterogeneous-DP spec (2.3); it
  contains Opacus' default orders (which stop at 63), so on every point where Opacus' optimum is an
  interior order dpfl's epsilon is never larger than Opacus' and in practice equal.
* 80 ... 1024: larger orders in roughly x1.25-x1.5 steps, as dp_accounting's and TF-Privacy's defaults
  do (they end with 128, 256, 512, 1024). For small sampling rates or large noise the optimal order
  exceeds 64; without these orders epsilon stalls at the order-64 bound, which is loose by up to a
  factor ~5 there (e.g. q=0.001, z=5, 10 steps, delta=1e-5: 0.101 at order 64 vs 0.020 at order 256).
  Opacus' own default warns in that regime ("optimal order is the largest alpha") and is looser.
  Orders above 256 are cheap for the without-replacement bound (dp_accounting switches to a Stirling
  bound there); 96-256 cost the most, which is why the spacing is coarse.
"""

from __future__ import annotations

import functools

import numpy as np

SPEC_RDP_ORDERS: tuple[float, ...] = tuple(1.0 + x / 10.0 for x in range(1, 100)) + tuple(
    float(a) for a in range(12, 65)
)
LARGE_RDP_ORDERS: tuple[float, ...] = (80.0, 96.0, 128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0)
DEFAULT_RDP_ORDERS: tuple[float, ...] = SPEC_RDP_ORDERS + LARGE_RDP_ORDERS


def normalize_orders(orders: object | None) -> tuple[float, ...]:
    """A sorted tuple of distinct float orders (> 1); ``None`` means ``DEFAULT_RDP_ORDERS``."""
    if orders is None:
        return DEFAULT_RDP_ORDERS
    if type(orders) is tuple:  # the accountant is called many times with the same (already normal) tuple
        try:
            return _normalize_tuple(orders)
        except TypeError:  # unhashable items: _normalize says what is wrong
            pass
    return _normalize(orders)


@functools.lru_cache(maxsize=256)  # calibration's windows, ledgers' orders
def _normalize_tuple(orders: tuple) -> tuple[float, ...]:
    return _normalize(orders)


def _normalize(orders: object) -> tuple[float, ...]:
    try:
        values = sorted({float(a) for a in orders})  # type: ignore[union-attr]
    except (TypeError, ValueError) as err:
        raise ValueError(f"orders must be a sequence of numbers > 1, got {orders!r}") from err
    if not values:
        raise ValueError("orders must contain at least one RDP order > 1, got an empty sequence")
    bad = [a for a in values if not a > 1.0 or a != a or a == float("inf")]
    if bad:
        raise ValueError(f"orders must be finite numbers > 1, got {bad}")
    return tuple(values)


@functools.lru_cache(maxsize=256)
def orders_array(orders: tuple[float, ...]) -> np.ndarray:
    """``orders`` (a normalised tuple) as a read-only float64 array, cached."""
    out = np.array(orders, dtype=np.float64)
    out.setflags(write=False)
    return out

"""Noise calibration: the smallest noise multiplier whose accounted epsilon meets a target.

``calibrate_noise_multiplier`` is the rigorous default: bisection on z against the same accountant and
the same event (``events.dpsgd_event``) that the ledger will use, so the calibrated run never exceeds
its budget. ``heuristic_pfa_noise`` is PFA's closed form, kept only to reproduce that paper; it is not
a DP guarantee (the constants of PFA's Theorem 1 are unspecified), and whoever uses it must still
account the noise it returns with a real accountant.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence

import dp_accounting as dpa

from dpfl.privacy.accountant import (
    ACCOUNTANTS,
    Accountant,
    check_pld_supports,
    check_prv_supports,
    epsilon,
    rdp_epsilon_and_order,
)
from dpfl.privacy.events import Sampling, dpsgd_event
from dpfl.privacy.orders import normalize_orders

__all__ = ["MIN_NOISE_MULTIPLIER", "calibrate_event", "calibrate_noise_multiplier", "heuristic_pfa_noise"]

# below this noise multiplier float64 accountants break down (config/limits.py); a target that needs less noise
# protects nothing and is refused
MIN_NOISE_MULTIPLIER = _MIN_NOISE = 1e-6
_WINDOW = 4  # orders kept on each side of the optimal order while bisecting (see _rdp_search)


def _positive(name: str, value: object, *, upper: float = math.inf, inclusive_upper: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    ok_upper = v <= upper if inclusive_upper else v < upper
    if not (v > 0.0 and ok_upper and math.isfinite(v)):
        bracket = "]" if inclusive_upper else ")"
        raise ValueError(f"{name} must be in (0, {upper}{bracket}, got {v}")
    return v


def _bracket(
    eps_of: Callable[[float], float], target: float, z_start: float, max_noise: float, what: str
) -> tuple[float, float]:
    """(lo, hi) with eps_of(lo) > target >= eps_of(hi) and hi <= 2 lo, by halving/doubling from z_start."""
    z_start = min(max(z_start, _MIN_NOISE), max_noise)
    if eps_of(z_start) <= target:
        hi, lo = z_start, z_start / 2.0
        while eps_of(lo) <= target:
            hi, lo = lo, lo / 2.0
            if lo < _MIN_NOISE:
                raise ValueError(
                    f"target_epsilon={target} is met by noise_multiplier < {_MIN_NOISE} for {what}; "
                    "such a target gives no meaningful protection, lower it"
                )
        return lo, hi
    lo, hi = z_start, min(2.0 * z_start, max_noise)
    while (eps_hi := eps_of(hi)) > target:
        if hi >= max_noise:
            raise ValueError(
                f"target_epsilon={target} is unreachable for {what}: even noise_multiplier="
                f"max_noise={max_noise:g} gives epsilon={eps_hi:.6g}; raise max_noise or "
                "target_epsilon, or use fewer steps or a smaller sample rate"
            )
        lo, hi = hi, min(2.0 * hi, max_noise)
    return lo, hi


def _bisect(eps_of: Callable[[float], float], target: float, lo: float, hi: float, rel_tol: float) -> float:
    """Shrink [lo, hi] (eps_of(hi) <= target) to relative width rel_tol; return the feasible end."""
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if eps_of(mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def _window(orders: tuple[float, ...], best: float) -> tuple[float, ...]:
    i = orders.index(best)
    return orders[max(0, i - _WINDOW) : i + _WINDOW + 1]


def _rdp_search(
    make: Callable[[float], dpa.DpEvent],
    target: float,
    delta: float,
    orders: tuple[float, ...],
    rel_tol: float,
    max_noise: float,
    what: str,
) -> float:
    """Bracket with all orders, bisect on a window of orders around the optimum, check with all orders.

    A subset of orders can only give a larger epsilon, so any z accepted on the window also meets the
    target on all orders: the guarantee never depends on the window. The window only has to contain
    the optimal order at the answer for the answer to be the smallest z; if the full-order check finds
    the optimum at the window's edge, re-centre and repeat (a few times, then use all orders).
    """

    def full(z: float) -> tuple[float, float]:
        return rdp_epsilon_and_order(make(z), delta, orders)

    lo, hi = _bracket(lambda z: full(z)[0], target, 1.0, max_noise, what)
    best = full(hi)[1]
    for _ in range(4):
        window = _window(orders, best)
        hi = _bisect(lambda z, window=window: rdp_epsilon_and_order(make(z), delta, window)[0], target, lo, hi, rel_tol)
        best = full(hi)[1]
        i = window.index(best) if best in window else -1
        at_global_edge = (i == 0 and best == orders[0]) or (i == len(window) - 1 and best == orders[-1])
        if 0 < i < len(window) - 1 or at_global_edge:
            return hi
    return _bisect(lambda z: full(z)[0], target, lo, hi, rel_tol)


def calibrate_event(
    make: Callable[[float], dpa.DpEvent],
    target_epsilon: float,
    delta: float,
    *,
    accountant: Accountant = "rdp",
    what: str = "this mechanism",
    rel_tol: float = 1e-6,
    max_noise: float = 1e4,
    orders: Sequence[float] | None = None,
) -> float:
    """Smallest noise z (relative precision ``rel_tol``) with epsilon(make(z)) <= target_epsilon.

    ``make(z)`` builds the whole run's event at noise z; its epsilon must decrease in z. The answer never
    exceeds the target: every accepted z was checked against the accountant. RDP bisects on a window of
    orders (see ``_rdp_search``); PLD and PRV start from the RDP answer (they are tighter); GDP (exact, unsampled
    Gaussians only) bisects directly. ``what`` names the setting in error messages.
    """
    target = _positive("target_epsilon", target_epsilon)
    delta = _positive("delta", delta, upper=1.0)
    rel_tol = _positive("rel_tol", rel_tol, upper=0.1)
    max_noise = _positive("max_noise", max_noise)
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    probe = make(1.0)  # validate the event's arguments before any accounting
    if accountant == "pld":
        check_pld_supports(probe)
    if accountant == "prv":
        check_prv_supports(probe)
    if accountant == "gdp":
        gdp = lambda z: epsilon(make(z), delta, "gdp")  # noqa: E731
        lo, hi = _bracket(gdp, target, 1.0, max_noise, what)
        return _bisect(gdp, target, lo, hi, rel_tol)
    ords = normalize_orders(orders)
    z_rdp = _rdp_search(make, target, delta, ords, rel_tol, max_noise, what)
    if accountant == "rdp":
        return z_rdp
    # PLD and PRV are tighter than RDP, so their answer is at most about z_rdp: start there to keep the bracket
    # short (_bracket moves either way: PRV's upper bound, estimate + eps_error, can exceed RDP's at a tiny epsilon).
    # PRV bisects on its upper bound, so the answer's reported epsilon meets the target.
    tight = lambda z: epsilon(make(z), delta, accountant)  # noqa: E731
    lo, hi = _bracket(tight, target, z_rdp, max_noise, what)
    return _bisect(tight, target, lo, hi, rel_tol)


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    *,
    steps: int,
    sampling: Sampling = "poisson",
    sample_rate: float | None = None,
    population: int | None = None,
    sample_size: int | None = None,
    accountant: Accountant = "rdp",
    rel_tol: float = 1e-6,
    max_noise: float = 1e4,
    orders: Sequence[float] | None = None,
) -> float:
    """Smallest noise multiplier z (relative precision ``rel_tol``) with epsilon(z) <= target_epsilon.

    epsilon(z) is the accountant's epsilon at ``delta`` of ``dpsgd_event(z, steps, sampling=...)``;
    the result never exceeds the target and, for rel_tol=1e-6, is within 1e-3 of it (in practice
    ~1e-6). Bracketing doubles/halves from z=1, then bisects. Raises ValueError if even ``max_noise``
    does not reach the target. ``accountant="pld"`` (Poisson/full only) is about 1 s per evaluation.
    """

    def make(z: float) -> dpa.DpEvent:
        return dpsgd_event(
            z, steps, sampling=sampling, sample_rate=sample_rate, population=population, sample_size=sample_size
        )

    what = (
        f"delta={delta:g}, steps={steps}, sampling={sampling!r}"
        + (f", sample_rate={sample_rate:g}" if sample_rate is not None else "")
        + (f", sample_size={sample_size}/population={population}" if population is not None else "")
        + f", accountant={accountant!r}"
    ) if isinstance(delta, numbers.Real) else "this mechanism"
    return calibrate_event(make, target_epsilon, delta, accountant=accountant, what=what, rel_tol=rel_tol,
                           max_noise=max_noise, orders=orders)


def heuristic_pfa_noise(epsilon: float, delta: float, sample_rate: float, steps: float) -> float:
    """PFA's heuristic sigma = 10 q sqrt(T* log10(1/delta)) / epsilon. NOT a rigorous DP calibration.

    Reproduces the noise of Liu et al.'s PFA code (spec heterogeneous_dp.md 2.3: constant 10 and a
    base-10 logarithm taken from the code; Theorem 1's constants are unspecified). Use it only to
    replicate that paper, and always account the returned noise with ``accountant.epsilon``: for the
    same target it usually differs a lot from ``calibrate_noise_multiplier``.
    """
    eps = _positive("epsilon", epsilon)
    delta = _positive("delta", delta, upper=1.0)
    q = _positive("sample_rate", sample_rate, upper=1.0, inclusive_upper=True)
    t = _positive("steps", steps)
    return 10.0 * q * math.sqrt(t * math.log10(1.0 / delta)) / eps

"""R-DPCFL's per-client accounting (clustered_dpfl.md §4): one full-batch round, small-batch rounds, private selections.

Why its own module: the two stages have different sampling (round 1 uses every record in each of its K steps, so
q = 1 and each step is a plain Gaussian with RDP alpha / (2 z^2); later rounds are Poisson-subsampled at b / N_i), and
the private cluster selections are exponential mechanisms, (eps_sel^2 / 8)-zCDP each. All of it composes in RDP
over the spec's orders {1 + x/10 : x = 1..99} u {12, ..., 64}; both events are add/remove-one (Poisson and Gaussian
sums; the selection score's sensitivity 100 / (N_i - 1) bounds the change from removing one record).

The noise multiplier z must be known in round 1, so it is calibrated for the planned number of selections; the
ledger records each selection as it is made (never more than planned), so the reported epsilon never exceeds the
planned one. z is the smallest multiple of 0.01 in [0.01, 100] whose epsilon meets the target (bisection on that
grid: eps(z) <= target < eps(z - 0.01)), so rounding never overspends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import dp_accounting as dpa
import numpy as np

from dpfl.privacy.accountant import rdp_to_epsilon
from dpfl.privacy.events import dpsgd_event
from dpfl.privacy.orders import SPEC_RDP_ORDERS
from dpfl.privacy.rdp_curves import RDP_CURVES

__all__ = ["ORDERS", "TwoStagePlan", "calibrate_grid", "epsilon", "n_selections", "plan", "selection_event",
           "training_event"]

ORDERS: tuple[float, ...] = SPEC_RDP_ORDERS
Z_GRID = 0.01  # z is a multiple of this ...
Z_MAX = 100.0  # ... in [Z_GRID, Z_MAX]
Conversion = Literal["dp_accounting", "classic"]
Split = Literal["subtract", "joint"]
CONVERSIONS: tuple[str, ...] = ("dp_accounting", "classic")
SPLITS: tuple[str, ...] = ("subtract", "joint")


def training_event(z: float, n_records: int, batch: int, local_epochs: int, rounds: int,
                   round1_batch: int | Literal["full"] | None = "full") -> dpa.DpEvent:
    """A client's DP-SGD over `rounds` rounds of `local_epochs` epochs (ceil(N / b) steps each).

    `round1_batch`: "full" (round 1 takes K steps on every record, q = 1), an integer b^1 (round 1 is Poisson at
    b^1 / N for K ceil(N / b^1) steps), or None (single stage: every round at b, the baselines' accountant)."""
    _check_count("n_records", n_records, 1)
    _check_count("batch", batch, 1)
    _check_count("local_epochs", local_epochs, 1)
    _check_count("rounds", rounds, 1)
    if batch > n_records:
        raise ValueError(f"batch {batch} exceeds the client's {n_records} records")

    def stage(b: int, count: int) -> dpa.DpEvent:
        if b >= n_records:
            return dpsgd_event(z, local_epochs * count, sampling="full")
        return dpsgd_event(z, local_epochs * count * math.ceil(n_records / b), sampling="poisson",
                           sample_rate=b / n_records)

    if round1_batch is None:
        return stage(batch, rounds)
    first = n_records if round1_batch == "full" else _check_count("round1_batch", round1_batch, 1)
    events = [stage(min(first, n_records), 1)]
    if rounds > 1:
        events.append(stage(batch, rounds - 1))
    return events[0] if len(events) == 1 else dpa.ComposedDpEvent(events)


def selection_event(eps_sel: float, count: int = 1) -> dpa.DpEvent:
    """`count` exponential-mechanism selections with parameter eps_sel: each (eps_sel^2 / 8)-zCDP."""
    if not (isinstance(eps_sel, (int, float)) and math.isfinite(eps_sel) and eps_sel > 0):
        raise ValueError(f"the selection epsilon must be a finite number > 0, got {eps_sel!r}")
    one = dpa.ZCDpEvent(eps_sel**2 / 8.0, 0.0)
    return one if count == 1 else dpa.SelfComposedDpEvent(one, _check_count("count", count, 1))


def n_selections(rounds: int, clustering_rounds_ratio: float = 0.1,
                 selection_rounds: Literal["window", "every_round"] = "window") -> int:
    """Selections a run plans: floor(ratio E) + 1 (the window of §5.4) or E - 2 (every round from E_c)."""
    _check_count("rounds", rounds, 3)
    if selection_rounds == "every_round":
        return rounds - 2
    if selection_rounds != "window":
        raise ValueError(f"selection_rounds must be 'window' or 'every_round', got {selection_rounds!r}")
    if not 0 <= clustering_rounds_ratio <= 1:
        raise ValueError(f"clustering_rounds_ratio must be in [0, 1], got {clustering_rounds_ratio}")
    return math.floor(clustering_rounds_ratio * rounds) + 1


def epsilon(event: dpa.DpEvent, delta: float, conversion: Conversion = "dp_accounting") -> float:
    """epsilon at delta of an event's RDP curve over ORDERS: dp-accounting's conversion, or the classic
    min_alpha [RDP(alpha) + log(1/delta) / (alpha - 1)] (the reference code's, looser)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    curve = RDP_CURVES.curve(event, ORDERS)
    if conversion == "dp_accounting":
        return rdp_to_epsilon(ORDERS, curve, delta)[0]
    if conversion == "classic":
        a = np.asarray(ORDERS)
        return float(np.min(curve + math.log(1.0 / delta) / (a - 1.0)))
    raise ValueError(f"conversion must be one of {', '.join(CONVERSIONS)}, got {conversion!r}")


def calibrate_grid(event_of: callable, target: float, delta: float, conversion: Conversion = "dp_accounting",
                   z_max: float = Z_MAX) -> float:
    """The smallest z in {0.01, 0.02, ..., z_max} with epsilon(event_of(z)) <= target (epsilon falls as z grows)."""
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f"the target epsilon must be a finite number > 0, got {target}")
    lo, hi = 1, round(z_max / Z_GRID)  # grid indices: z = k * Z_GRID

    def ok(k: int) -> bool:
        return epsilon(event_of(k * Z_GRID), delta, conversion) <= target

    if not ok(hi):
        raise ValueError(f"no noise multiplier up to {z_max:g} reaches epsilon {target:g} at delta {delta:g}")
    if ok(lo):
        return lo * Z_GRID
    while hi - lo > 1:  # invariant: not ok(lo), ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return round(hi * Z_GRID, 2)


@dataclass(frozen=True)
class TwoStagePlan:
    """What a client's budget buys: its noise multiplier and the selection budget, fixed before round 1."""

    noise_multiplier: float
    eps_total: float
    delta: float
    eps_sel: float  # each selection's exponential-mechanism parameter
    n_sel: int  # selections planned (the ledger records at most this many)
    eps_clust: float | None  # subtract: the selections' epsilon alone; joint: None
    eps_train: float | None  # subtract: the training target eps_total - eps_clust; joint: None
    split: str
    conversion: str
    planned_epsilon: float  # the whole plan (training + n_sel selections) composed in RDP


def plan(eps_total: float, delta: float, n_records: int, batch: int, local_epochs: int, rounds: int, *,
         round1_batch: int | Literal["full"] | None = "full", selection_ratio: float = 0.03,
         clustering_rounds_ratio: float = 0.1, selection_rounds: Literal["window", "every_round"] = "window",
         selections: bool = True, split: Split = "subtract", conversion: Conversion = "dp_accounting",
         n_sel: int | None = None) -> TwoStagePlan:
    """Calibrate one client (§4). `selections=False`: no private selection (Global, Local, Oracle, MR-MTL).
    `n_sel`: the selections planned when the schedule is not §5.4's window (the reference IFCA: floor(0.1 E));
    None: `n_selections(rounds, clustering_rounds_ratio, selection_rounds)`."""
    if not (math.isfinite(eps_total) and eps_total > 0):
        raise ValueError(f"eps_total must be a finite number > 0, got {eps_total}")
    if not 0 < delta < 1 / n_records:
        raise ValueError(f"delta must be in (0, 1/N_i) = (0, {1 / n_records:.3g}) for a client with {n_records} "
                         f"records, got {delta:g}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if conversion not in CONVERSIONS:
        raise ValueError(f"conversion must be one of {', '.join(CONVERSIONS)}, got {conversion!r}")

    def train(z: float) -> dpa.DpEvent:
        return training_event(z, n_records, batch, local_epochs, rounds, round1_batch)

    if not selections:
        z = calibrate_grid(train, eps_total, delta, conversion)
        return TwoStagePlan(z, eps_total, delta, 0.0, 0, None, None, split, conversion,
                            epsilon(train(z), delta, conversion))
    if not 0 < selection_ratio < 1:
        raise ValueError(f"selection_budget_ratio must be in (0, 1), got {selection_ratio}")
    eps_sel = selection_ratio * eps_total
    if n_sel is None:
        n_sel = n_selections(rounds, clustering_rounds_ratio, selection_rounds)
    elif not (isinstance(n_sel, int) and n_sel >= 1):
        raise ValueError(f"n_sel must be an integer >= 1, got {n_sel!r}")
    chosen = selection_event(eps_sel, n_sel)
    eps_clust = eps_train = None
    if split == "subtract":
        eps_clust = epsilon(chosen, delta, conversion)
        eps_train = eps_total - eps_clust
        if eps_train < 1:
            raise ValueError(f"no training budget: the {n_sel} selections cost epsilon {eps_clust:.3g} of "
                             f"{eps_total:g}, leaving {eps_train:.3g} < 1 for training; lower "
                             "selection_budget_ratio or clustering_rounds_ratio")
        z = calibrate_grid(train, eps_train, delta, conversion)
    else:
        z = calibrate_grid(lambda v: dpa.ComposedDpEvent([train(v), chosen]), eps_total, delta, conversion)
    whole = epsilon(dpa.ComposedDpEvent([train(z), chosen]), delta, conversion)
    return TwoStagePlan(z, eps_total, delta, eps_sel, n_sel, eps_clust, eps_train, split, conversion, whole)


def _check_count(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)

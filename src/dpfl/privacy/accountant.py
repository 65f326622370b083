"""Epsilon and delta of a DP event, computed by dp_accounting's RDP or PLD accountant.

This is the only place where dpfl turns events into (epsilon, delta); nothing re-derives RDP formulas.

* ``"rdp"`` (default): per-order RDP from dp_accounting (via the curve cache of ``rdp_curves``, which
  equals ``RdpAccountant`` on the same orders), converted with dp_accounting's ``compute_epsilon`` /
  ``compute_delta``: the tight conversion of Balle et al. 2020 / Canonne-Kamath-Steinke (Prop. 12 of
  arXiv 2004.00010), plus its KL-based bound for tiny RDP. Orders: ``orders.DEFAULT_RDP_ORDERS``.
* ``"pld"``: dp_accounting's ``PLDAccountant`` (pessimistic discretisation, i.e. still an upper bound)
  with value discretisation interval ``PLD_VALUE_DISCRETIZATION`` = 1e-4 (dp_accounting's default):
  epsilon is resolved to about 1e-4 and is typically 5-15% below RDP for DP-SGD. PLD supports only
  add/remove adjacency here: fixed-size (without-replacement) sampling raises ValueError.
* ``"gdp"``: exact, for compositions of Gaussian mechanisms without sampling only (parameter noise,
  client-level uploads, central DP with every client every round). Composing G_mu_1, ..., G_mu_k is exactly
  G_mu with mu^2 = sum mu_i^2 (Dong, Roth, Su 2022), and mu-GDP converts to (epsilon, delta) exactly
  (``gdp.gdp_eps``), so this is the tightest epsilon of such a run. Sampled events raise ValueError: for
  them GDP is only a central-limit approximation, which dpfl never reports.

The neighbouring relation is read off the event (``events.neighboring_relation``), so an epsilon for
fixed-size sampling is always computed under replace-one; ``guarantee`` returns it labelled.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Literal

import dp_accounting as dpa
from dp_accounting.pld import pld_privacy_accountant as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dpfl.privacy.events import REPLACE_ONE, neighboring_relation
from dpfl.privacy.gdp import gdp_delta, gdp_eps
from dpfl.privacy.orders import normalize_orders
from dpfl.privacy.rdp_curves import RDP_CURVES

Accountant = Literal["rdp", "pld", "gdp"]
ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld", "gdp")
PLD_VALUE_DISCRETIZATION = 1e-4

__all__ = [
    "ACCOUNTANTS",
    "PLD_VALUE_DISCRETIZATION",
    "Accountant",
    "Guarantee",
    "check_gdp_supports",
    "check_pld_supports",
    "gdp_mu",
    "delta_for",
    "epsilon",
    "guarantee",
    "rdp_epsilon_and_order",
]


def _check_accountant(accountant: str) -> None:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
    return float(delta)


def check_pld_supports(event: dpa.DpEvent) -> None:
    """Raise ValueError for events PLD cannot account here (fixed-size sampling, replace-one)."""
    if neighboring_relation(event) == REPLACE_ONE:
        raise ValueError(
            "accountant='pld' does not support fixed-size sampling (SampledWithoutReplacementDpEvent, "
            "replace-one adjacency); use accountant='rdp' or Poisson sampling"
        )


def gdp_mu(event: dpa.DpEvent) -> float:
    """mu of ``event`` as a composition of plain Gaussian mechanisms (exact; inf if one has no noise).

    Raises ValueError for any sampled or other event: GDP is exact only without sampling.
    """
    if isinstance(event, dpa.NoOpDpEvent):
        return 0.0
    if isinstance(event, dpa.GaussianDpEvent):
        z = float(event.noise_multiplier)
        return math.inf if z == 0.0 else 1.0 / z
    if isinstance(event, dpa.SelfComposedDpEvent):
        return math.sqrt(int(event.count)) * gdp_mu(event.event)
    if isinstance(event, dpa.ComposedDpEvent):
        return math.sqrt(math.fsum(gdp_mu(e) ** 2 for e in event.events))
    raise ValueError(
        f"accountant='gdp' is exact only for compositions of Gaussian mechanisms without sampling; got "
        f"{type(event).__name__}: use accountant='rdp' or 'pld' for sampled mechanisms"
    )


def check_gdp_supports(event: dpa.DpEvent) -> None:
    """Raise ValueError for events the exact GDP accountant cannot account (anything sampled)."""
    gdp_mu(event)


def _pld_accountant(event: dpa.DpEvent, discretization: float) -> pld_lib.PLDAccountant:
    check_pld_supports(event)
    if not (discretization > 0.0 and math.isfinite(discretization)):
        raise ValueError(f"pld_discretization must be a finite number > 0, got {discretization!r}")
    accountant = pld_lib.PLDAccountant(
        dpa.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=discretization
    )
    accountant.compose(event)
    return accountant


def rdp_epsilon_and_order(
    event: dpa.DpEvent, delta: float, orders: Sequence[float] | None = None
) -> tuple[float, float]:
    """RDP epsilon at ``delta`` and the order that attains it."""
    delta = _check_delta(delta)
    ords = normalize_orders(orders)
    curve = RDP_CURVES.curve(event, ords)
    eps, order = rdp_lib.compute_epsilon(ords, curve, delta)
    return float(eps), float(order)


def epsilon(
    event: dpa.DpEvent,
    delta: float,
    accountant: Accountant = "rdp",
    orders: Sequence[float] | None = None,
    *,
    pld_discretization: float = PLD_VALUE_DISCRETIZATION,
) -> float:
    """Smallest epsilon the accountant certifies for ``event`` at ``delta`` (inf if there is no noise)."""
    _check_accountant(accountant)
    delta = _check_delta(delta)
    if accountant == "rdp":
        return rdp_epsilon_and_order(event, delta, orders)[0]
    if accountant == "gdp":
        mu = gdp_mu(event)
        return math.inf if math.isinf(mu) else gdp_eps(mu, delta)
    return float(_pld_accountant(event, pld_discretization).get_epsilon(delta))


def delta_for(
    event: dpa.DpEvent,
    epsilon: float,
    accountant: Accountant = "rdp",
    orders: Sequence[float] | None = None,
    *,
    pld_discretization: float = PLD_VALUE_DISCRETIZATION,
) -> float:
    """Smallest delta the accountant certifies for ``event`` at ``epsilon`` (>= 0)."""
    _check_accountant(accountant)
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not float(epsilon) >= 0.0:
        raise ValueError(f"epsilon must be a number >= 0, got {epsilon!r}")
    eps = float(epsilon)
    if accountant == "rdp":
        ords = normalize_orders(orders)
        return float(rdp_lib.compute_delta(ords, RDP_CURVES.curve(event, ords), eps)[0])
    if accountant == "gdp":
        mu = gdp_mu(event)
        return 1.0 if math.isinf(mu) else gdp_delta(eps, mu)
    return float(_pld_accountant(event, pld_discretization).get_delta(eps))


@dataclasses.dataclass(frozen=True)
class Guarantee:
    """An (epsilon, delta)-DP statement with everything needed to read it correctly."""

    epsilon: float
    delta: float
    relation: str  # "add_remove" or "replace_one": epsilons under different relations are not comparable
    accountant: str
    unit: str = "sample"  # what one "record" is: a sample of a client, or a whole client

    def __str__(self) -> str:
        adjacency = "replace-one" if self.relation == REPLACE_ONE else "add/remove-one"
        return (
            f"({self.epsilon:.6g}, {self.delta:.3g})-DP, {self.unit}-level, {adjacency} adjacency, "
            f"{self.accountant.upper()} accountant"
        )


def guarantee(
    event: dpa.DpEvent,
    delta: float,
    accountant: Accountant = "rdp",
    orders: Sequence[float] | None = None,
    *,
    unit: str = "sample",
) -> Guarantee:
    """``epsilon(event, delta, ...)`` labelled with its neighbouring relation, accountant and unit."""
    eps = epsilon(event, delta, accountant, orders)
    return Guarantee(eps, float(delta), neighboring_relation(event), accountant, unit)

"""Epsilon and delta of a DP event, computed by dp_accounting's RDP or PLD accountant.

This is the only place where dpfl turns events into (epsilon, delta); nothing derives new RDP bounds
(``rdp_curves`` evaluates dp_accounting's own formulas, vectorised over the orders, and stably where
dp_accounting's arithmetic fails).

* ``"rdp"`` (default): per-order RDP of dp_accounting's bounds (via the curve cache of ``rdp_curves``, which
  equals ``RdpAccountant`` on the same orders), converted with dp_accounting's ``compute_epsilon``
  (vectorised over the orders by ``rdp_to_epsilon``, same bounds) / ``compute_delta``: the tight conversion of
  Balle et al. 2020 / Canonne-Kamath-Steinke (Prop. 12 of arXiv 2004.00010), plus its KL-based bound for tiny RDP.
  Orders: ``orders.DEFAULT_RDP_ORDERS``.
  For a huge noise multiplier the RDP of an order can be below ~1e-16, where dp_accounting's
  ``compute_delta`` takes ``log(0)``; those orders are converted here with the same bounds written stably.
  How the curves stay valid over the whole float range of z is described in ``rdp_curves``.
* ``"pld"``: dp_accounting's ``PLDAccountant`` (pessimistic discretisation, i.e. still an upper bound)
  with value discretisation interval ``PLD_VALUE_DISCRETIZATION`` = 1e-4 (dp_accounting's default):
  epsilon is resolved to about 1e-4 and is typically 5-15% below RDP for DP-SGD. PLD supports only
  add/remove adjacency here: fixed-size (without-replacement) sampling raises ValueError.
  *Memory/time budget.* The PLD of a Gaussian with multiplier z spans about ``1/(2 z^2) + 15/z`` nats of
  privacy loss, i.e. that many / 1e-4 grid points, and a self-composition's FFT grows with the number of
  steps: z = 0.001 would need ~38 GiB. dpfl builds the PLD with the same dp_accounting calls, in the same
  order, as ``PLDAccountant`` (so every value within the budget is identical to it), but first computes
  each array's length (a mechanism's from its connect-the-dots bounds, a self-composition's from
  dp_accounting's own Chernoff truncation bounds, a composition's as the sum) and never builds one above
  ``PLD_MAX_STEP_POINTS`` = 2^19 points per mechanism or ``PLD_MAX_POINTS`` = 2^23 per composed PMF
  (building one mechanism then takes at most ~5 s, and peak memory stays below ~1 GB).
  If one would, the discretisation is multiplied by a power of two until everything fits: every privacy
  loss is still rounded *up* onto the coarser grid (pessimistic), so epsilon stays a valid upper bound,
  just resolved more coarsely (it is within roughly ``steps x discretisation`` of the fine one;
  ``pld_discretization(event)`` returns the one used). DP-SGD settings with z >= 0.5 and up to 10^4
  steps fit at 1e-4; z = 0.001, 100 steps at q = 0.1 uses a grid of ~3 (in ~6 s instead of 38 GiB). Beyond
  ``PLD_MAX_DISCRETIZATION`` (multipliers below ~2e-5) and for
  z < ``rdp_curves.Z_NO_PRIVACY`` the epsilon is +inf (delta 1); multipliers above ``PLD_MAX_NOISE`` = 1e100
  are accounted at 1e100 (valid: adding noise is post-processing; dp_accounting overflows near 1e200).
  PLD's own tail truncation (mass ~1e-15 moved to infinite loss) means delta below ~1e-15 gives inf.
* ``"gdp"``: exact, for compositions of Gaussian mechanisms without sampling only (parameter noise,
  client-level uploads, central DP with every client every round). Composing G_mu_1, ..., G_mu_k is exactly
  G_mu with mu^2 = sum mu_i^2 (Dong, Roth, Su 2022), and mu-GDP converts to (epsilon, delta) exactly
  (``gdp.gdp_eps``), so this is the tightest epsilon of such a run. Sampled events raise ValueError: for
  them GDP is only a central-limit approximation, which dpfl never reports. Numerics: Brent's root is
  stepped right by its tolerance when it lands left of the true one; for mu > ``GDP_MU_CLOSED_FORM`` (z
  below ~1e-4 x sqrt(steps)) the log-space delta cancels O(mu^2) terms, so epsilon is the closed-form
  bound ``mu^2/2 + mu Phi^{-1}(1 - delta)`` (above the exact value by about 1 nat; inf once mu^2 overflows);
  for mu < ``GDP_MU_TINY`` delta is bounded by ``min(delta(0), Phi(mu/2 - eps/mu))``.

* ``"prv"``: the PRV accountant of Gopi, Lee, Wutschitz 2021 (``dpfl.privacy.prv``, on the ``prv-accountant``
  package): Gaussian and Poisson-subsampled Gaussian mechanisms only (add/remove adjacency; anything else raises
  ValueError). It brackets the true epsilon, ``lower <= eps <= upper`` (``prv.prv_bounds``); ``epsilon`` returns
  ``upper`` (a guarantee, within ~2 x ``PRV_EPS_ERROR`` = 0.02 of the true value). ``delta_for`` refuses it.

The neighbouring relation is read off the event (``events.neighboring_relation``), so an epsilon for
fixed-size sampling is always computed under replace-one; ``guarantee`` returns it labelled.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
from collections.abc import Sequence
from typing import Literal

import dp_accounting as dpa
import numpy as np
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import pld_privacy_accountant as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as plm
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy import fft
from scipy.stats import norm

from dpfl.privacy import gdp as gdp_lib
from dpfl.privacy.events import REPLACE_ONE, neighboring_relation
from dpfl.privacy.gdp import gdp_delta, gdp_eps, gdp_log_delta
from dpfl.privacy.orders import normalize_orders, orders_array
from dpfl.privacy.prv import check_prv_supports, prv_bounds
from dpfl.privacy.rdp_curves import RDP_CURVES, Z_NO_PRIVACY

Accountant = Literal["rdp", "pld", "gdp", "prv"]
ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld", "gdp", "prv")
PLD_VALUE_DISCRETIZATION = 1e-4
PLD_MAX_STEP_POINTS = 2**19  # points of one mechanism's PMF (dp_accounting builds it at ~5 us a point)
PLD_MAX_POINTS = 2**23  # points of a composed PMF / FFT length (~128 MiB per complex array, ~0.7 GB peak)
PLD_MAX_DISCRETIZATION = 400.0  # coarsest grid (dp_accounting's exp(discretization) overflows above ~709)
PLD_MAX_NOISE = 1e100  # larger multipliers are accounted at this one (valid: more noise never hurts)
GDP_MU_CLOSED_FORM = 1e4  # above: the closed-form upper bound on the GDP epsilon
GDP_MU_TINY = 1e-6  # below: an upper bound on the GDP delta that stays accurate
_LOG = logging.getLogger(__name__)

__all__ = [
    "ACCOUNTANTS",
    "PLD_VALUE_DISCRETIZATION",
    "Accountant",
    "Guarantee",
    "check_gdp_supports",
    "check_pld_supports",
    "check_prv_supports",
    "gdp_mu",
    "delta_for",
    "pld_discretization",
    "epsilon",
    "guarantee",
    "rdp_epsilon_and_order",
    "rdp_to_epsilon",
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
        return math.hypot(*(gdp_mu(e) for e in event.events))  # sqrt(sum mu_i^2) without over- or underflow
    raise ValueError(
        f"accountant='gdp' is exact only for compositions of Gaussian mechanisms without sampling; got "
        f"{type(event).__name__}: use accountant='rdp' or 'pld' for sampled mechanisms"
    )


def check_gdp_supports(event: dpa.DpEvent) -> None:
    """Raise ValueError for events the exact GDP accountant cannot account (anything sampled)."""
    gdp_mu(event)


class _PldTooLarge(Exception):
    """Raised while building a PLD whose arrays would exceed the budget; ``factor`` = size / budget."""

    def __init__(self, factor: float) -> None:
        super().__init__(factor)
        self.factor = factor


def _check_pld_discretization(discretization: float) -> float:
    if (
        isinstance(discretization, bool)
        or not isinstance(discretization, numbers.Real)
        or not 0.0 < float(discretization) <= PLD_MAX_DISCRETIZATION
    ):
        raise ValueError(
            f"pld_discretization must be a number in (0, {PLD_MAX_DISCRETIZATION:g}], got {discretization!r}"
        )
    return float(discretization)


_Leaf = tuple[bool, float, float, int]  # (Poisson-sampled?, q, z, count); z = inf: non-private


def _pld_leaves(event: dpa.DpEvent, count: int, out: list[_Leaf]) -> bool:
    """Flatten ``event`` into leaves in PLDAccountant's order; False if a leaf is not a (Poisson-sampled)
    Gaussian (the caller then uses dp_accounting's PLDAccountant as is)."""
    if isinstance(event, dpa.NoOpDpEvent):
        return True
    if isinstance(event, dpa.NonPrivateDpEvent):
        out.append((False, 1.0, math.inf, count))
        return True
    if isinstance(event, dpa.SelfComposedDpEvent):
        return _pld_leaves(event.event, count * int(event.count), out)
    if isinstance(event, dpa.ComposedDpEvent):
        return all(_pld_leaves(e, count, out) for e in event.events)
    if isinstance(event, dpa.GaussianDpEvent):
        sampled, q, z = False, 1.0, float(event.noise_multiplier)
    elif isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        sampled, q, z = True, float(event.sampling_probability), float(event.event.noise_multiplier)
    else:
        return False
    if not z >= 0.0 or not 0.0 <= q <= 1.0:
        raise ValueError(f"noise multiplier must be >= 0 and sampling probability in [0, 1], got {event!r}")
    if q == 0.0 or count == 0 or z == math.inf:
        return True  # nobody sampled, composed zero times, or infinite noise: no privacy loss
    if z < Z_NO_PRIVACY:
        out.append((sampled, q, math.inf, count))  # as the RDP curves do: +inf (the loss exceeds any float grid)
        return True
    out.append((sampled, q, min(z, PLD_MAX_NOISE), count))
    return True


def _pld_points(q: float, sigma: float, discretization: float) -> int:
    """Points of the PMF(s) dp_accounting builds for one (sub)sampled Gaussian: from its connect-the-dots
    bounds, without building anything."""
    points = 0
    adjacencies = [plm.AdjacencyType.REMOVE] + ([plm.AdjacencyType.ADD] if q < 1.0 else [])
    for adjacency in adjacencies:
        bounds = plm.GaussianPrivacyLoss(
            sigma, sensitivity=1, pessimistic_estimate=True, sampling_prob=q, adjacency_type=adjacency
        ).connect_dots_bounds()
        span = (bounds.epsilon_upper - bounds.epsilon_lower) / discretization
        points = max(points, int(span) + 2 if math.isfinite(span) else 2**62)
    return points


def _dense_length(pmf: pld_pmf.PLDPmf) -> int:
    """Length of ``pmf`` as a dense array (what a convolution allocates)."""
    if isinstance(pmf, pld_pmf.SparsePLDPmf):
        keys = pmf._loss_probs  # noqa: SLF001 (dp_accounting exposes no accessor)
        return max(keys) - min(keys) + 1 if keys else 1
    return pmf.size


def _pld_build(leaves: list[_Leaf], discretization: float) -> pld_lib.PLD.PrivacyLossDistribution:
    """Exactly what ``PLDAccountant.compose`` computes (same calls, same order), refusing any array larger
    than the budget before allocating it (``_PldTooLarge``)."""
    pld_mod = pld_lib.PLD
    relation = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    pld = pld_mod.identity(value_discretization_interval=discretization)
    for sampled, q, z, count in leaves:
        sigma = z if sampled else z / math.sqrt(count)  # dp_accounting composes plain Gaussians analytically
        step = _pld_points(q, sigma, discretization)
        if step > PLD_MAX_STEP_POINTS:
            raise _PldTooLarge(step / PLD_MAX_STEP_POINTS)
        if not sampled:
            leaf = pld_mod.from_gaussian_mechanism(
                standard_deviation=sigma, value_discretization_interval=discretization, neighboring_relation=relation
            )
        else:
            leaf = pld_mod.from_gaussian_mechanism(
                standard_deviation=z, value_discretization_interval=discretization, sampling_prob=q,
                neighboring_relation=relation,
            )
            if count > 1:
                pmfs = [leaf._pmf_remove] if leaf._symmetric else [leaf._pmf_remove, leaf._pmf_add]  # noqa: SLF001
                for pmf in pmfs:
                    if pmf.size ** min(count, 64) <= 1000:  # stays sparse (dp_accounting's _MAX_PMF_SPARSE_SIZE)
                        continue
                    probs = pmf.to_dense_pmf()._probs  # noqa: SLF001
                    lower, upper = pld_common.compute_self_convolve_bounds(probs, count, 1e-15)
                    length = fft.next_fast_len(max(upper - lower + 1, len(probs)))
                    if length > PLD_MAX_POINTS:
                        raise _PldTooLarge(length / PLD_MAX_POINTS)
                leaf = leaf.self_compose(count)
        for mine, other in ((pld._pmf_remove, leaf._pmf_remove), (pld._pmf_add, leaf._pmf_add)):  # noqa: SLF001
            length = _dense_length(mine) + _dense_length(other) - 1
            if length > PLD_MAX_POINTS:
                raise _PldTooLarge(length / PLD_MAX_POINTS)
        pld = pld.compose(leaf)
    return pld


def _pld(event: dpa.DpEvent, discretization: float) -> tuple[pld_lib.PLD.PrivacyLossDistribution | None, float]:
    """The event's PLD and the discretisation used, or ``(None, inf)`` if it is non-private (epsilon inf).

    The discretisation is the requested one unless the PLD would exceed the budget (``PLD_MAX_STEP_POINTS``
    points per mechanism, ``PLD_MAX_POINTS`` per composed PMF); then it is doubled until it fits (at most
    ``PLD_MAX_DISCRETIZATION``, beyond which the event counts as non-private). A coarser grid rounds every
    loss up to a multiple of it, so the result stays a valid (looser) upper bound.
    """
    check_pld_supports(event)
    discretization = _check_pld_discretization(discretization)
    leaves: list[_Leaf] = []
    if not _pld_leaves(event, 1, leaves):  # another mechanism (Laplace, ...): dp_accounting as is
        accountant = pld_lib.PLDAccountant(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE, discretization)
        accountant.compose(event)
        return (None, math.inf) if accountant._contains_non_dp_event else (accountant._pld, discretization)  # noqa: SLF001
    if any(z == math.inf for _, _, z, _ in leaves):
        return None, math.inf
    while True:
        try:
            return _pld_build(leaves, discretization), discretization
        except _PldTooLarge as too_large:
            discretization *= 2.0 ** max(1, math.ceil(math.log2(too_large.factor)))
            if discretization > PLD_MAX_DISCRETIZATION:
                return None, math.inf
            _LOG.info("PLD too large for the budget: value discretisation raised to %g", discretization)


def pld_discretization(event: dpa.DpEvent, discretization: float = PLD_VALUE_DISCRETIZATION) -> float:
    """The value discretisation ``accountant='pld'`` uses for ``event`` (inf if it reports epsilon = inf)."""
    return _pld(event, discretization)[1]


def _gdp_epsilon(mu: float, delta: float) -> float:
    """``gdp.gdp_eps``, made a certified upper bound at every mu.

    * Brent's root is within ``XTOL + 4 eps |x|`` of the true one on either side: if delta(eps) still
      exceeds the target, step to the right end of that interval.
    * For ``mu > GDP_MU_CLOSED_FORM`` the log-space delta(eps) cancels O(mu^2) terms (and mu^2 overflows
      above ~1e154): use ``mu^2/2 + mu Phi^{-1}(1 - delta)``, which drops the negative term of delta(eps)
      and so bounds the exact epsilon from above (by about 1, i.e. 2/mu^2 relative).
    """
    if math.isinf(mu):
        return math.inf
    if mu > GDP_MU_CLOSED_FORM:
        return mu * (mu / 2.0 + float(norm.isf(delta)))  # inf once it overflows
    eps = gdp_eps(mu, delta)
    if eps > 0.0 and gdp_log_delta(eps, mu) > math.log(delta):
        eps += gdp_lib.XTOL + 4.0 * np.finfo(float).eps * eps
    return float(eps)  # a Python float: a NumPy one in a run's rows made its checkpoint unloadable


def _gdp_delta(eps: float, mu: float) -> float:
    """``gdp.gdp_delta`` where it is accurate; for a tiny mu the bound min(delta(0), Phi(mu/2 - eps/mu)),
    delta(0) = erf(mu / (2 sqrt 2)) (delta(eps) only decreases, and drops a negative term)."""
    if math.isinf(mu):
        return 1.0
    if mu == 0.0:
        return 0.0
    if mu < GDP_MU_TINY:
        with np.errstate(over="ignore", divide="ignore"):
            return min(math.erf(mu / (2.0 * math.sqrt(2.0))), float(norm.cdf(mu / 2.0 - eps / mu)))
    return gdp_delta(eps, mu)


def _rdp_delta(orders: Sequence[float], curve: np.ndarray, eps: float) -> float:
    """dp_accounting's ``compute_delta``, also for RDP values too small for it.

    Its KL term ``0.5 * log1p(-exp(-r))`` is ``log(0)`` (ValueError) once ``exp(-r)`` rounds to 1, i.e. for
    ``0 < r < ~1.1e-16`` (a huge noise multiplier). Those orders are converted here with the same two bounds,
    the KL one written as ``0.5 * log(-expm1(-r))``; every other order goes through dp_accounting unchanged.
    """
    curve = np.asarray(curve, dtype=np.float64)
    tiny = np.array([r > 0.0 and math.exp(-r) == 1.0 for r in curve], dtype=bool)  # as dp_accounting computes it
    if not tiny.any():
        return float(rdp_lib.compute_delta(orders, curve, eps)[0])
    log_deltas = []
    for a, r in zip(np.asarray(orders)[tiny], curve[tiny], strict=True):
        log_delta = 0.5 * math.log(-math.expm1(-r))
        if a > 1.01:  # dp_accounting's condition for its Proposition-12 bound
            log_delta = min(log_delta, (a - 1) * (r - eps + math.log1p(-1 / a)) - math.log(a))
        log_deltas.append(log_delta)
    best = min(1.0, math.exp(min(log_deltas)))
    if (~tiny).any():
        best = min(best, float(rdp_lib.compute_delta(list(np.asarray(orders)[~tiny]), curve[~tiny], eps)[0]))
    return best


def rdp_to_epsilon(orders: tuple[float, ...], curve: np.ndarray, delta: float) -> tuple[float, float]:
    """dp_accounting's ``compute_epsilon(orders, curve, delta)`` for a normalised orders tuple and 0 < delta < 1,
    vectorised over the orders (the same bounds, order by order, and the same choice of the first minimum).

    Per order: 0 if the KL bound already gives delta (``delta^2 + expm1(-r) > 0``); else
    ``r + log1p(-1/a) - log(delta a) / (a - 1)`` for a > 1.01 (Balle et al. 2020, Prop. 12 of
    arXiv 2004.00010), inf for smaller orders. Returns (epsilon, order), epsilon >= 0. A negative or NaN RDP
    raises (as dp_accounting does for a negative one): it would otherwise turn into epsilon 0.
    """
    a = orders_array(orders)
    r = np.asarray(curve, dtype=np.float64)
    if r.shape != a.shape:
        raise ValueError(f"an RDP curve needs one value per order: {r.shape} values for {a.shape} orders")
    if np.isnan(r).any() or (r < 0).any():
        raise ValueError(f"RDP must be >= 0 at every order, got {r[np.isnan(r) | (r < 0)][:3]}")
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        eps = r + _log1p_minus_inverse(orders) - np.log(delta * a) / (a - 1)
        eps = np.where(a > 1.01, eps, np.inf)
        eps = np.where(delta**2 + np.expm1(-r) > 0, 0.0, eps)
    best = int(np.argmin(eps))
    return max(0.0, float(eps[best])), float(a[best])


@functools.lru_cache(maxsize=256)
def _log1p_minus_inverse(orders: tuple[float, ...]) -> np.ndarray:
    """log1p(-1 / a) per order (read-only)."""
    out = np.log1p(-1.0 / orders_array(orders))
    out.setflags(write=False)
    return out


def rdp_epsilon_and_order(
    event: dpa.DpEvent, delta: float, orders: Sequence[float] | None = None
) -> tuple[float, float]:
    """RDP epsilon at ``delta`` and the order that attains it."""
    delta = _check_delta(delta)
    ords = normalize_orders(orders)
    return rdp_to_epsilon(ords, RDP_CURVES.curve(event, ords), delta)


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
        return _gdp_epsilon(gdp_mu(event), delta)
    if accountant == "prv":
        return prv_bounds(event, delta).upper  # the upper bound: a guarantee
    pld, _ = _pld(event, pld_discretization)
    return math.inf if pld is None else float(pld.get_epsilon_for_delta(delta))


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
    if accountant == "prv":
        raise ValueError("accountant='prv' computes epsilon at a given delta only; use accountant='pld' for delta_for")
    if accountant == "rdp":
        ords = normalize_orders(orders)
        return _rdp_delta(ords, RDP_CURVES.curve(event, ords), eps)
    if accountant == "gdp":
        return _gdp_delta(eps, gdp_mu(event))
    pld, _ = _pld(event, pld_discretization)
    return 1.0 if pld is None else min(1.0, float(pld.get_delta_for_epsilon(eps)))  # a coarse grid rounds past 1


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

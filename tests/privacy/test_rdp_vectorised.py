"""The vectorised RDP curves and conversion (rdp_curves, accountant.rdp_to_epsilon) against their references.

* On a 200-case grid (Poisson, fixed size with small and large populations, plain Gaussian; q in [1e-4, 1],
  z in [0.3, 50]; dpfl's default orders) every curve equals dp_accounting's ``RdpAccountant`` to 1e-9 relative
  where the module evaluates dp_accounting's formulas (z up to the switch noise). dp_accounting's own Poisson
  series loses digits there for a small q (relative error up to ~4e-15 z^2 / q, 3e-9 at the switch): that
  allowance is added, and at those points the exact value (60 digits) shows it is dp_accounting's rounding.
  Above the switch the curves are ``min(curve(switch), B(z))``; there the reference is the previous (scalar)
  implementation of B, ``previous_rdp_bounds``.
* Forward differences against exact arithmetic, across the quadrature / alternating-sum boundary.
* ``rdp_to_epsilon`` equals dp_accounting's ``compute_epsilon``; the ledger's shortcuts change no epsilon.
Nothing here is timed (benchmarks/accounting.py measures the speed).
"""

import itertools
import math

import dp_accounting as dpa
import mpmath as mp
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dpfl.privacy import DEFAULT_RDP_ORDERS, PrivacyLedger, RdpCurveCache, dpsgd_event, epsilon
from dpfl.privacy.accountant import rdp_to_epsilon
from dpfl.privacy.orders import normalize_orders
from dpfl.privacy.rdp_curves import _log_forward_differences, switch_noise

from . import previous_rdp_bounds as previous

ORDERS = DEFAULT_RDP_ORDERS
POISSON_QS = (1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 0.7, 1.0)
POISSON_ZS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.5, 4.0, 8.0, 20.0, 50.0)
# (population, sample size): small populations (q up to 1) and large ones (q down to 1e-4)
FIXED_SIZES = ((10, 1), (10, 10), (60, 8), (200, 64), (1200, 8), (1200, 600), (60_000, 64), (1_000_000, 100))
FIXED_ZS = (0.3, 0.6, 1.0, 2.0, 4.0, 7.9, 12.0, 20.0, 35.0, 50.0)  # nominal z: the event carries z / 2
GAUSSIAN_ZS = tuple(float(z) for z in np.geomspace(0.3, 50.0, 20))
RELATIONS = {"poisson": dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
             "gaussian": dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
             "fixed": dpa.NeighboringRelation.REPLACE_ONE}
DP_ACCOUNTING_ROUNDING = 4e-15  # x z^2 / q: dp_accounting's own relative error in its Poisson series


pytestmark = pytest.mark.usefixtures("quiet_absl")


def _grid():
    cases = [("poisson", dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), q, z)
             for q, z in itertools.product(POISSON_QS, POISSON_ZS)]
    cases += [("fixed", dpa.SampledWithoutReplacementDpEvent(n, m, dpa.GaussianDpEvent(z / 2)), m / n, z / 2)
              for (n, m), z in itertools.product(FIXED_SIZES, FIXED_ZS)]
    cases += [("gaussian", dpa.GaussianDpEvent(z), 1.0, z) for z in GAUSSIAN_ZS]
    return cases


GRID = _grid()


def _dp_accounting(event, kind):
    accountant = rdp_lib.RdpAccountant(list(ORDERS), RELATIONS[kind])
    accountant.compose(event)
    return np.asarray(accountant.rdp, dtype=float)


def _with_noise(event, z):
    if isinstance(event, dpa.PoissonSampledDpEvent):
        return dpa.PoissonSampledDpEvent(event.sampling_probability, dpa.GaussianDpEvent(z))
    return dpa.SampledWithoutReplacementDpEvent(event.source_dataset_size, event.sample_size, dpa.GaussianDpEvent(z))


_SWITCH_REFERENCES = {}


def _reference(kind, event, q, z):
    """dp_accounting below the switch noise; above it min(dp_accounting at the switch, previous B(z))."""
    z_switch = switch_noise(kind, q)
    if z <= z_switch:
        return _dp_accounting(event, kind)
    key = (kind, q)
    if key not in _SWITCH_REFERENCES:
        _SWITCH_REFERENCES[key] = _dp_accounting(_with_noise(event, z_switch), kind)
    bound = previous._poisson_bound(q, z, ORDERS) if kind == "poisson" else previous._wor_bound(q, z, ORDERS)
    return np.minimum(_SWITCH_REFERENCES[key], bound)


def _exact_poisson(q, z, order):
    with mp.workdps(60):
        q, z = mp.mpf(q), mp.mpf(z)
        s = mp.fsum(mp.binomial(order, i) * q**i * (1 - q) ** (order - i) * mp.expm1(mp.mpf(i * i - i) / (2 * z * z))
                    for i in range(2, order + 1))
        return float(mp.log1p(s) / (order - 1))


def test_the_grid_has_200_cases_covering_the_ranges():
    assert len(GRID) == 200
    qs = [q for _, _, q, _ in GRID]
    zs = [z * (2 if kind == "fixed" else 1) for kind, _, _, z in GRID]  # nominal z
    assert min(qs) == pytest.approx(1e-4) and max(qs) == 1.0
    assert min(zs) == pytest.approx(0.3) and max(zs) == pytest.approx(50.0)
    assert {n for n, _ in FIXED_SIZES} >= {10, 60, 200, 1_000_000}
    assert {kind for kind, *_ in GRID} == {"poisson", "fixed", "gaussian"}


@pytest.mark.parametrize("kind", ["poisson", "fixed", "gaussian"])
def test_curves_agree_with_dp_accounting_on_the_grid(kind):
    worst, worst_plain = 0.0, 0.0
    for k, event, q, z in GRID:
        if k != kind:
            continue
        ours = RdpCurveCache().curve(event, ORDERS)
        ref = _reference(kind, event, q, z)
        finite = np.isfinite(ref)
        assert np.array_equal(np.isfinite(ours), finite), (kind, q, z)  # the same unused (inf) orders
        rel = np.abs(ours[finite] - ref[finite]) / ref[finite]
        allowance = 0.0
        if kind == "poisson" and q < 1.0 and z <= switch_noise(kind, q):
            allowance = DP_ACCOUNTING_ROUNDING * z * z / q
        assert rel.max() <= 1e-9 + allowance, (kind, q, z, float(rel.max()), ORDERS[int(np.argmax(rel))])
        worst = max(worst, float(rel.max()))
        if allowance <= 1e-10:
            worst_plain = max(worst_plain, float(rel.max()))
        else:  # where dp_accounting rounds, ours is the accurate one
            for order in (2, 16, 45, 256):
                j = ORDERS.index(float(order))
                assert ours[j] == pytest.approx(_exact_poisson(q, z, order), rel=1e-11), (q, z, order)
    print(f"{kind}: max relative difference {worst:.2e} "
          f"({worst_plain:.2e} where dp_accounting's rounding is negligible)")


def test_non_converging_fractional_orders_are_unused_as_in_dp_accounting():
    """dp_accounting stops its fractional-order series after 1000 terms and drops the order (inf)."""
    event = dpa.PoissonSampledDpEvent(0.5, dpa.GaussianDpEvent(0.5))
    ours, ref = RdpCurveCache().curve(event, ORDERS), _dp_accounting(event, "poisson")
    assert np.isinf(ref).any()
    assert np.array_equal(np.isinf(ours), np.isinf(ref))
    np.testing.assert_allclose(ours[np.isfinite(ref)], ref[np.isfinite(ref)], rtol=1e-12)


def _exact_log_difference(sigma, k):
    """log Delta^k f(-1), f(x) = exp(x (x + 1) / (2 sigma^2)), by the alternating sum at enough digits."""
    c = 1 / (2 * sigma**2)
    log_terms = [math.lgamma(k + 1) - math.lgamma(j + 1) - math.lgamma(k - j + 1) + c * (j - 1) * j
                 for j in range(k + 1)]
    top = max(log_terms)
    estimate = float(_log_forward_differences(sigma, k)[k])  # only sets the working precision
    dps = int((top + math.log(k + 1) - estimate) / math.log(10)) + 40
    with mp.workdps(dps):
        cc = 1 / (2 * mp.mpf(sigma) ** 2)
        exact = mp.fsum((-1) ** (k - j) * mp.binomial(k, j) * mp.exp(cc * (j - 1) * j) for j in range(k + 1))
        return float(mp.log(exact))


@pytest.mark.parametrize("sigma", [0.15, 0.3, 0.49, 0.5, 0.6, 1.0, 2.0, 4.0, 5.0, 10.0, 50.0, 1e3, 1e6])
def test_forward_differences_match_exact_arithmetic(sigma):
    ks = [2, 4, 10, 32, 128, 256] + ([1024] if sigma in (5.0, 50.0) else [])
    ours = _log_forward_differences(sigma, max(ks))
    for k in ks:
        exact = _exact_log_difference(sigma, k)
        assert ours[k] == pytest.approx(exact, rel=1e-13, abs=1e-10), (sigma, k)


def test_rdp_to_epsilon_is_compute_epsilon():
    rng = np.random.default_rng(0)
    orders = normalize_orders(ORDERS)
    curves = [np.zeros(len(orders)), np.full(len(orders), np.inf), np.asarray(orders) * 1e-20]
    for scale in (1e-8, 1e-3, 0.1, 1.0, 30.0):
        curves.append(np.asarray(orders) * scale * rng.uniform(0.5, 1.5, len(orders)))
    with_inf = curves[5].copy()
    with_inf[:40] = np.inf
    curves.append(with_inf)
    for curve, delta in itertools.product(curves, (1e-300, 1e-12, 1e-5, 0.01, 0.5)):
        ours = rdp_to_epsilon(orders, curve, delta)
        theirs = rdp_lib.compute_epsilon(orders, curve, delta)
        assert ours[0] == pytest.approx(float(theirs[0]), rel=1e-12, abs=0.0), (delta, ours, theirs)
        if ours[0] not in (0.0, math.inf):
            assert ours[1] == float(theirs[1])


@pytest.mark.parametrize("bad", [-1e-12, math.nan])
def test_rdp_to_epsilon_refuses_a_negative_or_nan_order(bad):
    """A negative or NaN RDP value is a bug upstream; converting it would report epsilon 0 (dp_accounting's
    compute_epsilon returns 0 for a NaN curve), so the conversion raises instead."""
    orders = normalize_orders(ORDERS)
    curve = np.asarray(orders) * 0.1
    curve[7] = bad
    with pytest.raises(ValueError, match="RDP must be >= 0"):
        rdp_to_epsilon(orders, curve, 1e-5)


def test_ledger_checks_the_budget_with_the_value_it_then_reports():
    """would_exceed's epsilon for a recorded event is the spent epsilon after recording it (one computation)."""
    events = [dpsgd_event(z, 50, sampling="fixed", population=1200, sample_size=8) for z in (1.1, 20.0)]
    ledger = PrivacyLedger(range(2), 1e-5, 5.0)
    for r in range(4):
        for c, event in enumerate(events):
            checked = ledger.epsilon_if(c, event)
            ledger.record(c, r, event)
            assert ledger.spent(c) == checked
            direct = epsilon(dpa.SelfComposedDpEvent(event, r + 1), 1e-5)
            assert checked == pytest.approx(direct, rel=1e-12)
        ledger.close_round(r)
    ev = dpsgd_event(1.0, 10, sampling="poisson", sample_rate=0.01)  # an event the ledger has never seen
    assert ledger.epsilon_if(0, events[0]) == pytest.approx(epsilon(dpa.SelfComposedDpEvent(events[0], 5), 1e-5),
                                                            rel=1e-12)
    fresh = PrivacyLedger(range(1), 1e-5, 5.0)
    assert fresh.epsilon_if(0, ev) == epsilon(ev, 1e-5)


def test_normalized_orders_are_reused_and_errors_still_raise():
    assert normalize_orders((3, 2.0, 2)) == (2.0, 3.0)
    assert normalize_orders((3, 2.0, 2)) == (2.0, 3.0)  # from the cache
    assert normalize_orders(ORDERS) is normalize_orders(tuple(ORDERS))
    with pytest.raises(ValueError, match="finite numbers > 1"):
        normalize_orders((1.0, 2.0))
    with pytest.raises(ValueError, match="finite numbers > 1"):
        normalize_orders((1.0, 2.0))  # an invalid tuple is never cached
    with pytest.raises(ValueError, match="sequence of numbers"):
        normalize_orders(([2.0],))

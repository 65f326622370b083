"""Accountants over the whole float range of the noise multiplier (bugs found by the config fuzzer).

Before the fix: RDP epsilon was 0.0 at z = 1e-160 (NaN RDP read as "0"), ZeroDivisionError below ~1e-162,
OverflowError above ~1e154, ValueError for fixed-size sampling above ~3e8 and in ``delta_for`` once an RDP
value fell below ~1e-16; dp_accounting's Poisson series went negative (epsilon 0) at large z / small q and
its without-replacement bound rose with z; PLD at z = 0.001 tried to allocate ~38 GiB; GDP raised (NaN in
Brent) for mu above ~1e154 and returned NaN deltas for mu below ~1e-154.
"""

import math
import subprocess
import sys
import textwrap
from itertools import pairwise

import dp_accounting as dpa
import mpmath as mp
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from dpfl.privacy import accountant as acc
from dpfl.privacy import delta_for, dpsgd_event, epsilon, gaussian_event, rdp_curve
from dpfl.privacy.rdp_curves import (
    Z_NO_PRIVACY,
    RdpCurveCache,
    _log_forward_differences,
    _poisson_bound,
    _wor_bound,
    switch_noise,
)

WOR_ORDERS = (1.5, 2.0, 3.0, 8.0, 32.0, 64.0, 256.0, 1024.0)  # the without-replacement curve is the slow one


pytestmark = pytest.mark.usefixtures("quiet_absl")


def _shapes(z):
    """Every event shape dpfl accounts, at noise multiplier z (name -> (event, orders, accountants))."""
    both = ("rdp", "pld")
    return {
        "gaussian": (gaussian_event(z), None, ("rdp", "pld", "gdp")),
        "full": (dpsgd_event(z, 3, sampling="full"), None, ("rdp", "pld", "gdp")),
        "poisson": (dpsgd_event(z, 100, sampling="poisson", sample_rate=0.1), None, both),
        "poisson_tiny_q": (dpsgd_event(z, 1000, sampling="poisson", sample_rate=1e-7), None, ("rdp",)),
        "fixed": (dpsgd_event(z, 100, sampling="fixed", population=1000, sample_size=100), WOR_ORDERS, ("rdp",)),
        "composed": (
            dpa.ComposedDpEvent([dpsgd_event(z, 10, sampling="poisson", sample_rate=0.01), gaussian_event(z / 2)]),
            None,
            both,
        ),
        "self_composed": (dpa.SelfComposedDpEvent(dpa.ComposedDpEvent([gaussian_event(z), gaussian_event(z)]), 5),
                          None, ("rdp", "pld", "gdp")),
    }


SHAPES = list(_shapes(1.0))
# log-spaced across the float range, denser where the regimes meet (1e-100, the switches, 1e100, 1e150)
SWEEP = sorted({0.0, 5e-324, *10.0 ** np.arange(-300.0, 301.0, 25.0), *10.0 ** np.arange(-104.0, -95.0, 2.0),
                *10.0 ** np.arange(-6.0, 12.0, 0.5), 1e99, 1e101, 1e149, 1e151, 1e154, 1e155, 1e160, 1.7e308})
PLD_SWEEP = [0.0, 1e-300, 1e-101, 1e-20, 1e-6, 3e-5, 1e-3, 0.3, 1.0, 3.0, 10.0, 1e3, 1e8, 1e50, 1e99, 1e101,
             1e200, 1e300]  # each z below ~0.3 builds a budget-sized PLD (seconds), so fewer points


def _check_sweep(values, zs, what):
    assert values[0] == math.inf, f"{what}: z = 0 must mean no privacy"
    for z, v in zip(zs, values, strict=True):
        assert not math.isnan(v) and v >= 0.0, f"{what}: epsilon {v} at z={z:g}"
    for i in range(len(zs) - 1):
        assert values[i + 1] <= values[i], f"{what}: epsilon rises from {values[i]} (z={zs[i]:g}) to {values[i + 1]}"


# -- RDP -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("z", [1e-160, 1e-170, 1e-300, 5e-324, 1e-101])
def test_tiny_noise_is_infinite_epsilon_never_zero_or_an_exception(z):
    for name, (event, orders, accountants) in _shapes(z).items():
        for accountant in accountants:
            eps = epsilon(event, 1e-5, accountant, orders)
            if accountant == "gdp" and z == 1e-101:
                assert 1e200 < eps < math.inf  # exact GDP stays finite until mu^2 overflows (z ~ 1e-154)
            else:
                assert eps == math.inf, (name, accountant, z)
            assert delta_for(event, 1.0, accountant, orders) == 1.0, (name, accountant, z)


def test_the_fuzzer_case():
    assert epsilon(dpsgd_event(1e-160, 100, sampling="poisson", sample_rate=0.1), 1e-5, "rdp") == math.inf


@pytest.mark.parametrize("z", [1e10, 1e155, 1e160, 1e300, 1.7e308])
def test_huge_noise_gives_zero_epsilon_without_an_exception(z):
    for name, (event, orders, accountants) in _shapes(z).items():
        for accountant in accountants:
            assert epsilon(event, 1e-5, accountant, orders) == 0.0, (name, accountant, z)
            assert 0.0 <= delta_for(event, 1.0, accountant, orders) < 1e-12, (name, accountant, z)
        # a delta too small for the KL bound: RDP's conversion floor, a small finite value
        assert 0.0 < epsilon(event, 1e-300, "rdp", orders) < 1.0, name


@pytest.mark.parametrize("name", SHAPES)
def test_rdp_epsilon_is_monotone_over_the_float_range(name):
    orders = _shapes(1.0)[name][1]
    events = [_shapes(z)[name][0] for z in SWEEP]
    for delta in (1e-5, 1e-300, 0.5):
        _check_sweep([epsilon(e, delta, "rdp", orders) for e in events], SWEEP, f"rdp {name} delta={delta}")
    deltas = [delta_for(e, 1.0, "rdp", orders) for e in events]
    assert all(0.0 <= d <= 1.0 for d in deltas) and deltas[0] == 1.0
    assert all(b <= a for a, b in pairwise(deltas)), name


def test_every_order_is_monotone_across_the_switches():
    """Per order (not just the minimum): continuous-from-above at each switch, non-increasing around it."""
    leaves = {
        "poisson": lambda z: dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(z)),
        "fixed": lambda z: dpa.SampledWithoutReplacementDpEvent(100, 50, dpa.GaussianDpEvent(z)),
        "gaussian": lambda z: dpa.GaussianDpEvent(z),
    }
    for name, make in leaves.items():
        kind, q = ("fixed", 0.5) if name == "fixed" else (name, 0.01 if name == "poisson" else 1.0)
        zs = switch_noise(kind, q) * np.geomspace(0.5, 8.0, 25)
        curves = np.array([rdp_curve(make(float(z)), WOR_ORDERS) for z in zs])
        assert (curves > 0).all() and np.isfinite(curves).all(), name
        assert (np.diff(curves, axis=0) <= 0).all(), name


def _exact_poisson_rdp(q, z, order):
    """RDP of the Poisson-subsampled Gaussian at an integer order, in 60-digit arithmetic."""
    with mp.workdps(60):
        q, z = mp.mpf(q), mp.mpf(z)
        s = mp.fsum(mp.binomial(order, i) * q**i * (1 - q) ** (order - i) * mp.expm1(mp.mpf(i * i - i) / (2 * z * z))
                    for i in range(2, order + 1))
        return mp.log1p(s) / (order - 1)


@pytest.mark.parametrize("q", [1e-8, 1e-4, 0.01, 0.3, 0.99])
def test_poisson_curve_is_an_upper_bound_where_dp_accounting_cancels(q):
    orders = (2.0, 3.0, 16.0, 128.0, 1024.0)
    for z in (10.0, 1e3, 1e6, 1e12, 1e100, 1e160):
        ours = rdp_curve(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), orders)
        dp_accounting_region = z <= switch_noise("poisson", q)  # its relative error there is below ~1e-9
        for order, value in zip(orders, ours, strict=True):
            exact = _exact_poisson_rdp(q, z, int(order))
            assert value >= exact * (1 - 1e-9 if dp_accounting_region else 1), (q, z, order)
            if exact > 1e-300 and not dp_accounting_region:
                assert value <= exact * (1 + 1e-8), (q, z, order)  # and tight


def test_dp_accounting_alone_reads_a_cancelled_series_as_epsilon_zero():
    raw = rdp_lib._compute_rdp_poisson_subsampled_gaussian(1e-4, 1e6, [32.0])
    assert raw[0] < 0  # cancellation: the true value is ~1.5e-17
    assert rdp_lib.compute_epsilon([32.0], 100 * raw, 1e-12)[0] == 0.0
    ours = epsilon(dpsgd_event(1e6, 100, sampling="poisson", sample_rate=1e-4), 1e-12, orders=[32.0])
    assert ours > 0.5  # r is negligible: the conversion term log(1/delta)/(alpha-1) remains


def test_large_noise_bounds_equal_dp_accounting_where_it_is_exact():
    """The stable formulas are dp_accounting's formulas: equal (to the 1e-9 margin) where it is accurate."""
    orders = (1.5, 2.0, 2.5, 3.0, 7.3, 16.0, 64.0, 256.0)
    for q, z in ((0.1, 3.0), (0.5, 1.0), (0.01, 2.0)):
        direct = rdp_lib._compute_rdp_poisson_subsampled_gaussian(q, z, orders)
        ours = _poisson_bound(q, z, orders)
        integer = np.array([float(a).is_integer() for a in orders])
        np.testing.assert_allclose(ours[integer], direct[integer], rtol=2e-9)
        # fractional orders: the chord between integer neighbours, never below the exact value, which lies
        # below the chord by convexity; dp_accounting's own series is itself loose there
        assert (ours[~integer] > 0).all() and np.isfinite(ours).all()
    for q, sigma in ((0.1, 1.0), (0.01, 3.0), (0.3, 4.0)):
        direct = rdp_lib._compute_rdp_sample_wor_gaussian(q, sigma, orders)
        np.testing.assert_allclose(_wor_bound(q, sigma, orders), direct, rtol=2e-9)


def test_stable_forward_differences_match_exact_arithmetic():
    for sigma in (10.0, 1e4, 1e8):
        logs = _log_forward_differences(sigma, 24)
        with mp.workdps(int(12 * math.log10(2 * sigma**2)) + 60):
            c = 1 / (2 * mp.mpf(sigma) ** 2)
            for k in range(2, 25, 2):
                exact = mp.fsum((-1) ** (k - j) * mp.binomial(k, j) * mp.exp(c * (j - 1) * j) for j in range(k + 1))
                assert logs[k] == pytest.approx(float(mp.log(exact)), abs=1e-10), (sigma, k)


def test_fixed_size_epsilon_keeps_falling_where_dp_accounting_rose():
    """dp_accounting's without-replacement bound cancels in its forward differences above z ~ 15 and its
    epsilon went *up* with z (e.g. 0.0300 at z=6000, 0.0344 at z=5000, 0.0344 at z=1e4, delta 1e-5)."""
    zs = [5000.0, 5100.0, 6000.0, 1e4, 1e5]
    eps = [epsilon(dpsgd_event(z, 100, sampling="fixed", population=1000, sample_size=100), 1e-5) for z in zs]
    assert all(b <= a for a, b in pairwise(eps))
    assert eps[-2] < 0.005  # the conversion floor ~0.0035 at order 1024, not dp_accounting's garbage 0.034


def test_delta_for_tiny_rdp_does_not_take_log_of_zero():
    event = gaussian_event(1e9)  # RDP ~1e-18 per order: dp_accounting's compute_delta raised ValueError
    d = delta_for(event, 0.0)
    assert 0.0 < d < 1e-8  # the KL bound sqrt(1 - exp(-r)) ~ sqrt(r)
    assert delta_for(event, 0.0) == pytest.approx(math.sqrt(-math.expm1(-1.1 / (2 * 1e18))), rel=1e-6)


def test_bad_leaves_raise_value_error():
    cache = RdpCurveCache()
    with pytest.raises(ValueError, match="noise multiplier must be >= 0"):
        cache.curve(dpa.GaussianDpEvent(-1.0), (2.0,))
    with pytest.raises(ValueError, match="sampling probability"):
        cache.curve(dpa.PoissonSampledDpEvent(1.5, dpa.GaussianDpEvent(1.0)), (2.0,))
    assert (cache.curve(dpa.GaussianDpEvent(math.inf), (2.0, 3.0)) == 0).all()
    assert epsilon(dpsgd_event(Z_NO_PRIVACY, 1, sampling="full"), 1e-5) < math.inf


# -- PLD -----------------------------------------------------------------------------------------------
def test_pld_of_a_tiny_noise_fits_the_budget_and_stays_an_upper_bound():
    """z = 0.001, 100 Poisson steps at q = 0.1: dp_accounting alone asks for ~38 GiB. Run under a 3 GiB
    address-space limit, so a regression fails with MemoryError instead of swapping the machine."""
    code = textwrap.dedent("""
        import resource, time
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
        from dpfl.privacy import epsilon, dpsgd_event
        from dpfl.privacy.accountant import pld_discretization
        ev = dpsgd_event(0.001, 100, sampling="poisson", sample_rate=0.1)
        t = time.perf_counter()
        print(epsilon(ev, 1e-5, "pld"), pld_discretization(ev), epsilon(ev, 1e-5, "rdp"), time.perf_counter() - t)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    pld, grid, rdp, _ = map(float, out.stdout.split())
    assert grid > acc.PLD_VALUE_DISCRETIZATION and math.log2(grid / acc.PLD_VALUE_DISCRETIZATION).is_integer()
    # valid and sensible: one step of z = 0.001 already has a privacy loss of ~5e5 when sampled
    assert 1e6 < pld <= rdp < math.inf


def test_pld_within_the_budget_is_dp_accounting_exactly():
    events = [
        dpsgd_event(2.0, 100, sampling="poisson", sample_rate=0.1),
        dpa.ComposedDpEvent([gaussian_event(2.0), dpa.SelfComposedDpEvent(gaussian_event(4.0), 12), dpa.NoOpDpEvent()]),
        dpa.ComposedDpEvent([dpsgd_event(1.5, 50, sampling="poisson", sample_rate=0.05),
                             dpsgd_event(2.0, 5, sampling="poisson", sample_rate=1.0), gaussian_event(3.0)]),
    ]
    for event in events:
        direct = pld_lib.PLDAccountant()
        direct.compose(event)
        assert acc.pld_discretization(event) == acc.PLD_VALUE_DISCRETIZATION
        assert epsilon(event, 1e-5, "pld") == direct.get_epsilon(1e-5)
        assert delta_for(event, 1.0, "pld") == direct.get_delta(1.0)


def test_pld_coarsening_is_pessimistic(monkeypatch):
    """With a budget 16x smaller the grid is coarsened; epsilon can only grow, by at most ~steps x grid."""
    event = dpsgd_event(1.0, 30, sampling="poisson", sample_rate=0.05)
    fine = epsilon(event, 1e-5, "pld")
    monkeypatch.setattr(acc, "PLD_MAX_STEP_POINTS", 2**12)
    monkeypatch.setattr(acc, "PLD_MAX_POINTS", 2**14)
    grid = acc.pld_discretization(event)
    coarse = epsilon(event, 1e-5, "pld")
    assert grid >= 16 * acc.PLD_VALUE_DISCRETIZATION
    assert fine <= coarse <= fine + 30 * grid
    assert delta_for(event, fine, "pld") <= 1.0
    # a grid beyond PLD_MAX_DISCRETIZATION would be needed: reported as no privacy, never an exception
    monkeypatch.setattr(acc, "PLD_MAX_DISCRETIZATION", 2 * acc.PLD_VALUE_DISCRETIZATION)
    assert epsilon(event, 1e-5, "pld") == math.inf
    assert delta_for(event, 1.0, "pld") == 1.0


@pytest.mark.parametrize("name", [n for n in SHAPES if "pld" in _shapes(1.0)[n][2]])
def test_pld_epsilon_is_monotone_over_the_float_range(name):
    values = [epsilon(_shapes(z)[name][0], 1e-5, "pld") for z in PLD_SWEEP]
    _check_sweep(values, PLD_SWEEP, f"pld {name}")
    assert values[-1] == 0.0
    deltas = [delta_for(_shapes(z)[name][0], 0.5, "pld") for z in (0.0, 1e-300, 1e-6, 1e3, 1e300)]
    assert deltas[:3] == [1.0, 1.0, 1.0] and all(0.0 <= d <= 1.0 for d in deltas) and deltas[-1] < 1e-10


def test_pld_rejects_a_bad_discretization():
    event = gaussian_event(1.0)
    for bad in (0.0, -1e-4, math.inf, math.nan, 1e4, True):
        with pytest.raises(ValueError, match="pld_discretization"):
            epsilon(event, 1e-5, "pld", pld_discretization=bad)


# -- GDP -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in SHAPES if "gdp" in _shapes(1.0)[n][2]])
def test_gdp_epsilon_is_monotone_over_the_float_range(name):
    values = [epsilon(_shapes(z)[name][0], 1e-5, "gdp") for z in SWEEP]
    _check_sweep(values, SWEEP, f"gdp {name}")
    deltas = [delta_for(_shapes(z)[name][0], 0.5, "gdp") for z in SWEEP]
    assert all(0.0 <= d <= 1.0 for d in deltas) and deltas[0] == 1.0 and deltas[-1] == 0.0


def test_gdp_epsilon_is_certified():
    """delta(epsilon) <= delta at the reported epsilon (Brent's root may land left of the true one)."""
    from dpfl.privacy.gdp import gdp_log_delta

    for mu in np.geomspace(1e-3, 1e4, 40):
        for delta in (1e-3, 1e-5, 1e-10):
            eps = acc._gdp_epsilon(float(mu), delta)
            assert eps == 0.0 or gdp_log_delta(eps, float(mu)) <= math.log(delta), (mu, delta)
    # the closed form above GDP_MU_CLOSED_FORM bounds the exact epsilon from above, by about 1
    mu = acc.GDP_MU_CLOSED_FORM
    with mp.workdps(50):
        m = mp.mpf(mu)
        exact = mp.findroot(lambda e: mp.ncdf(-e / m + m / 2) - mp.exp(e) * mp.ncdf(-e / m - m / 2) - mp.mpf("1e-5"),
                            m * m / 2 + 4 * m)
    assert float(exact) <= acc._gdp_epsilon(mu * (1 + 1e-12), 1e-5) <= float(exact) + 2.0


def test_gdp_delta_for_a_tiny_mu_is_a_bound_not_nan():
    from dpfl.privacy.gdp import gdp_delta

    for mu in (1e-7, 1e-20, 1e-200):
        d0 = acc._gdp_delta(0.0, mu)
        assert d0 == pytest.approx(mu / math.sqrt(2 * math.pi), rel=1e-6)  # delta(0) = erf(mu / 2 sqrt 2)
        assert acc._gdp_delta(1.0, mu) == 0.0
    assert acc._gdp_delta(1e-7, 5e-7) >= gdp_delta(1e-7, 5e-7) * (1 - 1e-9)  # the bound vs the formula

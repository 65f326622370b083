"""Calibration: the returned noise meets the target epsilon, only just, and agrees with Opacus."""

import itertools
import math
import warnings

import pytest

from dpfl.privacy import calibrate_noise_multiplier, dpsgd_event, epsilon, heuristic_pfa_noise

# heterogeneous_dp.md section 8 item 8: (q, steps) of the RHDP b=16 / b=128 and PFA B=8 settings.
SPEC_SETTINGS = [(16 / 2400, 150 * 200), (128 / 2400, 19 * 200), (8 / 1200, 8000)]
SPEC_EPS = (0.2, 1.0, 5.0)
SPEC_DELTAS = (1e-4, 1e-5)
# 16/2400 == 8/1200, so the full product has 2 x 3 settings, 3 of which are the paired ones above.
OTHER_SETTINGS = sorted(set(itertools.product({q for q, _ in SPEC_SETTINGS}, {t for _, t in SPEC_SETTINGS}))
                        - set(SPEC_SETTINGS))


def _opacus_epsilon(z, q, steps, delta):
    opacus = pytest.importorskip("opacus")
    acc = opacus.accountants.RDPAccountant()
    acc.history = [(z, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return acc.get_epsilon(delta)


def _check_poisson(q, steps, target, delta):
    z = calibrate_noise_multiplier(target, delta, steps=steps, sample_rate=q)
    eps = epsilon(dpsgd_event(z, steps, sampling="poisson", sample_rate=q), delta)
    assert (1 - 1e-3) * target <= eps <= target, (q, steps, target, delta, z, eps)
    # smallest such z: 10 ppm less noise already exceeds the target
    assert epsilon(dpsgd_event(z * (1 - 1e-5), steps, sampling="poisson", sample_rate=q), delta) > target
    theirs = _opacus_epsilon(z, q, steps, delta)
    assert abs(theirs - eps) <= 0.01 * eps, (q, steps, target, delta, eps, theirs)


@pytest.mark.parametrize("q, steps", SPEC_SETTINGS)
@pytest.mark.parametrize("target", SPEC_EPS)
@pytest.mark.parametrize("delta", SPEC_DELTAS)
def test_calibration_hits_target_spec_settings(q, steps, target, delta):
    _check_poisson(q, steps, target, delta)


@pytest.mark.parametrize("q, steps", OTHER_SETTINGS)
@pytest.mark.parametrize("target", SPEC_EPS)
@pytest.mark.parametrize("delta", SPEC_DELTAS)
def test_calibration_hits_target_full_product(q, steps, target, delta):
    _check_poisson(q, steps, target, delta)


def test_calibration_fixed_size_hits_target():
    n, m, steps, target, delta = 1200, 8, 800, 2.0, 1e-5
    orders = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)  # keeps the slow WOR curve cheap
    z = calibrate_noise_multiplier(
        target, delta, steps=steps, sampling="fixed", population=n, sample_size=m, orders=orders
    )
    eps = epsilon(dpsgd_event(z, steps, sampling="fixed", population=n, sample_size=m), delta, orders=orders)
    assert (1 - 1e-3) * target <= eps <= target
    # the replace-one event (z/2) needs clearly more noise than Poisson at the same rate
    assert z > 1.5 * calibrate_noise_multiplier(target, delta, steps=steps, sample_rate=m / n, orders=orders)


def test_calibration_full_batch_matches_closed_form_gaussian_order():
    z = calibrate_noise_multiplier(1.0, 1e-5, steps=10, sampling="full")
    eps = epsilon(dpsgd_event(z, 10, sampling="full"), 1e-5)
    assert 0.999 <= eps <= 1.0


def test_calibration_pld_meets_target_with_less_noise_than_rdp():
    q, steps, target, delta = 8 / 1200, 8000, 1.0, 1e-5
    z_pld = calibrate_noise_multiplier(target, delta, steps=steps, sample_rate=q, accountant="pld", rel_tol=1e-4)
    z_rdp = calibrate_noise_multiplier(target, delta, steps=steps, sample_rate=q)
    eps = epsilon(dpsgd_event(z_pld, steps, sampling="poisson", sample_rate=q), delta, "pld")
    assert eps <= target and z_pld < z_rdp


def test_unreachable_target_is_a_clear_error():
    with pytest.raises(ValueError, match=r"target_epsilon=1e-06 is unreachable.*max_noise=10"):
        calibrate_noise_multiplier(1e-6, 1e-5, steps=100, sample_rate=0.01, max_noise=10.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(target_epsilon=1.0, delta=1.0), r"delta must be in \(0, 1.0\), got 1.0"),
        (dict(target_epsilon=1.0, delta=0.0), r"delta must be in \(0, 1.0\), got 0.0"),
        (dict(target_epsilon=0.0, delta=1e-5), r"target_epsilon must be in \(0, inf\), got 0.0"),
        (dict(target_epsilon=math.inf, delta=1e-5), "target_epsilon"),
        (dict(target_epsilon=1.0, delta=1e-5, rel_tol=0.5), "rel_tol"),
        (dict(target_epsilon=1.0, delta=1e-5, accountant="zcdp"), "accountant must be one of"),
        (dict(target_epsilon=1.0, delta=1e-5, accountant="gdp"), "exact only for compositions of Gaussian"),
        (dict(target_epsilon=1.0, delta=1e-5, sample_rate=None), "sample_rate"),
    ],
)
def test_bad_calibration_arguments(kwargs, match):
    kwargs.setdefault("sample_rate", 0.01)
    with pytest.raises(ValueError, match=match):
        calibrate_noise_multiplier(steps=100, **kwargs)


def test_pld_calibration_refuses_fixed_size():
    with pytest.raises(ValueError, match="pld.*fixed-size"):
        calibrate_noise_multiplier(
            1.0, 1e-5, steps=10, sampling="fixed", population=100, sample_size=10, accountant="pld",
            orders=(2.0, 4.0, 8.0, 16.0, 32.0),
        )


def test_heuristic_pfa_golden_value():
    # B=4, N=1200, T*=8000, delta=1e-5, eps=1 -> 10 * (1/300) * sqrt(8000 * 5) = 20/3
    assert heuristic_pfa_noise(1.0, 1e-5, 4 / 1200, 8000) == pytest.approx(20 / 3, rel=1e-12)
    # sigma scales as 1/eps and sqrt(T*)
    assert heuristic_pfa_noise(2.0, 1e-5, 4 / 1200, 32000) == pytest.approx(20 / 3, rel=1e-12)
    with pytest.raises(ValueError, match="sample_rate"):
        heuristic_pfa_noise(1.0, 1e-5, 0.0, 8000)

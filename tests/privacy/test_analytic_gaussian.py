"""The analytic Gaussian calibration against the exact privacy profile and dp-accounting's PLD."""

import math

import dp_accounting
import pytest

from dpfl.privacy.analytic_gaussian import analytic_gaussian_sigma, privacy_profile


@pytest.mark.parametrize("eps,delta", [(0.5, 1e-5), (1.0, 1e-5), (3.0, 1e-5), (8.0, 1e-6)])
def test_sigma_is_the_smallest_meeting_delta(eps, delta):
    sigma = analytic_gaussian_sigma(eps, delta)
    assert privacy_profile(sigma, eps) <= delta < privacy_profile(sigma * (1 - 1e-9), eps)
    assert sigma < math.sqrt(2 * math.log(1.25 / delta)) / eps or eps >= 1  # tighter than the classical bound
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(sigma))
    assert pld.get_epsilon(delta) == pytest.approx(eps, rel=2e-3)  # PLD is exact up to its discretisation


def test_scales_with_sensitivity_and_refuses_bad_input():
    assert analytic_gaussian_sigma(1.0, 1e-5, 2.0) == pytest.approx(2 * analytic_gaussian_sigma(1.0, 1e-5), rel=1e-9)
    with pytest.raises(ValueError):
        analytic_gaussian_sigma(0.0, 1e-5)

"""The DN distributions (spec bidirectional.md §2, T1-T4): their products are exactly Gaussian.

Each KS check draws N = 50 000 samples with a fixed seed and passes at p > 1e-3; the power check must reject at
p < 1e-6 (an excess kurtosis of 2 is far beyond what 50 000 samples can hide).
"""

import math

import numpy as np
import pytest
from scipy.stats import kstest, ks_2samp

from dpfl.algorithms.secure.mpdp.dn import dn, dn_star_abs, reference_moments

N = 50_000
SIGMA = 0.7


def _gen(seed):
    return np.random.default_rng(seed)


def test_series_dn_star_1_matches_its_exact_law():  # T1
    series = dn_star_abs(1, N, _gen(1), series=True).numpy()
    exact = np.sqrt(_gen(2).standard_gamma(1.5, N))
    assert ks_2samp(series, exact).pvalue > 1e-3


@pytest.mark.parametrize("build", [
    lambda g: dn_star_abs(1, N, g) * dn(SIGMA, 1, N, g),
    lambda g: dn_star_abs(1, N, g) * dn(SIGMA, 2, N, g) * dn(SIGMA, 2, N, g),
    lambda g: dn_star_abs(2, N, g) * dn_star_abs(2, N, g) * dn(SIGMA, 1, N, g),
    lambda g: dn_star_abs(2, N, g, lmax=10) * dn_star_abs(2, N, g, lmax=10) * dn(SIGMA, 1, N, g),
], ids=["dn*1 dn1", "dn*1 dn2 dn2", "dn*2 dn*2 dn1 lmax2000", "dn*2 dn*2 dn1 lmax10+tail"])
def test_products_are_gaussian(build):  # T2
    z = build(_gen(3)).numpy() / SIGMA
    assert kstest(z, "norm").pvalue > 1e-3


@pytest.mark.parametrize("m,lmax", [(1, None), (2, 200), (3, 10)])
def test_reference_moments(m, lmax):  # T3
    x = (dn_star_abs(m, N, _gen(4)) if lmax is None else dn_star_abs(m, N, _gen(4), lmax=lmax)).numpy()
    ref = reference_moments(m)
    log = np.log(x)
    # tolerances: 5 standard errors of each sample moment at N = 50 000
    assert log.mean() == pytest.approx(ref["mean_log"], abs=5 * math.sqrt(ref["var_log"] / N))
    assert log.var() == pytest.approx(ref["var_log"], rel=5 * math.sqrt(2 / N) * 2)
    assert x.mean() == pytest.approx(ref["mean_abs"], abs=5 * x.std() / math.sqrt(N))
    assert (x**2).mean() == pytest.approx(ref["mean_sq"], abs=5 * (x**2).std() / math.sqrt(N))


def test_naive_product_is_rejected():  # T4: |DN*(1)| times a true Gaussian is not Gaussian (MP-DP-Naive)
    g = _gen(5)
    z = dn_star_abs(1, N, g).numpy() * g.normal(0, SIGMA, N) / SIGMA
    assert kstest(z, "norm").pvalue < 1e-6


def test_dn_sigma_1_is_uniform():  # T5 (first half)
    x = dn(SIGMA, 1, N, _gen(6)).numpy()
    half = math.sqrt(2) * SIGMA
    assert kstest(x, "uniform", args=(-half, 2 * half)).pvalue > 1e-3
    assert x.var() == pytest.approx(2 * SIGMA**2 / 3, rel=0.03)


def test_bad_parameters():
    with pytest.raises(ValueError):
        dn_star_abs(0, 5, _gen(0))
    with pytest.raises(ValueError):
        dn(0.0, 1, 5, _gen(0))

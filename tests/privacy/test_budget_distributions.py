"""PFA / Robust-HDP budget distributions and batch sizes (spec heterogeneous_dp.md section 3; test 8.12).

Statistical checks use N = 20,000 clients and a tolerance of 4 standard errors (two-sided false-alarm
rate ~6e-5 per check; the draws are seeded, so the outcome is fixed anyway). At that N the re-draw
condition (some epsilon above the threshold) holds on the first attempt with probability
1 - 0.9**20000, so the frequencies are those of the raw mixture.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpfl.privacy.budget_distributions import (
    EPS_FLOOR,
    HETERO_BATCH_SIZES,
    MAX_ATTEMPTS,
    NAMED_DISTRIBUTIONS,
    RHDP_BATCH20,
    RHDP_EPS20,
    _redraw_until_above,
    draw_batch_sizes,
)
from dpfl.privacy.budgets import budget_distribution_name, draw_budgets

N = 20_000
THRESHOLDS = {"Uniform": 9.0, "MixGauss1": 1.0, "MixGauss2": 1.0, "MixGauss3": 2.0, "MixGauss4": 2.0,
              "MixGauss3-code": 2.0}


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def within(observed: float, expected: float, se: float, k: float = 4.0) -> bool:
    return abs(observed - expected) <= k * se


# ---- fixed lists (spec 3.3, the RHDP code's utils/privacy_params.py) -----------------------------------


def test_fixed_lists_are_verbatim():
    assert list(RHDP_EPS20) == [f"Dist{k}" for k in range(1, 10)]
    assert all(len(v) == 20 for v in RHDP_EPS20.values()) and len(RHDP_BATCH20) == 20
    assert RHDP_EPS20["Dist5"][0] == 0.95 and RHDP_EPS20["Dist2"][0] == 5.45 and RHDP_BATCH20[13] == 128
    spots = {("Dist1", 19): 2.29, ("Dist3", 13): 4.41, ("Dist4", 3): 3.97, ("Dist6", 17): 0.15,
             ("Dist7", 4): 0.98, ("Dist8", 17): 0.17, ("Dist9", 10): 0.48, ("Dist2", 3): 0.2}
    for (dist, i), value in spots.items():
        assert RHDP_EPS20[dist][i] == value, (dist, i)
    assert [i for i, e in enumerate(RHDP_EPS20["Dist5"]) if e == 0.95] == [0, 10, 16]  # spec 9.14
    assert RHDP_EPS20["Dist5"] == (0.95, 1.5, 0.2, 0.74, 0.46, 0.37, 0.54, 0.82, 0.91, 1.17,
                                   0.95, 1.43, 0.57, 1.78, 0.25, 1.41, 0.95, 1.21, 0.45, 0.56)
    assert RHDP_BATCH20 == (32, 64, 16, 32, 16, 16, 16, 32, 32, 64, 32, 64, 16, 128, 16, 64, 32, 64, 16, 16)
    assert [round(math.fsum(v), 2) for v in RHDP_EPS20.values()] == [
        38.66, 28.84, 39.23, 21.19, 17.22, 7.5, 11.67, 5.8, 6.22]


def test_rhdp20_budget_kind():
    np.testing.assert_array_equal(draw_budgets("rhdp20", 20, rng(), dist="Dist2"), RHDP_EPS20["Dist2"])
    np.testing.assert_array_equal(draw_budgets("RHDP20", 20, rng(), dist="dist7"), RHDP_EPS20["Dist7"])
    with pytest.raises(ValueError, match=r"^rhdp20 lists have 20 clients; for 10 clients use distribution Dist5 "
                                         r"\(sampled\)$"):
        draw_budgets("rhdp20", 10, rng(), dist="Dist5")
    with pytest.raises(ValueError, match=r"dist must be one of Dist1, Dist2, .*Dist9, got 'Dist10'"):
        draw_budgets("rhdp20", 20, rng(), dist="Dist10")
    with pytest.raises(ValueError, match="bad parameters for budget distribution 'rhdp20'"):
        draw_budgets("rhdp20", 20, rng())


# ---- thresholds, floor, re-draw --------------------------------------------------------------------------


@pytest.mark.parametrize("name", THRESHOLDS)
def test_redrawn_lists_exceed_the_threshold_and_the_floor(name):
    # n = 1 needs the re-draw most of the time (one client is below the threshold w.p. 0.9 or 8/9)
    for seed in range(30):
        for n in (1, 2, 5, 20):
            eps = draw_budgets(name, n, rng(seed))
            assert eps.shape == (n,) and eps.max() > THRESHOLDS[name] and eps.min() >= EPS_FLOOR, (seed, n, eps)


def test_floor_clips_every_distribution():
    eps = draw_budgets("Dist1", N, rng())  # N(2, 1): ~2.3% of the draws fall below 0.01
    assert eps.min() == EPS_FLOOR and 0.015 < np.mean(eps == EPS_FLOOR) < 0.032
    floored = draw_budgets("Gauss", 1000, rng(), eps_floor=2.5)
    assert floored.min() == 2.5 and np.mean(floored == 2.5) > 0.2
    for name in NAMED_DISTRIBUTIONS:
        assert draw_budgets(name, 500, rng(3)).min() >= EPS_FLOOR, name
    with pytest.raises(ValueError, match="eps_floor must be a finite number > 0, got 0"):
        draw_budgets("MixGauss1", 3, rng(), eps_floor=0)
    with pytest.raises(ValueError, match="bad parameters for budget distribution 'MixGauss1'"):
        draw_budgets("MixGauss1", 3, rng(), threshold=5.0)


def test_redraw_fails_clearly_after_max_attempts():
    calls = []

    def never_high() -> np.ndarray:
        calls.append(1)
        return np.full(3, 0.1)

    with pytest.raises(ValueError, match=r"^MixGauss1: no epsilon above its threshold 1.0 in 1000 draws of 3 "):
        _redraw_until_above(never_high, 1.0, "MixGauss1", 3)
    assert len(calls) == MAX_ATTEMPTS == 1000


# ---- shapes -----------------------------------------------------------------------------------------------

# (name, [(low, high, probability of the component(s) in [low, high))]): the components are >= 9 sds apart
FREQUENCIES = [
    ("MixGauss1", [(0.0, 5.0, 0.9), (5.0, math.inf, 0.1)]),
    ("MixGauss2", [(0.0, 5.0, 0.9), (5.0, math.inf, 0.1)]),
    ("MixGauss3", [(0.0, 5.0, 0.9), (5.0, math.inf, 0.1)]),
    ("MixGauss3-code", [(0.0, 5.0, 0.9), (5.0, math.inf, 0.1)]),
    ("MixGauss4", [(0.0, 0.5, 0.5), (0.5, 5.0, 0.4), (5.0, math.inf, 0.1)]),
]


@pytest.mark.parametrize("name, bins", FREQUENCIES, ids=[f[0] for f in FREQUENCIES])
def test_mixture_component_frequencies(name, bins):
    eps = draw_budgets(name, N, rng(11))
    for low, high, p in bins:
        frac = np.mean((eps >= low) & (eps < high))
        assert within(frac, p, math.sqrt(p * (1 - p) / N)), (name, low, high, frac)


def test_second_parameter_is_a_standard_deviation():
    """N(a, b) has sd b (spec 9.7): MixGauss1's components have sds 0.01 and 0.1 (variance would give 0.1
    and 0.32). Tolerance: 4 standard errors of a sample sd, sd / sqrt(2 n)."""
    eps = draw_budgets("MixGauss1", N, rng(4))
    for part, sd in ((eps[eps < 5], 0.01), (eps[eps > 5], 0.1)):
        assert within(part.std(ddof=1), sd, sd / math.sqrt(2 * part.size)), (sd, part.std(ddof=1))


def test_each_client_picks_its_component_independently():
    high = [draw_budgets("MixGauss1", 200, rng(seed)) > 5 for seed in range(4)]
    assert len({tuple(np.flatnonzero(h)) for h in high}) == 4  # not a fixed set of "rich" clients
    counts = [int(h.sum()) for h in high]
    assert len(set(counts)) > 1  # the number of rich clients is random (binomial), not a fixed 10%


def _clipped_normal_mean(mu: float, sd: float, floor: float = EPS_FLOOR) -> float:
    """E[max(X, floor)] for X ~ N(mu, sd^2) (the std convention of spec 3.1)."""
    z = (floor - mu) / sd
    cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    pdf = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    return mu + (floor - mu) * cdf + sd * pdf


# The tables of spec 3.1/3.2, written out independently of the module: (weight, mean, sd) or ("U", low, high).
MEANS = {
    "Dist1": [(1.0, 2.0, 1.0)],
    "Dist2": [(0.2, 0.2, 0.01), (0.6, 1.0, 0.1), (0.2, 5.0, 1.0)],
    "Dist3": ("U", 0.2, 5.0),
    "Dist4": [(0.2, 0.2, 0.01), (0.6, 0.5, 0.1), (0.2, 2.0, 1.0)],
    "Dist5": ("U", 0.2, 2.0),
    "Dist6": [(0.3, 0.2, 0.01), (0.5, 0.5, 0.1), (0.2, 1.0, 0.1)],
    "Dist7": ("U", 0.2, 1.0),
    "Dist8": [(0.6, 0.2, 0.01), (0.4, 0.5, 0.1)],
    "Dist9": ("U", 0.2, 0.5),
    "Gauss": [(1.0, 3.0, 1.0)],
    "Uniform": ("U", 1.0, 10.0),
    "MixGauss1": [(0.9, 0.1, 0.01), (0.1, 10.0, 0.1)],
    "MixGauss4": [(0.5, 0.1, 0.01), (0.4, 1.0, 0.1), (0.1, 10.0, 1.0)],
}


@pytest.mark.parametrize("name", MEANS)
def test_sample_means_match_the_tables(name):
    """Tolerance: 4 standard errors of the mean (sample sd / sqrt(N)). The expected mean includes the
    floor's clipping, which matters for Dist1 (N(2, 1): +0.0087, ~1.2 standard errors)."""
    spec = MEANS[name]
    if spec[0] == "U":
        expected = (spec[1] + spec[2]) / 2
    else:
        expected = math.fsum(w * _clipped_normal_mean(mu, sd) for w, mu, sd in spec)
    eps = draw_budgets(name, N, rng(5))
    assert within(eps.mean(), expected, eps.std(ddof=1) / math.sqrt(N)), (name, eps.mean(), expected)
    assert NAMED_DISTRIBUTIONS[name].shape.mean == pytest.approx(
        (spec[1] + spec[2]) / 2 if spec[0] == "U" else math.fsum(w * mu for w, mu, _ in spec))


def test_sampled_uniforms_stay_in_their_ranges():
    for name in ("Dist3", "Dist5", "Dist7", "Dist9", "Uniform"):
        spec = MEANS[name]
        eps = draw_budgets(name, 2000, rng(1))
        assert spec[1] <= eps.min() and eps.max() <= spec[2], name


def test_pareto_is_pfa_code_pareto_uncapped():
    eps = draw_budgets("Pareto", N, rng(2))  # classical Pareto(scale 0.5, shape 1): P(eps > x) = 0.5 / x
    assert eps.min() >= 0.5
    for x in (1.0, 5.0):
        p = 0.5 / x
        assert within(np.mean(eps > x), p, math.sqrt(p * (1 - p) / N)), x
    assert eps.max() > 100  # uncapped: P(max <= 100) = 0.995**20000 ~ e^-100
    capped = draw_budgets("Pareto", 1000, rng(2), pareto_cap=3.0)
    assert capped.max() == 3.0 and capped.min() >= 0.5
    with pytest.raises(ValueError, match=r"pareto_cap must be >= eps_floor \(0.01\), got 0.001"):
        draw_budgets("Pareto", 3, rng(), pareto_cap=0.001)


# ---- reproducibility and names ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMED_DISTRIBUTIONS)
def test_same_seed_same_list(name):
    a, b = draw_budgets(name, 20, rng(42)), draw_budgets(name, 20, rng(42))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, draw_budgets(name, 20, rng(43)))


def test_names_are_case_insensitive_unless_ambiguous():
    np.testing.assert_array_equal(draw_budgets("mixgauss3-CODE", 7, rng(1)), draw_budgets("MixGauss3-code", 7, rng(1)))
    np.testing.assert_array_equal(draw_budgets("dist5", 7, rng(1)), draw_budgets("Dist5", 7, rng(1)))
    assert budget_distribution_name("PARETO") == "Pareto" and budget_distribution_name("Uniform") == "Uniform"
    assert budget_distribution_name("uniform") == "uniform"  # the generic U(low, high)
    with pytest.raises(ValueError, match=r"kind 'UNIFORM' is ambiguous: write it as one of \['uniform', 'Uniform'\]"):
        draw_budgets("UNIFORM", 3, rng())
    with pytest.raises(ValueError, match="bad parameters for budget distribution 'uniform'"):
        draw_budgets("uniform", 3, rng())  # U(low, high) needs its bounds; PFA's is 'Uniform'
    eps = draw_budgets("Uniform", 1000, rng())
    assert 1.0 <= eps.min() and eps.max() <= 10.0


# ---- batch sizes (spec 3.4) ------------------------------------------------------------------------------


def test_hetero_batch_sizes():
    sizes = draw_batch_sizes("hetero", 4000, rng(3))
    assert set(sizes) == set(HETERO_BATCH_SIZES) == {16, 32, 64, 128}
    for b in HETERO_BATCH_SIZES:
        assert within(sizes.count(b) / 4000, 0.25, math.sqrt(0.25 * 0.75 / 4000)), b
    assert draw_batch_sizes("hetero", 20, rng(9)) == draw_batch_sizes("HETERO", 20, rng(9))
    assert draw_batch_sizes("hetero", 20, rng(9)) != draw_batch_sizes("hetero", 20, rng(10))
    assert draw_batch_sizes("hetero", 20, rng(9)) == rng(9).choice([16, 32, 64, 128], size=20).tolist()


def test_rhdp20_batch_sizes():
    assert draw_batch_sizes("rhdp20", 20, rng()) == list(RHDP_BATCH20)
    with pytest.raises(ValueError, match="the rhdp20 batch-size list has 20 clients, got n_clients=6"):
        draw_batch_sizes("rhdp20", 6, rng())
    with pytest.raises(ValueError, match="batch-size kind must be one of hetero, rhdp20, got 'zipf'"):
        draw_batch_sizes("zipf", 6, rng())

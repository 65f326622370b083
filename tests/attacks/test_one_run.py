"""The one-run audit bound (Steinke, Nasr, Jagielski 2023, Theorem 5.2): known answers and its behaviour."""

import math

import numpy as np
import pytest
from scipy.stats import binom

from dpfl.attacks.one_run import epsilon_for, guess_counts, lower_bound, p_value


def test_pure_dp_p_value_is_the_binomial_tail():
    q = math.exp(1.0) / (1 + math.exp(1.0))
    assert p_value(100, 40, 30, 1.0, 0.0) == pytest.approx(binom.sf(29, 40, q), rel=1e-12)


def test_delta_only_raises_the_p_value():
    assert p_value(1000, 100, 80, 1.0, 1e-5) > p_value(1000, 100, 80, 1.0, 0.0)
    assert p_value(1000, 100, 80, 1.0, 1.0) == 1.0  # capped


def test_all_guesses_right_gives_the_closed_form():
    # with delta 0 and v = r the p-value is q^r: the bound solves q^r = significance, eps = log(q / (1 - q))
    r, sig = 100, 0.05
    q = sig ** (1 / r)
    assert epsilon_for(r, r, r, 0.0, sig) == pytest.approx(math.log(q / (1 - q)), abs=1e-5)


def test_chance_level_guesses_refute_nothing():
    assert epsilon_for(200, 100, 50, 1e-5, 0.05) == 0.0
    assert epsilon_for(200, 0, 0, 1e-5, 0.05) == 0.0


def test_more_correct_guesses_never_lower_the_bound():
    bounds = [epsilon_for(500, 200, v, 1e-5, 0.0125) for v in range(100, 201, 10)]
    assert bounds == sorted(bounds) and bounds[-1] > 3


def test_bound_from_scores_separated_and_random():
    rng = np.random.default_rng(0)
    included = rng.random(400) < 0.5
    separated = lower_bound(included + rng.normal(0, 0.05, 400), included, 1e-5)
    assert separated.correct == separated.guesses and separated.epsilon_lower_bound > 3
    for seed in range(5):  # scores independent of inclusion: refuting eps = 0 happens w.p. <= 5% per seed
        noise = np.random.default_rng(seed + 1).normal(size=400)
        assert lower_bound(noise, included, 1e-5).epsilon_lower_bound == 0.0


def test_guess_grid_is_fixed_by_the_number_of_canaries():
    assert guess_counts(200) == [10, 20, 50, 100]
    assert guess_counts(3) == [1]


@pytest.mark.parametrize("scores,bits,match", [
    ([1.0], [True], "at least 2 canaries"),
    ([1.0, 2.0], [True], "one inclusion bit"),
    ([1.0, float("nan")], [True, False], "finite"),
])
def test_bad_input_is_refused(scores, bits, match):
    with pytest.raises(ValueError, match=match):
        lower_bound(np.array(scores), np.array(bits), 1e-5)

"""Event builders: the accountant must see exactly the sampling (and sensitivity) the code uses."""

import math

import dp_accounting as dpa
import pytest

from dpfl.privacy import (
    ADD_REMOVE,
    REPLACE_ONE,
    describe_event,
    dpsgd_event,
    gaussian_event,
    neighboring_relation,
    sampled_gaussian_event,
)


def test_poisson_builds_poisson_sampled_gaussian():
    ev = sampled_gaussian_event(1.3, sampling="poisson", sample_rate=0.02)
    assert ev == dpa.PoissonSampledDpEvent(0.02, dpa.GaussianDpEvent(1.3))
    assert neighboring_relation(ev) == ADD_REMOVE


def test_fixed_builds_without_replacement_with_half_the_multiplier():
    # Replace-one sensitivity of a clipped sum is 2C, noise std is z*C -> multiplier z/2.
    ev = sampled_gaussian_event(1.3, sampling="fixed", population=1200, sample_size=8)
    assert ev == dpa.SampledWithoutReplacementDpEvent(1200, 8, dpa.GaussianDpEvent(0.65))
    assert neighboring_relation(ev) == REPLACE_ONE


def test_full_builds_plain_gaussian():
    assert sampled_gaussian_event(2.0, sampling="full") == dpa.GaussianDpEvent(2.0)
    assert gaussian_event(2.0) == dpa.GaussianDpEvent(2.0)
    assert neighboring_relation(gaussian_event(2.0)) == ADD_REMOVE


def test_dpsgd_event_self_composes_steps():
    ev = dpsgd_event(0.9, 37, sampling="poisson", sample_rate=0.1)
    assert ev == dpa.SelfComposedDpEvent(sampled_gaussian_event(0.9, sampling="poisson", sample_rate=0.1), 37)


def test_zero_noise_is_allowed():
    assert gaussian_event(0.0).noise_multiplier == 0.0
    assert dpsgd_event(0, 3, sampling="fixed", population=10, sample_size=2).event.event.noise_multiplier == 0.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sampling="poisson"), "sample_rate"),
        (dict(sampling="poisson", sample_rate=0.0), r"sample_rate must be in \(0, 1\], got 0.0"),
        (dict(sampling="poisson", sample_rate=1.5), r"sample_rate must be in \(0, 1\], got 1.5"),
        (dict(sampling="poisson", sample_rate=0.1, population=10), "population.*not used with sampling='poisson'"),
        (dict(sampling="fixed", population=10), "population.*sample_size"),
        (dict(sampling="fixed", population=10, sample_size=11), r"sample_size must be in \[1, 10\], got 11"),
        (dict(sampling="fixed", population=0, sample_size=0), r"population must be >= 1, got 0"),
        (dict(sampling="fixed", population=10.0, sample_size=2), "population must be an integer"),
        (dict(sampling="fixed", population=10, sample_size=2, sample_rate=0.2), "sample_rate.*not used"),
        (dict(sampling="full", sample_rate=0.2), "sample_rate.*not used with sampling='full'"),
        (dict(sampling="shuffle"), r"sampling must be one of \('poisson', 'fixed', 'full'\), got 'shuffle'"),
    ],
)
def test_bad_sampling_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sampled_gaussian_event(1.0, **kwargs)


@pytest.mark.parametrize("z", [-0.1, math.nan, math.inf, "1.0", True])
def test_bad_noise_multiplier(z):
    with pytest.raises(ValueError, match="noise_multiplier"):
        gaussian_event(z)


@pytest.mark.parametrize("steps", [0, -3, 2.0])
def test_bad_steps(steps):
    with pytest.raises(ValueError, match="steps"):
        dpsgd_event(1.0, steps, sampling="full")


def test_mixed_relations_in_one_event_raise():
    mixed = dpa.ComposedDpEvent(
        [
            sampled_gaussian_event(1.0, sampling="poisson", sample_rate=0.1),
            sampled_gaussian_event(1.0, sampling="fixed", population=10, sample_size=1),
        ]
    )
    with pytest.raises(ValueError, match="one neighbouring relation"):
        neighboring_relation(mixed)


def test_relation_of_neutral_event_defaults_to_add_remove():
    assert neighboring_relation(dpa.NoOpDpEvent()) == ADD_REMOVE
    nested = dpa.SelfComposedDpEvent(
        dpa.ComposedDpEvent([dpsgd_event(1.0, 2, sampling="fixed", population=5, sample_size=5)]), 3)
    assert neighboring_relation(nested) == REPLACE_ONE


def test_describe_event_inverts_the_builders():
    info = describe_event(dpsgd_event(1.4, 12, sampling="fixed", population=1200, sample_size=8))
    assert (info.sampling, info.noise_multiplier, info.steps, info.relation) == ("fixed", 1.4, 12, REPLACE_ONE)
    assert (info.population, info.sample_size, info.sample_rate) == (1200, 8, 8 / 1200)
    info = describe_event(dpsgd_event(0.7, 5, sampling="poisson", sample_rate=0.03))
    assert (info.sampling, info.noise_multiplier, info.steps, info.sample_rate) == ("poisson", 0.7, 5, 0.03)
    assert describe_event(gaussian_event(2.0)).sampling == "full"
    assert describe_event(dpa.LaplaceDpEvent(1.0)) is None

"""R-DPCFL's clustering of the round-1 updates (clustered_dpfl.md §5.2-§5.3, required tests 3 and 4)."""

import math

import numpy as np
import pytest

from dpfl.algorithms.server.clustered.gmm import (
    choose_clusters,
    fit_clusters,
    pca_features,
    second_stage_rounds,
    separation,
)

SIZES = [3, 6, 6, 6]


def planted_updates(seed: int, p: int = 1000, radius: float = 10.0):
    """Cluster centres on a circle of `radius` in a random 2-D subspace of R^p, plus isotropic noise of norm ~1."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((p, 2)))[0]
    truth = np.repeat(np.arange(len(SIZES)), SIZES)
    angles = 2 * np.pi * np.arange(len(SIZES)) / len(SIZES) + rng.uniform(0, 2 * np.pi)
    centres = radius * np.stack([np.cos(angles), np.sin(angles)], 1) @ basis.T
    return centres[truth] + rng.standard_normal((len(truth), p)) / np.sqrt(p), truth


def same_partition(a, b) -> bool:
    """Equal as set partitions (up to relabelling)."""
    return {frozenset(np.flatnonzero(a == k)) for k in set(a)} == {frozenset(np.flatnonzero(b == k)) for k in set(b)}


@pytest.mark.parametrize("seed", range(5))
def test_well_separated_updates_give_the_planted_clusters(seed):
    x, truth = planted_updates(seed)
    features = pca_features(x)
    fit = fit_clusters(features, 4, seed)
    assert same_partition(fit.assignment, truth)
    assert fit.mss > 2
    assert fit.posteriors.max(axis=1).min() >= 0.99
    assert np.allclose(fit.posteriors.sum(axis=1), 1.0)
    assert choose_clusters(features, seed).n_clusters == 4


def test_a_wrong_partition_fails_the_check():
    """The test's partition comparison is not vacuous."""
    truth = np.repeat(np.arange(4), SIZES)
    moved = truth.copy()
    moved[0] = 1
    assert same_partition(np.array([3, 3, 3, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1]), truth)
    assert not same_partition(moved, truth)


def test_features_are_min_max_scaled_and_sign_stable():
    x, _ = planted_updates(0)
    f = pca_features(x)
    assert f.shape == (21, 2) and np.allclose(f.min(axis=0), 0) and np.allclose(f.max(axis=0), 1)
    assert np.allclose(pca_features(x * 3.0), f)  # scale-free after standardising and min-max
    g = pca_features(x, scaler="standard", project="standardized")
    assert np.allclose(g.mean(axis=0), 0, atol=1e-12) and np.allclose(g.std(axis=0), 1)


def test_pca_through_the_gram_matrix_matches_scikit_learn():
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import MinMaxScaler, StandardScaler

    x, _ = planted_updates(1, p=300)
    xs = StandardScaler().fit_transform(x)
    pca = PCA(n_components=2, svd_solver="full").fit(xs)
    reference = MinMaxScaler().fit_transform(pca.transform(x))  # the reference code: fitted on xs, applied to raw x
    ours = pca_features(x)
    for k in range(2):  # up to the sign of each component (min-max of -v is 1 - min-max of v)
        assert np.allclose(ours[:, k], reference[:, k], atol=1e-8) or np.allclose(ours[:, k], 1 - reference[:, k],
                                                                                  atol=1e-8)


def test_separation_scores_hand_example():
    mss, mpo = separation(np.array([[0.0, 0.0], [3.0, 0.0]]), np.array([0.5, 1.0]))
    assert mss == pytest.approx(1.5)
    assert mpo == pytest.approx(1 - math.erf(1.5 / math.sqrt(2))) and mpo == pytest.approx(0.13361, abs=1e-5)
    assert separation(np.zeros((1, 2)), np.ones(1)) == (math.inf, 0.0)


@pytest.mark.parametrize("mpo, rounds, expected", [
    (0.0, 200, (100, 100)), (0.5, 200, (50, 50)), (0.25, 101, (37, 37)),
    (1 - math.erf(math.sqrt(2)), 200, (95, 95)), (0.999, 200, (0, 2)),
])
def test_second_stage_length(mpo, rounds, expected):
    assert second_stage_rounds(mpo, rounds) == expected


def test_bad_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="E >= 3"):
        second_stage_rounds(0.1, 2)
    with pytest.raises(ValueError, match="clients >= 2"):
        pca_features(np.ones((1, 5)))
    with pytest.raises(ValueError, match="number of clusters"):
        fit_clusters(np.zeros((3, 2)), 4, 0)
    with pytest.raises(ValueError, match="no candidate"):
        choose_clusters(np.zeros((2, 2)), 0)

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.data import dirichlet, iid, label_shards
from dpfl.data.partition import dirichlet_quota


def _assert_disjoint(parts, n):
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "clients share an index"
    assert allidx.min(initial=0) >= 0 and allidx.max(initial=0) < max(n, 1)
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)


def _assert_partition(parts, n):
    _assert_disjoint(parts, n)
    assert sum(len(p) for p in parts) == n


def test_iid_equal_sizes_with_remainder_spread():
    parts = iid(23, 5, 0)
    _assert_partition(parts, 23)
    assert [len(p) for p in parts] == [5, 5, 5, 4, 4]


def test_iid_is_seeded_and_random():
    assert all(np.array_equal(a, b) for a, b in zip(iid(100, 4, 7), iid(100, 4, 7), strict=True))
    assert not np.array_equal(iid(100, 4, 7)[0], iid(100, 4, 8)[0])
    assert not np.array_equal(iid(100, 4, 7)[0], np.arange(25))  # not contiguous blocks
    gen = np.random.default_rng(3)
    assert all(np.array_equal(a, b) for a, b in zip(iid(50, 2, gen), iid(50, 2, np.random.default_rng(3)), strict=True))


def test_iid_explicit_sizes():
    parts = iid(100, 3, 0, sizes=[10, 0, 50])
    _assert_disjoint(parts, 100)
    assert [len(p) for p in parts] == [10, 0, 50]
    with pytest.raises(ValueError, match="sizes must sum to at most n=100, got sum 101"):
        iid(100, 2, 0, sizes=[50, 51])
    with pytest.raises(ValueError, match="sizes must be >= 0"):
        iid(100, 2, 0, sizes=[-1, 5])
    with pytest.raises(ValueError, match="sizes must be 3 integers"):
        iid(100, 3, 0, sizes=[1, 2])


def test_label_shards_give_each_client_at_most_two_classes():
    labels = np.repeat(np.arange(10), 60)  # 600 samples, 20 shards of 30: each shard is one class
    labels = np.random.default_rng(0).permutation(labels)
    parts = label_shards(labels, 10, 2, 1)
    _assert_partition(parts, 600)
    assert [len(p) for p in parts] == [60] * 10
    n_classes = [len(np.unique(labels[p])) for p in parts]
    assert max(n_classes) <= 2 and np.mean(n_classes) > 1.2  # random pairing, not always the same class twice


def test_label_shards_uneven_sizes_and_errors():
    labels = np.arange(101) % 3
    parts = label_shards(labels, 4, 3, 0)
    _assert_partition(parts, 101)
    with pytest.raises(ValueError, match="need at least n_clients \\* shards_per_client = 8 samples"):
        label_shards(np.zeros(7), 4, 2, 0)
    with pytest.raises(ValueError, match="shards_per_client must be an int >= 1"):
        label_shards(labels, 4, 0, 0)


def _skew(parts, labels):
    """Mean share of a client's most common class."""
    return np.mean([np.bincount(labels[p]).max() / len(p) for p in parts if len(p)])


def test_dirichlet_covers_and_skews_with_small_alpha():
    labels = np.repeat(np.arange(10), 200)
    low = dirichlet(labels, 20, 0.1, 0)
    high = dirichlet(labels, 20, 100.0, 0)
    _assert_partition(low, 2000)
    _assert_partition(high, 2000)
    assert min(len(p) for p in low) >= 1
    assert _skew(low, labels) > 0.5 > 0.2 > _skew(high, labels)


def test_dirichlet_repairs_instead_of_looping_forever():
    labels = np.repeat(np.arange(2), 50)
    with pytest.warns(RuntimeWarning, match="no draw gave every client >= 9 samples in 3 tries"):
        parts = dirichlet(labels, 10, 0.01, 0, min_size=9, max_tries=3)
    _assert_partition(parts, 100)
    assert min(len(p) for p in parts) >= 9


def test_dirichlet_argument_errors():
    labels = np.zeros(10, dtype=int)
    with pytest.raises(ValueError, match=r"need n >= n_clients \* min_size = 12"):
        dirichlet(labels, 4, 1.0, 0, min_size=3)
    for alpha in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alpha must be a finite number > 0"):
            dirichlet(labels, 2, alpha, 0)
    with pytest.raises(ValueError, match="max_tries must be an int >= 1"):
        dirichlet(labels, 2, 1.0, 0, max_tries=0)
    with pytest.raises(ValueError, match="labels must be a 1-d array"):
        dirichlet(np.zeros((2, 5)), 2, 1.0, 0)


def test_rng_and_count_validation():
    with pytest.raises(ValueError, match="rng must be a numpy Generator, a non-negative int seed or None"):
        iid(10, 2, "seed")
    with pytest.raises(ValueError, match="n_clients must be an int >= 1, got 0"):
        iid(10, 0, 0)
    assert all(np.array_equal(a, b) for a, b in zip(iid(10, 2), iid(10, 2, None), strict=True))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 300),
    n_clients=st.integers(1, 12),
    seed=st.integers(0, 2**32),
)
def test_iid_always_partitions(n, n_clients, seed):
    parts = iid(n, n_clients, seed)
    _assert_partition(parts, n)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=40, deadline=None)
@given(
    labels=st.lists(st.integers(0, 5), min_size=12, max_size=200),
    n_clients=st.integers(1, 6),
    alpha=st.floats(0.01, 10.0),
    seed=st.integers(0, 1000),
)
def test_dirichlet_always_partitions_with_min_size(labels, n_clients, alpha, seed):
    labels = np.array(labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        parts = dirichlet(labels, n_clients, alpha, seed, min_size=2, max_tries=5)
    _assert_partition(parts, len(labels))
    assert min(len(p) for p in parts) >= 2


def test_dirichlet_quota_gives_equal_disjoint_skewed_shares():
    labels = np.repeat(np.arange(10), 100)
    parts = dirichlet_quota(labels, 8, 0.1, 60, rng=3)
    assert [len(p) for p in parts] == [60] * 8
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)  # without replacement across clients
    top_share = [np.bincount(labels[p], minlength=10).max() / 60 for p in parts]
    assert np.mean(top_share) > 0.5  # Dir(0.1): most of a client's quota from one class
    iid_like = dirichlet_quota(labels, 8, 1000.0, 60, rng=3)
    assert np.mean([np.bincount(labels[p], minlength=10).max() / 60 for p in iid_like]) < 0.3
    again = dirichlet_quota(labels, 8, 0.1, 60, rng=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_dirichlet_quota_renormalises_when_a_class_runs_out_and_checks_sizes():
    labels = np.array([0] * 5 + [1] * 95)
    parts = dirichlet_quota(labels, 2, 0.1, 50, rng=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(100))  # everything used, nothing twice
    with pytest.raises(ValueError, match="need 120 samples"):
        dirichlet_quota(labels, 2, 0.1, 60)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_quota(labels, 2, 0.0, 10)


def test_iid_equal_gives_equal_shards_of_one_permutation_in_its_order():
    """MP-DP's comparison split (spec bidirectional.md §11): shard k is positions k m .. (k + 1) m - 1 of one seeded
    permutation, unsorted (FedSGD draws batches by position), the remainder left out."""
    from dpfl.data.partition import iid_equal
    from dpfl.seeding import Purpose, numpy_generator

    parts = iid_equal(103, 5, 7)
    perm = numpy_generator(7, Purpose.PARTITION).permutation(103)
    assert [len(p) for p in parts] == [20] * 5
    for k, part in enumerate(parts):
        assert part.tolist() == perm[k * 20:(k + 1) * 20].tolist()
    assert any(part.tolist() != sorted(part.tolist()) for part in parts)  # the order is the permutation's
    assert [len(p) for p in iid_equal(103, 5, 7, per_client=3)] == [3] * 5
    with pytest.raises(ValueError, match="exceed the 103 records"):
        iid_equal(103, 5, 7, per_client=21)

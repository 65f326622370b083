"""Structured-heterogeneity partitions (clustered_dpfl.md §2, required test 6)."""

import math

import numpy as np
import pytest
import torch

from dpfl.data.builtin import load_digits
from dpfl.data.clustered import cluster_sizes, clustered_split, shift_images


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def base_index(base, x: torch.Tensor) -> int:
    """The base training record whose image is exactly `x` (digits images are distinct enough to be unique)."""
    hits = torch.nonzero((base.x_train == x).flatten(1).all(dim=1)).flatten()
    assert len(hits) >= 1
    return int(hits[0])


def test_cluster_sizes_and_contiguous_ids(digits):
    assert cluster_sizes(21, 4, 0.15) == [3, 6, 6, 6]
    assert cluster_sizes(11, 4, 0.2) == [2, 3, 3, 3]
    fed = clustered_split(digits, 21, 4, n_train_per_client=100, seed=0)
    assert fed.info["true_cluster"] == [0] * 3 + [1] * 6 + [2] * 6 + [3] * 6 and fed.info["minority_cluster"] == 0
    assert all(c.n_train == 100 and c.n_val == 25 and c.n_test == len(digits.y_test) // 6 for c in fed.clients)


@pytest.mark.parametrize("n, m, ratio", [(20, 4, 0.15), (10, 4, 0.05), (5, 1, 0.2)])
def test_impossible_sizes_are_refused(n, m, ratio):
    with pytest.raises(ValueError) as err:
        cluster_sizes(n, m, ratio)
    if m >= 2 and math.floor(ratio * n) >= 1:
        assert "nearest valid number of clients is" in str(err.value)


def test_rotation_is_rot90_per_cluster(digits):
    fed = clustered_split(digits, 21, 4, shift="rotation", n_train_per_client=60, seed=1)
    for i, m in enumerate(fed.info["true_cluster"]):
        c = fed.clients[i]
        for x, y in zip(c.x_train[:5], c.y_train[:5], strict=True):
            j = base_index(digits, torch.rot90(x.unsqueeze(0), k=-m, dims=(2, 3))[0])
            assert torch.equal(torch.rot90(digits.x_train[j:j + 1], k=m, dims=(2, 3))[0], x)
            assert int(digits.y_train[j]) == int(y)
        assert torch.equal(c.x_test[:1], shift_images(c.x_test[:1], 0, 4))  # the rotation is already applied once
    rotated = shift_images(digits.x_train[:4], 1, 3)  # 120 degrees: bilinear, zero fill, same shape
    assert rotated.shape == (4, 1, 8, 8) and rotated[:, :, 0, 0].abs().max() < 1e-6


def test_label_flip_maps_y_to_y_plus_m(digits):
    fed = clustered_split(digits, 11, 4, shift="label_flip", minority_ratio=0.2, n_train_per_client=50, seed=2)
    for i, m in enumerate(fed.info["true_cluster"]):
        c = fed.clients[i]
        for x, y in zip(c.x_train[:10], c.y_train[:10], strict=True):
            assert int(y) == (int(digits.y_train[base_index(digits, x)]) + m) % 10


def test_label_shift_purity_is_within_three_standard_errors(digits):
    purity, n = 0.9, 150  # digits' 2-class groups hold ~290 training records: 0.9 x 188 draws fit
    fed = clustered_split(digits, 11, 4, shift="label_shift", minority_ratio=0.2, n_train_per_client=n, seed=3,
                          purity=purity)
    total = inside = 0
    for i, m in enumerate(fed.info["true_cluster"]):
        y = torch.cat([fed.clients[i].y_train, fed.clients[i].y_val]).numpy()
        inside += int((y % 4 == m).sum())
        total += len(y)
    se = math.sqrt(purity * (1 - purity) / total)
    assert abs(inside / total - purity) <= 3 * se
    plain = clustered_split(digits, 11, 4, shift="rotation", minority_ratio=0.2, n_train_per_client=n, seed=3)
    y0 = plain.clients[0].y_train.numpy()
    assert abs((y0 % 4 == 0).mean() - purity) > 3 * math.sqrt(purity * (1 - purity) / len(y0))  # not vacuous
    with pytest.raises(ValueError, match="use fewer records per client"):  # 0.9 x 375 > a 2-class group: refused
        clustered_split(digits, 11, 4, shift="label_shift", minority_ratio=0.2, n_train_per_client=300, seed=3)


def test_seeded_reproducible_and_disjoint_option(digits):
    a = clustered_split(digits, 11, 4, minority_ratio=0.2, n_train_per_client=40, seed=5)
    b = clustered_split(digits, 11, 4, minority_ratio=0.2, n_train_per_client=40, seed=5)
    assert all(torch.equal(p.x_train, q.x_train) for p, q in zip(a.clients, b.clients, strict=True))
    d = clustered_split(digits, 11, 4, minority_ratio=0.2, n_train_per_client=40, seed=5, disjoint=True,
                        shift="label_flip")
    seen = [base_index(digits, x) for c in d.clients for x in torch.cat([c.x_train, c.x_val])]
    assert len(seen) == len(set(seen))
    with pytest.raises(ValueError, match="use fewer records per client"):
        clustered_split(digits, 11, 4, minority_ratio=0.2, n_train_per_client=400, seed=5, disjoint=True)


def test_normalisation_follows_the_shift(digits):
    fed = clustered_split(digits, 11, 4, minority_ratio=0.2, n_train_per_client=20, seed=0,
                          normalize=(0.1307, 0.3081))
    raw = clustered_split(digits, 11, 4, minority_ratio=0.2, n_train_per_client=20, seed=0)
    assert torch.allclose(fed.clients[5].x_train, (raw.clients[5].x_train - 0.1307) / 0.3081)
    assert np.isclose(float(fed.clients[5].x_train.min()), -0.1307 / 0.3081)  # zero-filled/zero pixels map here

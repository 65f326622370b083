"""Stratified train/test splitting, shared by the built-in datasets and the per-client test splits.

Stratifying keeps every class's share equal in both parts, which matters for small datasets
(digits) and for clients that hold only a few samples of some class.
"""

from __future__ import annotations

import numpy as np


def stratified_split(
    labels: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) positions into ``labels``; the test part has ``round(test_fraction * n)`` items.

    Each class contributes ``floor(fraction * n_class)`` test items, and the remaining slots go to
    the classes with the largest fractional remainders (largest-remainder rounding).
    """
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-d, got shape {labels.shape}")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    n = labels.shape[0]
    if n == 0 or test_fraction == 0.0:
        return np.arange(n, dtype=np.int64), np.empty(0, dtype=np.int64)
    classes, inverse = np.unique(labels, return_inverse=True)
    counts = np.bincount(inverse, minlength=len(classes))
    exact = test_fraction * counts
    take = np.floor(exact).astype(np.int64)
    extra = int(round(test_fraction * n)) - int(take.sum())
    if extra > 0:
        order = np.argsort(-(exact - take), kind="stable")
        take[order[:extra]] += 1
    test = []
    for k in range(len(classes)):
        members = np.flatnonzero(inverse == k)
        test.append(rng.permutation(members)[: take[k]])
    test_idx = np.sort(np.concatenate(test)).astype(np.int64)
    mask = np.ones(n, dtype=bool)
    mask[test_idx] = False
    return np.flatnonzero(mask).astype(np.int64), test_idx

"""Datasets that need no files: scikit-learn's bundled digits and a seeded Gaussian classification set.

They make every example and test runnable on a machine with no data at all.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from dpfl.data.arrays import ArrayDataset, Normalize, images_to_tensor
from dpfl.data.splits import stratified_split
from dpfl.seeding import Purpose, numpy_generator

DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0  # fixed, so the digits test set is the same in every run


def load_digits(*, normalize: Normalize | None = None) -> ArrayDataset:
    """The 1,797 8x8 digits as (N, 1, 8, 8) in [0, 1] (pixels are 0..16), with a fixed stratified 20% test split."""
    images, labels = _digits_arrays()
    train, test = stratified_split(labels, DIGITS_TEST_FRACTION, numpy_generator(DIGITS_SPLIT_SEED, Purpose.PARTITION))
    x = images_to_tensor(images, scale=16.0, normalize=normalize)
    y = torch.from_numpy(labels.copy())
    return ArrayDataset("digits", x[train], y[train], x[test], y[test], n_classes=10)


@functools.cache
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The raw arrays, read once per process (scikit-learn parses a CSV each call)."""
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    images = bunch.images.astype(np.uint8)[:, None, :, :]
    labels = bunch.target.astype(np.int64)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


def make_classification(
    *,
    n_samples: int = 2000,
    n_features: int = 20,
    n_classes: int = 4,
    class_sep: float = 1.0,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> ArrayDataset:
    """Gaussian blobs: class centres ``class_sep * N(0, I)``, samples ``centre + N(0, I)``, balanced classes.

    A stand-in for scikit-learn's ``make_classification`` drawn from dpfl's seeded DATA stream, so
    it follows the run seed like every other random draw.
    """
    for label, value, low in (("n_samples", n_samples, 2), ("n_features", n_features, 1), ("n_classes", n_classes, 2)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise ValueError(f"{label} must be an int >= {low}, got {value!r}")
    if n_samples < n_classes:
        raise ValueError(f"n_samples must be >= n_classes ({n_classes}), got {n_samples}")
    if not (np.isfinite(class_sep) and class_sep >= 0):
        raise ValueError(f"class_sep must be a finite number >= 0, got {class_sep!r}")
    rng = numpy_generator(seed, Purpose.DATA)
    centres = class_sep * rng.standard_normal((n_classes, n_features))
    labels = rng.permutation(np.arange(n_samples) % n_classes).astype(np.int64)
    x = centres[labels] + rng.standard_normal((n_samples, n_features))
    train, test = stratified_split(labels, test_fraction, rng)
    xt = torch.from_numpy(x.astype(np.float32))
    yt = torch.from_numpy(labels)
    return ArrayDataset("synthetic", xt[train], yt[train], xt[test], yt[test], n_classes=int(n_classes))

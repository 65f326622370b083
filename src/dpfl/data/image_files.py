"""Loaders for the image datasets read from their standard files (IDX for the MNIST family, pickles for CIFAR)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dpfl.data.arrays import ArrayDataset, Normalize, images_to_tensor
from dpfl.data.catalog import EMNIST_SPLITS
from dpfl.data.cifar import read_cifar_batch
from dpfl.data.idx import read_idx
from dpfl.data.sources import Location, locate


def load_mnist_like(
    name: str, *, root: str | Path | None = None, normalize: Normalize | None = None, download: bool = True
) -> ArrayDataset:
    """MNIST or Fashion-MNIST: 28x28 greyscale as (N, 1, 28, 28) in [0, 1], labels 0..9."""
    loc = locate(name, root, download=download)
    return _from_idx(name, loc, "", n_classes=10, normalize=normalize)


def load_emnist(
    *,
    root: str | Path | None = None,
    split: str = "letters",
    normalize: Normalize | None = None,
    download: bool = True,
) -> ArrayDataset:
    """One EMNIST split. Images are stored transposed and are transposed back; letters' labels 1..26 become 0..25."""
    loc = locate("emnist", root, download=download, split=split)
    ds = _from_idx(
        f"emnist-{split}", loc, f"emnist-{split}-", n_classes=EMNIST_SPLITS[split], normalize=normalize,
        transpose=True, label_offset=1 if split == "letters" else 0,
    )
    return ds


def load_cifar10(
    *, root: str | Path | None = None, normalize: Normalize | None = None, download: bool = True
) -> ArrayDataset:
    """CIFAR-10 as (N, 3, 32, 32) in [0, 1]; 50,000 train (five batches) and 10,000 test."""
    loc = locate("cifar10", root, download=download)
    parts = [read_cifar_batch(loc.file(f"data_batch_{i}")) for i in range(1, 6)]
    train = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    test = read_cifar_batch(loc.file("test_batch"))
    return _assemble("cifar10", train, test, 10, normalize)


def load_cifar100(
    *,
    root: str | Path | None = None,
    labels: str = "fine",
    normalize: Normalize | None = None,
    download: bool = True,
) -> ArrayDataset:
    """CIFAR-100 as (N, 3, 32, 32) in [0, 1] with its 100 fine labels (or ``labels="coarse"``: 20 superclasses)."""
    if labels not in ("fine", "coarse"):
        raise ValueError(f"labels must be 'fine' or 'coarse', got {labels!r}")
    loc = locate("cifar100", root, download=download)
    key = f"{labels}_labels"
    train = read_cifar_batch(loc.file("train"), label_key=key)
    test = read_cifar_batch(loc.file("test"), label_key=key)
    return _assemble("cifar100", train, test, 100 if labels == "fine" else 20, normalize)


def _from_idx(
    name: str,
    loc: Location,
    prefix: str,
    n_classes: int,
    normalize: Normalize | None,
    transpose: bool = False,
    label_offset: int = 0,
) -> ArrayDataset:
    splits = []
    for part in ("train", "t10k" if not prefix else "test"):
        images = read_idx(loc.file(f"{prefix}{part}-images-idx3-ubyte"), ndim=3)
        labels = read_idx(loc.file(f"{prefix}{part}-labels-idx1-ubyte"), ndim=1)
        if images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"{name} {part}: {images.shape[0]} images but {labels.shape[0]} labels in {loc.path}"
            )
        if images.dtype != np.uint8:
            raise ValueError(f"{name} {part}: images must be unsigned bytes, got {images.dtype}")
        if transpose:
            images = images.transpose(0, 2, 1)
        splits.append((images[:, None, :, :], labels.astype(np.int64) - label_offset))
    return _assemble(name, splits[0], splits[1], n_classes, normalize)


def _assemble(
    name: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    n_classes: int,
    normalize: Normalize | None,
) -> ArrayDataset:
    return ArrayDataset(
        name,
        images_to_tensor(train[0], normalize=normalize),
        torch.from_numpy(np.ascontiguousarray(train[1])),
        images_to_tensor(test[0], normalize=normalize),
        torch.from_numpy(np.ascontiguousarray(test[1])),
        n_classes=n_classes,
    )

"""Tiny datasets written in the real file formats (IDX, CIFAR pickles) for loader tests."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from dpfl.data.idx import write_idx


def write_mnist_files(
    directory: Path,
    n_train: int = 12,
    n_test: int = 5,
    *,
    prefix: str = "",
    test_part: str = "t10k",
    compress: bool = True,
    label_range: tuple[int, int] = (0, 10),
    transpose: bool = False,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Write train/test IDX images and labels; returns the arrays in their true (untransposed) orientation.

    Images are 28x28 with a distinct, asymmetric pattern per sample so orientation errors show up.
    With ``transpose`` the files store each image transposed, as EMNIST does.
    """
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for part, n in (("train", n_train), (test_part, n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(label_range[0], label_range[1], size=n).astype(np.uint8)
        stored = images.transpose(0, 2, 1) if transpose else images
        suffix = ".gz" if compress else ""
        write_idx(directory / f"{prefix}{part}-images-idx3-ubyte{suffix}", stored, compress=compress)
        write_idx(directory / f"{prefix}{part}-labels-idx1-ubyte{suffix}", labels, compress=compress)
        key = "train" if part == "train" else "test"
        out[f"x_{key}"], out[f"y_{key}"] = images, labels
    return out


def cifar_images(n: int, offset: int) -> np.ndarray:
    """(n, 3072) rows whose R, G, B planes are constant and distinct, tagged by sample."""
    rows = np.empty((n, 3, 1024), dtype=np.uint8)
    for i in range(n):
        for c in range(3):
            rows[i, c] = (offset + 10 * i + c) % 256
    return rows.reshape(n, 3072)


def write_cifar10(directory: Path, per_batch: int = 3, n_test: int = 4) -> dict[str, np.ndarray]:
    directory.mkdir(parents=True, exist_ok=True)
    xs, ys = [], []
    for b in range(1, 6):
        data = cifar_images(per_batch, offset=50 * b)
        labels = [(b + i) % 10 for i in range(per_batch)]
        _dump(directory / f"data_batch_{b}", {b"batch_label": b"x", b"data": data, b"labels": labels})
        xs.append(data)
        ys.extend(labels)
    test = cifar_images(n_test, offset=7)
    test_labels = [i % 10 for i in range(n_test)]
    _dump(directory / "test_batch", {b"data": test, b"labels": test_labels})
    return {"x_train": np.concatenate(xs), "y_train": np.array(ys), "x_test": test, "y_test": np.array(test_labels)}


def write_cifar100(directory: Path, n_train: int = 6, n_test: int = 3) -> dict[str, np.ndarray]:
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for part, n in (("train", n_train), ("test", n_test)):
        data = cifar_images(n, offset=3)
        fine = [(97 + 2 * i) % 100 for i in range(n)]
        coarse = [f % 20 for f in fine]
        _dump(directory / part, {b"data": data, b"fine_labels": fine, b"coarse_labels": coarse})
        out[f"x_{part}"], out[f"fine_{part}"], out[f"coarse_{part}"] = data, np.array(fine), np.array(coarse)
    return out


def _dump(path: Path, obj: dict) -> None:
    # Protocol 2 with byte keys, like the original Python 2 batches.
    path.write_bytes(pickle.dumps(obj, protocol=2))

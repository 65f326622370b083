"""In-memory datasets as tensors, in the one layout every model and partitioner expects.

Images are NCHW float32, labels int64 class indices in ``[0, n_classes)``. Validation happens here
once, so a loader bug (wrong dtype, label out of range, split size mismatch) fails at load time
instead of as a shape error deep inside a vectorised training step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

Normalize = tuple[float | Sequence[float], float | Sequence[float]]


@dataclass
class ArrayDataset:
    """A labelled train/test split held in memory."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_classes: int

    def __post_init__(self) -> None:
        if not isinstance(self.n_classes, int) or self.n_classes < 1:
            raise ValueError(f"n_classes must be a positive int, got {self.n_classes!r}")
        for split in ("train", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
                raise ValueError(f"x_{split} must be a float32 tensor, got {_describe(x)}")
            if not isinstance(y, torch.Tensor) or y.dtype != torch.int64 or y.ndim != 1:
                raise ValueError(f"y_{split} must be a 1-d int64 tensor, got {_describe(y)}")
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"x_{split} has {x.shape[0]} samples but y_{split} has {y.shape[0]} labels")
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.n_classes):
                raise ValueError(
                    f"y_{split} labels must lie in [0, {self.n_classes}), "
                    f"got range [{int(y.min())}, {int(y.max())}]"
                )
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise ValueError(
                f"train and test samples differ in shape: {tuple(self.x_train.shape[1:])} "
                f"vs {tuple(self.x_test.shape[1:])}"
            )

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample, e.g. (1, 28, 28)."""
        return tuple(self.x_train.shape[1:])

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.x_test.shape[0])


def images_to_tensor(images: np.ndarray, scale: float = 255.0, normalize: Normalize | None = None) -> torch.Tensor:
    """Integer pixels (N, C, H, W) -> float32 in [0, 1] (``/scale``), then ``(x - mean) / std`` if asked.

    ``normalize`` is ``(mean, std)`` with scalars or one value per channel; it is applied after the
    division so published means/stds (computed on [0, 1] pixels) can be used as they are.
    """
    if images.ndim != 4:
        raise ValueError(f"images must be a 4-d (N, C, H, W) array, got shape {images.shape}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    x = torch.from_numpy(np.array(images, dtype=np.float32)).div_(float(scale))  # a fresh, writable copy
    if normalize is None:
        return x
    mean, std = channel_stats(normalize, n_channels=x.shape[1])
    return x.sub_(mean).div_(std)


def channel_stats(normalize: Normalize, n_channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) of a `normalize` pair as [1, C, 1, 1] float32 tensors (a scalar or one value per channel)."""
    try:
        mean, std = normalize
    except (TypeError, ValueError):
        raise ValueError(f"normalize must be a (mean, std) pair, got {normalize!r}") from None
    out = []
    for label, value in (("mean", mean), ("std", std)):
        t = torch.as_tensor(value, dtype=torch.float32).reshape(-1)
        if t.numel() not in (1, n_channels):
            raise ValueError(
                f"normalize {label} must be a scalar or have one value per channel ({n_channels}), got {value!r}"
            )
        if not torch.isfinite(t).all():
            raise ValueError(f"normalize {label} must be finite, got {value!r}")
        out.append(t.reshape(1, -1, 1, 1))
    if (out[1] <= 0).any():
        raise ValueError(f"normalize std must be > 0, got {std!r}")
    return out[0], out[1]


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    return type(value).__name__

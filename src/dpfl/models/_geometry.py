"""Shape arithmetic shared by the model builders.

Builders raise `ShapeError` with the reason an input shape does not fit; the registry turns it into a
`ValueError` that names the model, the shape and what the model accepts.
"""

from __future__ import annotations

import math


class ShapeError(ValueError):
    """An input shape a model cannot take (the message says why)."""


def _positive(input_shape: tuple[int, ...]) -> None:
    if any(d < 1 for d in input_shape):
        raise ShapeError("every dimension must be at least 1")


def flat_size(input_shape: tuple[int, ...]) -> int:
    """Number of features after flattening one sample of `input_shape`."""
    if len(input_shape) == 0:
        raise ShapeError("an empty shape has no features")
    _positive(input_shape)
    return math.prod(input_shape)


def image_shape(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """`input_shape` as (C, H, W), or a ShapeError if it is not a 3-D image shape."""
    if len(input_shape) != 3:
        raise ShapeError(f"needs a (C, H, W) image shape, got {len(input_shape)} dimension(s)")
    _positive(input_shape)
    return input_shape[0], input_shape[1], input_shape[2]


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0, *, layer: str) -> int:
    """Output length of a convolution or pooling window along one axis (floor mode, like PyTorch)."""
    span = size + 2 * padding
    if span < kernel:
        raise ShapeError(
            f"{layer} (kernel {kernel}, stride {stride}, padding {padding}) gets spatial size {size}, "
            f"smaller than its window"
        )
    return (span - kernel) // stride + 1


def conv_out2d(
    hw: tuple[int, int], kernel: int, stride: int = 1, padding: int = 0, *, layer: str
) -> tuple[int, int]:
    """`conv_out` applied to both spatial axes."""
    return (
        conv_out(hw[0], kernel, stride, padding, layer=layer),
        conv_out(hw[1], kernel, stride, padding, layer=layer),
    )

"""Small convolutional networks of the specs.

* `cnn_pfa` — PFA's 2-layer CNN (the tensorflow-privacy tutorial model), heterogeneous_dp.md §7.1.
* `cnn_rhdp` (alias `cnn_mnist_dp`) — Robust-HDP thesis Table B.1 / R-DPCFL thesis CNN.
* `cnn_mnist_splitting` — the operator-splitting reference code's MNIST CNN (operator_splitting.md §10),
  which ends in log_softmax: train it with NLL.
* `cnn_digits` — R-DPCFL's CI network for 1x8x8 digits (clustered_dpfl.md §8).
* `cnn_digits_nobias` — the bias-free conv(8)–maxpool–conv(16)–linear network of the bidirectional
  spec's ``ci_digits_cnn`` config (MSE on one-hot targets).

Every model is an `nn.Sequential` with named layers (parameter names such as ``conv1.weight``) and
takes a batch ``[B, C, H, W]``. Geometry is computed from the input shape, so the spec shapes give the
spec's parameter counts and other image sizes work whenever every window fits.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import ClassVar

from torch import nn

from dpfl.models._geometry import conv_out2d, image_shape
from dpfl.models._options import dropout_rate, flag


class CNNPFA(nn.Sequential):
    """conv1 Conv(C->16, 8x8, stride 2, padding 3) -> ReLU -> MaxPool(2, stride 1) ->
    conv2 Conv(16->32, 4x4, stride 2) -> ReLU -> MaxPool(2, stride 1) -> Flatten ->
    fc1 Linear(512->32) -> ReLU -> fc2 Linear(32->n_classes).

    On 1x28x28 / 10 classes: 8 tensors, 26,010 parameters (padding 3 is TF's 'same' at 28x28 and is
    kept fixed for other sizes). PFA configs build it with ``init="keras"``.
    """

    loss_kind: ClassVar[str] = "cross_entropy"
    head_name: ClassVar[str] = "fc2"

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        c, h, w = image_shape(input_shape)
        hw = conv_out2d((h, w), 8, 2, 3, layer="conv1")
        hw = conv_out2d(hw, 2, 1, 0, layer="pool1")
        hw = conv_out2d(hw, 4, 2, 0, layer="conv2")
        hw = conv_out2d(hw, 2, 1, 0, layer="pool2")
        super().__init__(
            OrderedDict(
                conv1=nn.Conv2d(c, 16, 8, stride=2, padding=3),
                relu1=nn.ReLU(),
                pool1=nn.MaxPool2d(2, stride=1),
                conv2=nn.Conv2d(16, 32, 4, stride=2),
                relu2=nn.ReLU(),
                pool2=nn.MaxPool2d(2, stride=1),
                flatten=nn.Flatten(start_dim=1),
                fc1=nn.Linear(32 * hw[0] * hw[1], 32),
                relu3=nn.ReLU(),
                fc2=nn.Linear(32, n_classes),
            )
        )


class CNNRHDP(nn.Sequential):
    """conv1 Conv(C->16, 5x5, pad 2) -> ReLU -> MaxPool 2 -> conv2 Conv(16->32, 5x5, pad 2) -> ReLU ->
    MaxPool 2 -> Flatten -> fc Linear(1568->n_classes).

    On 1x28x28 / 10 classes: 6 tensors, 28,938 parameters (the thesis prints 28,939).
    """

    loss_kind: ClassVar[str] = "cross_entropy"
    head_name: ClassVar[str] = "fc"

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        c, h, w = image_shape(input_shape)
        hw = conv_out2d((h, w), 5, 1, 2, layer="conv1")
        hw = conv_out2d(hw, 2, 2, 0, layer="pool1")
        hw = conv_out2d(hw, 5, 1, 2, layer="conv2")
        hw = conv_out2d(hw, 2, 2, 0, layer="pool2")
        super().__init__(
            OrderedDict(
                conv1=nn.Conv2d(c, 16, 5, padding=2),
                relu1=nn.ReLU(),
                pool1=nn.MaxPool2d(2),
                conv2=nn.Conv2d(16, 32, 5, padding=2),
                relu2=nn.ReLU(),
                pool2=nn.MaxPool2d(2),
                flatten=nn.Flatten(start_dim=1),
                fc=nn.Linear(32 * hw[0] * hw[1], n_classes),
            )
        )


class CNNMnistSplitting(nn.Sequential):
    """conv1 Conv(C->10, 5x5) -> MaxPool 2 -> ReLU -> conv2 Conv(10->20, 5x5) -> Dropout2d -> MaxPool 2 ->
    ReLU -> Flatten (320) -> fc1 Linear(320->20) -> ReLU -> fc2 Linear(20->n_classes) -> log_softmax.

    **Outputs log-probabilities: its loss is NLL** (``loss_kind = "nll"``), not cross-entropy on logits.
    11,910 parameters on 1x28x28 / 10 classes. ``dropout`` is the Dropout2d rate (PyTorch's default 0.5
    as in the reference code; 0 replaces it by `nn.Identity`). Dropout2d zeroes whole channels of each
    sample; under `torch.func.vmap` in training mode use ``randomness="different"``.
    """

    loss_kind: ClassVar[str] = "nll"
    head_name: ClassVar[str] = "fc2"

    def __init__(self, input_shape: tuple[int, ...], n_classes: int, dropout: float = 0.5) -> None:
        c, h, w = image_shape(input_shape)
        hw = conv_out2d((h, w), 5, 1, 0, layer="conv1")
        hw = conv_out2d(hw, 2, 2, 0, layer="pool1")
        hw = conv_out2d(hw, 5, 1, 0, layer="conv2")
        hw = conv_out2d(hw, 2, 2, 0, layer="pool2")
        super().__init__(
            OrderedDict(
                conv1=nn.Conv2d(c, 10, 5),
                pool1=nn.MaxPool2d(2),
                relu1=nn.ReLU(),
                conv2=nn.Conv2d(10, 20, 5),
                conv2_drop=nn.Dropout2d(dropout) if dropout > 0 else nn.Identity(),
                pool2=nn.MaxPool2d(2),
                relu2=nn.ReLU(),
                flatten=nn.Flatten(start_dim=1),
                fc1=nn.Linear(20 * hw[0] * hw[1], 20),
                relu3=nn.ReLU(),
                fc2=nn.Linear(20, n_classes),
                log_softmax=nn.LogSoftmax(dim=-1),
            )
        )


class CNNDigits(nn.Sequential):
    """R-DPCFL CI network: conv1 Conv(C->8, 3x3, pad 1) -> ReLU -> MaxPool 2 -> Flatten (128) ->
    fc Linear(128->n_classes). 1,370 parameters on 1x8x8 / 10 classes."""

    loss_kind: ClassVar[str] = "cross_entropy"
    head_name: ClassVar[str] = "fc"

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        c, h, w = image_shape(input_shape)
        hw = conv_out2d((h, w), 3, 1, 1, layer="conv1")
        hw = conv_out2d(hw, 2, 2, 0, layer="pool1")
        super().__init__(
            OrderedDict(
                conv1=nn.Conv2d(c, 8, 3, padding=1),
                relu1=nn.ReLU(),
                pool1=nn.MaxPool2d(2),
                flatten=nn.Flatten(start_dim=1),
                fc=nn.Linear(8 * hw[0] * hw[1], n_classes),
            )
        )


class CNNDigitsNoBias(nn.Sequential):
    """Bidirectional ``ci_digits_cnn``: conv1 Conv(C->8, 3x3, pad 1) -> ReLU -> MaxPool 2 ->
    conv2 Conv(8->16, 3x3, pad 1) -> ReLU -> Flatten -> fc Linear(->n_classes); no biases by default.

    ReLU after every layer but the last, the last layer linear (as MP-DP requires, §7.2); trained with
    MSE on one-hot targets. Kernel sizes are dpfl's choice (the spec names only the widths).
    3,784 parameters on 1x8x8 / 10 classes.
    """

    loss_kind: ClassVar[str] = "mse_onehot"
    head_name: ClassVar[str] = "fc"

    def __init__(self, input_shape: tuple[int, ...], n_classes: int, bias: bool = False) -> None:
        c, h, w = image_shape(input_shape)
        hw = conv_out2d((h, w), 3, 1, 1, layer="conv1")
        hw = conv_out2d(hw, 2, 2, 0, layer="pool1")
        hw = conv_out2d(hw, 3, 1, 1, layer="conv2")
        super().__init__(
            OrderedDict(
                conv1=nn.Conv2d(c, 8, 3, padding=1, bias=bias),
                relu1=nn.ReLU(),
                pool1=nn.MaxPool2d(2),
                conv2=nn.Conv2d(8, 16, 3, padding=1, bias=bias),
                relu2=nn.ReLU(),
                flatten=nn.Flatten(start_dim=1),
                fc=nn.Linear(16 * hw[0] * hw[1], n_classes, bias=bias),
            )
        )


def build_cnn_pfa(input_shape: tuple[int, ...], n_classes: int) -> CNNPFA:
    return CNNPFA(input_shape, n_classes)


def build_cnn_rhdp(input_shape: tuple[int, ...], n_classes: int) -> CNNRHDP:
    return CNNRHDP(input_shape, n_classes)


def build_cnn_mnist_splitting(
    input_shape: tuple[int, ...], n_classes: int, *, dropout: float = 0.5
) -> CNNMnistSplitting:
    return CNNMnistSplitting(input_shape, n_classes, dropout=dropout_rate(dropout))


def build_cnn_digits(input_shape: tuple[int, ...], n_classes: int) -> CNNDigits:
    return CNNDigits(input_shape, n_classes)


def build_cnn_digits_nobias(
    input_shape: tuple[int, ...], n_classes: int, *, bias: bool = False
) -> CNNDigitsNoBias:
    return CNNDigitsNoBias(input_shape, n_classes, bias=flag(bias, "bias"))

"""LeNet-style networks: `lenet5` (FedCEO, fedceo.md §5) and `dlg_lenet` (fedceo.md §8, the DLG attack's
sigmoid LeNet)."""

from __future__ import annotations

from collections import OrderedDict
from typing import ClassVar

from torch import nn

from dpfl.models._geometry import conv_out2d, image_shape


class LeNet5(nn.Sequential):
    """FedCEO's LeNet-5 for 3x32x32 inputs, all layers with biases:

        conv1 Conv2d(C, 32, 5) -> ReLU -> MaxPool2d(2, 2)       # 32 -> 28 -> 14
        conv2 Conv2d(32, 64, 5) -> ReLU -> MaxPool2d(2, 2)      # 14 -> 10 -> 5
        flatten (64*5*5 = 1600, channel-major)
        fc1 Linear(1600, 512) -> ReLU -> fc2 Linear(512, 512) -> ReLU -> fc3 Linear(512, n_classes)

    ReLU after each conv (the spec's decision, from the authors' code). 1,141,194 parameters for
    3x32x32 / 10 classes. CENTAUR's split: representation = conv1, conv2, fc1, fc2; head = `fc3`.
    """

    loss_kind: ClassVar[str] = "cross_entropy"
    head_name: ClassVar[str] = "fc3"

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        c, h, w = image_shape(input_shape)
        hw = conv_out2d((h, w), 5, 1, 0, layer="conv1")
        hw = conv_out2d(hw, 2, 2, 0, layer="pool1")
        hw = conv_out2d(hw, 5, 1, 0, layer="conv2")
        hw = conv_out2d(hw, 2, 2, 0, layer="pool2")
        super().__init__(
            OrderedDict(
                conv1=nn.Conv2d(c, 32, 5),
                relu1=nn.ReLU(),
                pool1=nn.MaxPool2d(2, 2),
                conv2=nn.Conv2d(32, 64, 5),
                relu2=nn.ReLU(),
                pool2=nn.MaxPool2d(2, 2),
                flatten=nn.Flatten(start_dim=1),
                fc1=nn.Linear(64 * hw[0] * hw[1], 512),
                relu3=nn.ReLU(),
                fc2=nn.Linear(512, 512),
                relu4=nn.ReLU(),
                fc3=nn.Linear(512, n_classes),
            )
        )


class DLGLeNet(nn.Sequential):
    """The sigmoid LeNet of the DLG paper (Zhu et al., 2019) used by FedCEO's attack script:

        conv1 Conv2d(C, 12, 5, stride 2, pad 2) -> Sigmoid -> conv2 Conv2d(12, 12, 5, stride 2, pad 2) ->
        Sigmoid -> conv3 Conv2d(12, 12, 5, stride 1, pad 2) -> Sigmoid -> Flatten -> fc Linear(768, n)

    768 = 12*8*8 on 32x32 inputs; 15,826 parameters for 3x32x32 / 10 classes. Registry default init
    is DLG's ``weights_init`` (every weight and bias U(-0.5, 0.5)); a model for attack experiments.
    """

    loss_kind: ClassVar[str] = "cross_entropy"
    head_name: ClassVar[str] = "fc"

    def __init__(self, input_shape: tuple[int, ...], n_classes: int) -> None:
        c, h, w = image_shape(input_shape)
        hw = conv_out2d((h, w), 5, 2, 2, layer="conv1")
        hw = conv_out2d(hw, 5, 2, 2, layer="conv2")
        hw = conv_out2d(hw, 5, 1, 2, layer="conv3")
        super().__init__(
            OrderedDict(
                conv1=nn.Conv2d(c, 12, 5, stride=2, padding=2),
                act1=nn.Sigmoid(),
                conv2=nn.Conv2d(12, 12, 5, stride=2, padding=2),
                act2=nn.Sigmoid(),
                conv3=nn.Conv2d(12, 12, 5, stride=1, padding=2),
                act3=nn.Sigmoid(),
                flatten=nn.Flatten(start_dim=1),
                fc=nn.Linear(12 * hw[0] * hw[1], n_classes),
            )
        )


def build_lenet5(input_shape: tuple[int, ...], n_classes: int) -> LeNet5:
    return LeNet5(input_shape, n_classes)


def build_dlg_lenet(input_shape: tuple[int, ...], n_classes: int) -> DLGLeNet:
    return DLGLeNet(input_shape, n_classes)

"""Residual networks with GroupNorm instead of BatchNorm (per-sample gradients need no batch statistics).

* `resnet18_gn` — torchvision's ResNet-18 layout (ImageNet stem: 7x7/2 conv + 3x3/2 max-pool) with every
  BatchNorm2d replaced by GroupNorm(2, C) (clustered_dpfl.md §8). 11,181,642 parameters for 10 classes.
  Module and parameter names follow torchvision (``conv1``, ``bn1``, ``layer1.0.conv1``, ``downsample.0``,
  ``fc``...), so the GroupNorm affine parameters sit where torchvision's BatchNorm ones do.
* `resnet_small_gn` — the CIFAR ResNet of He et al. (2016, §4.2): 3x3 stem with 16 channels and no
  max-pool, three stages of n basic blocks with 16/32/64 channels, depth = 6n + 2 (default 20),
  global average pool, linear head; GroupNorm(2, C) in place of BatchNorm. Shortcut ``"pad"``
  (default, He et al.'s option A: stride-2 subsampling plus zero channels, no parameters) or
  ``"projection"`` (1x1 conv + GroupNorm, option B). ResNet-20 with ``"pad"``: 269,722 parameters for
  10 classes (272,474 with ``"projection"``).

Both are written out here (there is no torchvision dependency); the forward passes use no in-place
operations, and the registry initialises them like torchvision (``init="torchvision"``: Kaiming-normal
fan-out convs, GroupNorm 1/0, default Linear).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dpfl.models._geometry import image_shape
from dpfl.models._options import positive_int


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, channels)


class BasicBlock(nn.Module):
    """conv3x3 -> GN -> ReLU -> conv3x3 -> GN, plus the shortcut, then ReLU (torchvision's BasicBlock)."""

    def __init__(
        self, in_planes: int, planes: int, stride: int, groups: int, shortcut: str = "projection"
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = _norm(planes, groups)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = _norm(planes, groups)
        self.stride = stride
        self.pad_channels = 0
        self.downsample: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            if shortcut == "projection":
                self.downsample = nn.Sequential(
                    nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), _norm(planes, groups)
                )
            else:  # "pad": option A, parameter-free
                self.pad_channels = planes - in_planes

    def _shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if self.downsample is not None:
            return self.downsample(x)
        if self.stride != 1:
            x = x[..., :: self.stride, :: self.stride]
        if self.pad_channels:
            lo = self.pad_channels // 2
            # Zero channels on both sides of the channel axis (dim -3).
            x = F.pad(x, (0, 0, 0, 0, lo, self.pad_channels - lo))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self._shortcut(x))


class ResNet18GN(nn.Module):
    """torchvision ResNet-18 (BasicBlock, [2, 2, 2, 2], ImageNet stem) with GroupNorm(groups, C)."""

    loss_kind: ClassVar[str] = "cross_entropy"
    head_name: ClassVar[str] = "fc"

    def __init__(self, in_channels: int, n_classes: int, norm_groups: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = _norm(64, norm_groups)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_planes = 64
        for i, planes in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            blocks = nn.Sequential(
                BasicBlock(in_planes, planes, stride, norm_groups),
                BasicBlock(planes, planes, 1, norm_groups),
            )
            self.add_module(f"layer{i + 1}", blocks)
            in_planes = planes
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class ResNetSmallGN(nn.Module):
    """CIFAR ResNet-(6n+2) with GroupNorm: stem conv3x3(16), stages of n blocks at 16/32/64 channels."""

    loss_kind: ClassVar[str] = "cross_entropy"
    head_name: ClassVar[str] = "fc"

    def __init__(
        self,
        in_channels: int,
        n_classes: int,
        depth: int = 20,
        norm_groups: int = 2,
        shortcut: str = "pad",
    ) -> None:
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = _norm(16, norm_groups)
        self.relu = nn.ReLU()
        in_planes = 16
        for i, planes in enumerate((16, 32, 64)):
            stride = 1 if i == 0 else 2
            blocks = []
            for j in range(n):
                blocks.append(BasicBlock(in_planes, planes, stride if j == 0 else 1, norm_groups, shortcut))
                in_planes = planes
            self.add_module(f"layer{i + 1}", nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _groups(norm_groups: object, channels: tuple[int, ...]) -> int:
    g = positive_int(norm_groups, "norm_groups")
    bad = [c for c in channels if c % g]
    if bad:
        raise ValueError(f"norm_groups={g} must divide every channel count {channels}")
    return g


def build_resnet18_gn(input_shape: tuple[int, ...], n_classes: int, *, norm_groups: int = 2) -> ResNet18GN:
    c, _, _ = image_shape(input_shape)
    return ResNet18GN(c, n_classes, norm_groups=_groups(norm_groups, (64, 128, 256, 512)))


def build_resnet_small_gn(
    input_shape: tuple[int, ...],
    n_classes: int,
    *,
    depth: int = 20,
    norm_groups: int = 2,
    shortcut: str = "pad",
) -> ResNetSmallGN:
    c, _, _ = image_shape(input_shape)
    depth = positive_int(depth, "depth")
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, 44, 56, 110...), got {depth}")
    if shortcut not in ("pad", "projection"):
        raise ValueError(f"shortcut must be 'pad' or 'projection', got {shortcut!r}")
    return ResNetSmallGN(
        c, n_classes, depth=depth, norm_groups=_groups(norm_groups, (16, 32, 64)), shortcut=shortcut
    )

"""Tied residual blocks (spec bidirectional.md §7.4, experimental): identity-shortcut blocks MP-DP can perturb.

They live with the models (algorithms may import models, not the other way): a network built of them can be a
registered model.

A block computes ReLU(body(x) + x). Both summands must carry the same per-channel scale in the perturbed network,
so the server puts a non-trainable diagonal r_out∘s_in on the shortcut: r_out is the free factor of the body's last
layer, s_in the input factor of the layer feeding the block (whose transitional layer leaves x/s_in). The shortcut's
diagonal reveals r_out∘s_in to the clients, as transitional layers reveal 1/(s r) (W3). Only identity shortcuts: a
projection shortcut would be a trainable layer outside the chain of factors.

`norm_free_resnet` builds the networks of the full configs (§11): no normalisation (it would cancel the factors),
stages of tied blocks joined by strided convolutions, global average pooling, a linear head. These are dpfl's
networks, not the paper's undocumented ResNets, so results are not directly comparable.
"""

from __future__ import annotations

import torch
from torch import nn


class TiedResidual(nn.Module):
    """ReLU(body(x) + x); `body` must start with a trainable layer, end with one (no ReLU), and keep the shape."""

    def __init__(self, *body: nn.Module) -> None:
        super().__init__()
        self.body = nn.Sequential(*body)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + x)


def norm_free_resnet(in_channels: int, image: int, n_classes: int, widths: tuple[int, ...] = (16, 32, 64),
                     blocks: int = 3, bias: bool = False) -> nn.Sequential:
    """A CIFAR-style ResNet-(6·blocks+2) without normalisation: conv stem, `len(widths)` stages of `blocks` tied
    blocks (two 3x3 convs each), a stride-2 3x3 conv + ReLU between stages (identity shortcuts only), global average
    pooling, linear head. blocks = 3 and widths (16, 32, 64) is ResNet20's shape; blocks = 9 ResNet56's."""
    if not widths or blocks < 1:
        raise ValueError(f"norm_free_resnet needs at least one stage and one block, got {widths}, {blocks}")
    mods: list[nn.Module] = [nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=bias), nn.ReLU()]
    size = image
    for stage, width in enumerate(widths):
        if stage:
            mods += [nn.Conv2d(widths[stage - 1], width, 3, stride=2, padding=1, bias=bias), nn.ReLU()]
            size = (size + 1) // 2
        for _ in range(blocks):
            mods.append(TiedResidual(nn.Conv2d(width, width, 3, padding=1, bias=bias), nn.ReLU(),
                                     nn.Conv2d(width, width, 3, padding=1, bias=bias)))
    mods += [nn.AvgPool2d(size), nn.Flatten(), nn.Linear(widths[-1], n_classes, bias=bias)]
    return nn.Sequential(*mods)

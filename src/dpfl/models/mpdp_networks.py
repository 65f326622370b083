"""The networks MP-DP can perturb (spec bidirectional.md §7, §11) and the initialisation its runs start from.

`mpdp_mlp` (a ReLU MLP, `ReluMLP`), `mpdp_cnn` (§11's ci_digits_cnn, `CNNDigitsNoBias`) and `mpdp_resnet` (a
norm-free ResNet of tied residual blocks, §7.4, experimental) are `nn.Sequential`s of the modules MP-DP's factor plan
accepts. The registry builds them in float64 (MP-DP's recovery is checked to 1e-10), trained with the MSE on one-hot
targets (the loss that recovery is exact for), and initialised by `init_mpdp` (scheme ``mpdp``), the one
initialisation every MP-DP run and its baselines start from.

Tied residual blocks: a block computes ReLU(body(x) + x). Both summands must carry the same per-channel scale in the
perturbed network, so the server puts a non-trainable diagonal r_out∘s_in on the shortcut: r_out is the free factor of
the body's last layer, s_in the input factor of the layer feeding the block (whose transitional layer leaves x/s_in).
The shortcut's diagonal reveals r_out∘s_in to the clients, as transitional layers reveal 1/(s r) (W3). Only identity
shortcuts: a projection shortcut would be a trainable layer outside the chain of factors.

`norm_free_resnet` builds the networks of the full configs (§11): no normalisation (it would cancel the factors),
stages of tied blocks joined by strided convolutions, global average pooling, a linear head. These are dpfl's
networks, not the paper's undocumented ResNets, so results are not directly comparable.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from dpfl.models._geometry import ShapeError, flat_size, image_shape
from dpfl.models._options import flag, positive_int, positive_ints
from dpfl.models.cnn import CNNDigitsNoBias
from dpfl.models.mlp import ReluMLP

LAST_LAYER_SCALE = 0.1  # outputs start near 0 under MSE: FedSGD on digits reaches 0.76 in 30 rounds, not 0.38


class TiedResidual(nn.Module):
    """ReLU(body(x) + x); `body` must start with a trainable layer, end with one (no ReLU), and keep the shape."""

    def __init__(self, *body: nn.Module) -> None:
        super().__init__()
        self.body = nn.Sequential(*body)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + x)


class NormFreeResNet(nn.Sequential):
    """`norm_free_resnet`'s network: conv, relu, stage s's down{s} + relu{s} (s > 1) and block{s}_{b}, pool, flatten,
    fc (the head)."""

    loss_kind: ClassVar[str] = "mse_onehot"
    head_name: ClassVar[str] = "fc"


def norm_free_resnet(in_channels: int, image: int, n_classes: int, widths: tuple[int, ...] = (16, 32, 64),
                     blocks: int = 3, bias: bool = False) -> NormFreeResNet:
    """A CIFAR-style ResNet-(6·blocks+2) without normalisation for square images of side `image`: conv stem,
    `len(widths)` stages of `blocks` tied blocks (two 3x3 convs each), a stride-2 3x3 conv + ReLU between stages
    (identity shortcuts only), global average pooling, linear head. blocks = 3 and widths (16, 32, 64) is ResNet20's
    shape; blocks = 9 ResNet56's."""
    if not widths or blocks < 1:
        raise ValueError(f"norm_free_resnet needs at least one stage and one block, got {widths}, {blocks}")
    mods: OrderedDict[str, nn.Module] = OrderedDict(conv=nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=bias),
                                                    relu=nn.ReLU())
    size = image
    for stage, width in enumerate(widths, start=1):
        if stage > 1:
            mods[f"down{stage}"] = nn.Conv2d(widths[stage - 2], width, 3, stride=2, padding=1, bias=bias)
            mods[f"relu{stage}"] = nn.ReLU()
            size = (size + 1) // 2
        for block in range(1, blocks + 1):
            mods[f"block{stage}_{block}"] = TiedResidual(nn.Conv2d(width, width, 3, padding=1, bias=bias), nn.ReLU(),
                                                         nn.Conv2d(width, width, 3, padding=1, bias=bias))
    mods.update(pool=nn.AvgPool2d(size), flatten=nn.Flatten(), fc=nn.Linear(widths[-1], n_classes, bias=bias))
    return NormFreeResNet(mods)


def build_mpdp_mlp(input_shape: tuple[int, ...], n_classes: int, *, hidden: Sequence[int] = (64, 32),
                   bias: bool = False) -> ReluMLP:
    # At least one hidden layer: MP-DP perturbs networks of two trainable layers or more.
    widths = positive_ints(hidden, "hidden")
    return ReluMLP(flat_size(input_shape), n_classes, hidden=widths, bias=flag(bias, "bias"))


def build_mpdp_cnn(input_shape: tuple[int, ...], n_classes: int, *, bias: bool = False) -> CNNDigitsNoBias:
    return CNNDigitsNoBias(input_shape, n_classes, bias=flag(bias, "bias"))


def build_mpdp_resnet(input_shape: tuple[int, ...], n_classes: int, *, widths: Sequence[int] = (16, 32, 64),
                      blocks: int = 3, bias: bool = False) -> NormFreeResNet:
    c, h, w = image_shape(input_shape)
    if h != w:  # the global average pooling's window is the last stage's side
        raise ShapeError(f"needs square images, got {h}x{w}")
    return norm_free_resnet(c, h, n_classes, positive_ints(widths, "widths"), positive_int(blocks, "blocks"),
                            flag(bias, "bias"))


@torch.no_grad()
def init_mpdp(model: nn.Module, generator: torch.Generator | None = None) -> nn.Module:
    """MP-DP's initial weights, drawn from `generator` (None: the global torch RNG); returns `model`.

    He-normal weights drawn in float64, one draw per weight tensor in parameter order, and zero biases (no draw); the
    last layer's weight times LAST_LAYER_SCALE. Without normalisation a residual network needs Fixup's initialisation
    (Zhang et al., arXiv 1901.09321, two layers per branch): each `TiedResidual` body's last layer starts at zero
    (after its draw, which keeps the stream aligned) and its other layers are divided by sqrt(number of blocks), so
    the network starts as its chain of shortcuts.
    """
    layers = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    for m in layers:
        if not isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            raise TypeError(f"no 'mpdp' initialisation for module type {type(m).__name__}; known: Linear, "
                            "Conv1d/2d/3d")
    blocks = [m for m in model.modules() if isinstance(m, TiedResidual)]
    ends: set[int] = set()
    inside: set[int] = set()
    for block in blocks:
        body = [id(m) for m in block.body.modules() if any(True for _ in m.parameters(recurse=False))]
        if body:
            ends.add(body[-1])
            inside.update(body[:-1])
    for i, m in enumerate(layers):
        shape = tuple(m.weight.shape)
        w = torch.randn(shape, generator=generator, dtype=torch.float64) * math.sqrt(2.0 / math.prod(shape[1:]))
        if i == len(layers) - 1:
            w = w * LAST_LAYER_SCALE
        elif id(m) in ends:
            w = torch.zeros_like(w)
        elif id(m) in inside:
            w = w / math.sqrt(len(blocks))
        m.weight.copy_(w)
        if m.bias is not None:
            m.bias.zero_()
    return model

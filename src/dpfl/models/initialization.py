"""Parameter initialisation schemes, drawn from an explicit `torch.Generator`.

Every builder in the registry constructs its module on the ``meta`` device (no values, no random
draws) and then calls `init_parameters`, which gives every parameter its value by walking
`model.named_modules()` in order and, inside a module, the weight before the bias. Hence:

* ``build_model(..., seed=s)`` draws only from ``dpfl.seeding.torch_generator(s, Purpose.INIT)``:
  the same seed gives the same weights and the global torch RNG is never read or advanced;
* ``seed=None`` draws from the global torch RNG (so ``torch.manual_seed`` governs it), exactly once.

Schemes (``init=`` option of `build_model`):

``torch``
    PyTorch's own defaults, reproduced with the same `torch.nn.init` calls in the same order as
    ``reset_parameters``: Linear/Conv weights ``kaiming_uniform_(a=sqrt(5))`` (U(+-1/sqrt(fan_in))),
    biases U(+-1/sqrt(fan_in)); GroupNorm weight 1, bias 0.
``keras``
    Keras' ``Dense``/``Conv2D`` defaults used by the PFA code: Glorot-uniform weights
    U(+-sqrt(6 / (fan_in + fan_out))) with fan = channels x kernel area (the same fans Keras uses),
    zero biases; GroupNorm weight 1, bias 0.
``torchvision``
    torchvision's ResNet init: Conv weights ``kaiming_normal_(mode="fan_out", nonlinearity="relu")``,
    GroupNorm weight 1, bias 0, Linear as ``torch``.
``zeros``
    Every parameter 0 (the PFA logistic regression, `logr`).
``dlg``
    Every weight and bias U(-0.5, 0.5), the ``weights_init`` of the DLG attack code (`dlg_lenet`).
``mpdp``
    MP-DP's networks (`dpfl.models.mpdp_networks.init_mpdp`): He-normal weights drawn in float64, zero biases, the
    last layer scaled down, Fixup in tied residual blocks. It scales layers by their place in the network, so it
    is applied to the whole model rather than module by module.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dpfl.models.mpdp_networks import init_mpdp

INIT_SCHEMES: tuple[str, ...] = ("torch", "keras", "torchvision", "zeros", "dlg", "mpdp")

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORM = (nn.GroupNorm, nn.LayerNorm)


def _fan_in(weight: torch.Tensor) -> int:
    fan_in, _ = nn.init._calculate_fan_in_and_fan_out(weight)
    return fan_in


def _torch_default(module: nn.Module, g: torch.Generator | None) -> None:
    # Same calls, same order as nn.Linear / nn.Conv2d .reset_parameters.
    nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=g)
    if module.bias is not None:
        fan_in = _fan_in(module.weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(module.bias, -bound, bound, generator=g)


def _init_module(module: nn.Module, scheme: str, g: torch.Generator | None) -> None:
    if scheme == "zeros":
        for p in module.parameters(recurse=False):
            nn.init.zeros_(p)
        return
    if scheme == "dlg":
        for p in module.parameters(recurse=False):
            nn.init.uniform_(p, -0.5, 0.5, generator=g)
        return
    if isinstance(module, _NORM):
        if module.weight is not None:
            nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
        return
    if isinstance(module, (nn.Linear, *_CONV)):
        if scheme == "torch" or (scheme == "torchvision" and isinstance(module, nn.Linear)):
            _torch_default(module, g)
        elif scheme == "torchvision":
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu", generator=g)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif scheme == "keras":
            nn.init.xavier_uniform_(module.weight, generator=g)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        return
    raise TypeError(
        f"no {scheme!r} initialisation for module type {type(module).__name__}; "
        f"known: Linear, Conv1d/2d/3d, GroupNorm, LayerNorm"
    )


@torch.no_grad()
def init_parameters(model: nn.Module, scheme: str, generator: torch.Generator | None = None) -> nn.Module:
    """Give every parameter of `model` a value under `scheme`, drawing from `generator`.

    `generator=None` uses the global torch RNG. Works on freshly materialised (``to_empty``) modules:
    every parameter is written, and a module type the scheme does not know raises `TypeError` rather
    than being left uninitialised. Returns `model`.
    """
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"unknown init scheme {scheme!r}; allowed: {list(INIT_SCHEMES)}")
    if scheme == "mpdp":
        return init_mpdp(model, generator)
    for _, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            _init_module(module, scheme, generator)
    return model

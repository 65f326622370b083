"""MP_Server (MP-DP Algorithm 1, spec bidirectional.md §3, §7): expand the model with transitional layers, perturb it
with one-time positive factors and an additive mask, keep the factors as the server's secret.

Scope: sequential ReLU networks of fully connected and 2-d convolution layers, with or without biases, with max or
average pooling and one flatten of feature maps (a flatten of the input may precede the first layer: images into an
MLP), and a linear last layer (§7.1-§7.3), and, when allowed, tied residual blocks with identity shortcuts (§7.4,
dpfl.models.mpdp_networks); anything else is refused by name (§7.5).
Trainable layer l = 1..L has output factor r^(l) (l < L) and input factor s^(l-1) (l > 1): a weight entry gets
r_out s_in (a conv weight r_c s_c' over its kernel; a linear layer after flatten gives feature j the s of its
channel), a hidden bias r^(l). After the ReLU of each hidden layer a transitional diagonal 1/(s^(l) r^(l)) per
channel and another ReLU are inserted; a residual block's shortcut gets the diagonal r_out∘s_in. The last layer
gets the additive mask r = γ∘r^(a): its output is y + α(x) r with α the sum of the perturbed penultimate features
(+1 when the last layer has a bias).
"""

from __future__ import annotations

import math
import secrets as _secrets
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpfl.algorithms.secure.mpdp.dn import dn_star_abs
from dpfl.models.mpdp_networks import TiedResidual


class UnsupportedModelError(ValueError):
    """A module MP-DP's perturbation cannot carry (the message names it)."""


@dataclass(frozen=True)
class Layer:
    kind: str  # "linear" | "conv"
    out: int
    inp: int
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    bias: bool = False
    in_repeat: int = 1  # a linear layer after flatten: the spatial positions of each input channel

    @property
    def weight_shape(self) -> tuple[int, ...]:
        return (self.out, self.inp) if self.kind == "linear" else (self.out, self.inp, *self.kernel)


@dataclass(frozen=True)
class Op:
    kind: str  # "layer" | "relu" | "maxpool" | "avgpool" | "flatten" | "skip_start" | "skip_end"
    index: int = -1  # the layer (0-based) of a "layer" op, the block of a "skip_*" op
    kernel: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)


@dataclass(frozen=True)
class Skip:
    """A tied residual block: its input leaves layer `source` (after that layer's ReLU and transitional layer), its
    shortcut joins the output of layer `target` (the body's last layer) before the block's ReLU."""

    source: int
    target: int


def _children(module: nn.Sequential, prefix: str = ""):  # type: ignore[no-untyped-def]
    """(name, module, marker) in execution order; a TiedResidual is opened ("start") and closed ("end") around its
    body's children."""
    for name, m in module.named_children():
        if isinstance(m, TiedResidual):
            yield prefix + name, m, "start"
            yield from _children(m.body, f"{prefix}{name}.body.")
            yield prefix + name, m, "end"
        else:
            yield prefix + name, m, None


def _mlp(sizes: tuple[int, ...], bias: bool) -> tuple[tuple[Layer, ...], tuple[Op, ...]]:
    layers = tuple(Layer("linear", sizes[l], sizes[l - 1], bias=bias) for l in range(1, len(sizes)))
    ops: list[Op] = []
    for i in range(len(layers)):
        ops.append(Op("layer", i))
        if i < len(layers) - 1:
            ops.append(Op("relu"))
    return layers, tuple(ops)


@dataclass(frozen=True)
class FactorPlan:
    """The network's layers and operations, and which factor scales which axis of each trainable tensor.

    FactorPlan(sizes) is a bias-free MLP n_0-...-n_L; `FactorPlan.from_module(nn.Sequential(...))` any supported net.
    It holds no factor: it is sent to the clients with the perturbed model."""

    sizes: tuple[int, ...] = ()
    bias: bool = False
    layer_specs: tuple[Layer, ...] = ()
    ops: tuple[Op, ...] = ()
    skips: tuple[Skip, ...] = ()

    def __post_init__(self) -> None:
        if not self.layer_specs:
            if len(self.sizes) < 3 or min(self.sizes) < 1:
                raise ValueError(f"MP-DP needs at least two layers (L >= 2) of positive width, got sizes {self.sizes}")
            layers, ops = _mlp(tuple(self.sizes), self.bias)
            object.__setattr__(self, "layer_specs", layers)
            object.__setattr__(self, "ops", ops)
        if len(self.layer_specs) < 2 or self.layer_specs[-1].kind != "linear":
            raise UnsupportedModelError("MP-DP needs at least two trainable layers and a linear last layer")

    @classmethod
    def from_module(cls, module: nn.Module, input_shape: tuple[int, ...], allow_residual: bool = False) -> FactorPlan:
        """The plan of an nn.Sequential of Linear / Conv2d / ReLU / MaxPool2d / AvgPool2d / Flatten (input_shape without
        the batch axis), and of TiedResidual blocks if `allow_residual` (experimental, spec §7.4); every other module
        is refused by name."""
        if not isinstance(module, nn.Sequential):
            raise UnsupportedModelError(f"MP-DP takes an nn.Sequential, got {type(module).__name__}")
        layers: list[Layer] = []
        ops: list[Op] = []
        shape = tuple(input_shape)
        relu_after = True
        flat_repeat = 1  # spatial positions per channel at the flatten
        skips: list[Skip] = []
        block: tuple[int, tuple[int, ...]] | None = None  # the open block's source layer and input shape
        for name, m, marker in _children(module):
            where = f"module {name!r} ({type(m).__name__})"
            if marker == "start":
                if not allow_residual:
                    raise UnsupportedModelError(f"{where}: residual blocks are experimental in MP-DP (spec §7.4); "
                                                "pass allow_residual=True to use tied factors")
                if block is not None:
                    raise UnsupportedModelError(f"{where}: residual blocks cannot be nested")
                if not layers or not relu_after:
                    raise UnsupportedModelError(f"{where}: a residual block must follow a hidden layer's ReLU")
                block = (len(layers) - 1, shape)
                ops.append(Op("skip_start", len(skips)))
                continue
            if marker == "end":
                assert block is not None
                if ops[-1].kind != "layer":
                    raise UnsupportedModelError(f"{where}: the block's body must end with a trainable layer (the "
                                                "block applies the ReLU after the sum)")
                if shape != block[1]:
                    raise UnsupportedModelError(f"{where}: the body maps shape {block[1]} to {shape}; only identity "
                                                "shortcuts are supported")
                skips.append(Skip(block[0], len(layers) - 1))
                ops += [Op("skip_end", len(skips) - 1), Op("relu")]
                relu_after, block = True, None
                continue
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                if layers and not relu_after:
                    raise UnsupportedModelError(f"{where}: every hidden layer must be followed by a ReLU")
                if isinstance(m, nn.Linear):
                    if len(shape) != 1 or shape[0] != m.in_features:
                        raise UnsupportedModelError(f"{where}: expects {m.in_features} features, gets shape {shape}")
                    repeat = flat_repeat if ops and ops[-1].kind == "flatten" else 1
                    channels = m.in_features // repeat
                    layers.append(Layer("linear", m.out_features, m.in_features, bias=m.bias is not None,
                                        in_repeat=repeat if layers else 1))
                    if layers[:-1] and layers[-2].out != channels:
                        raise UnsupportedModelError(f"{where}: its input features do not map onto the previous "
                                                    "layer's channels")
                    shape = (m.out_features,)
                else:
                    if m.groups != 1 or m.dilation != (1, 1) or m.padding_mode != "zeros" or isinstance(m.padding, str):
                        raise UnsupportedModelError(f"{where}: only plain convolutions (groups 1, no dilation, "
                                                    "numeric zero padding)")
                    if len(shape) != 3 or shape[0] != m.in_channels:
                        raise UnsupportedModelError(f"{where}: expects {m.in_channels} channels, gets shape {shape}")
                    layers.append(Layer("conv", m.out_channels, m.in_channels, tuple(m.kernel_size), tuple(m.stride),
                                        tuple(m.padding), bias=m.bias is not None))
                    h = (shape[1] + 2 * m.padding[0] - m.kernel_size[0]) // m.stride[0] + 1
                    w = (shape[2] + 2 * m.padding[1] - m.kernel_size[1]) // m.stride[1] + 1
                    shape = (m.out_channels, h, w)
                ops.append(Op("layer", len(layers) - 1))
                relu_after = False
            elif type(m) is nn.ReLU:
                if not layers or relu_after:
                    raise UnsupportedModelError(f"{where}: a ReLU must follow a trainable layer, once")
                ops.append(Op("relu"))
                relu_after = True
            elif isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
                k = m.kernel_size if isinstance(m.kernel_size, tuple) else (m.kernel_size, m.kernel_size)
                st = m.stride if isinstance(m.stride, tuple) else (m.stride, m.stride)
                if getattr(m, "padding", 0) not in (0, (0, 0)) or len(shape) != 3:
                    raise UnsupportedModelError(f"{where}: pooling without padding, on feature maps only")
                ops.append(Op("maxpool" if isinstance(m, nn.MaxPool2d) else "avgpool", kernel=k, stride=st))
                shape = (shape[0], (shape[1] - k[0]) // st[0] + 1, (shape[2] - k[1]) // st[1] + 1)
            elif isinstance(m, nn.Flatten):
                if len(shape) != 3 and layers:  # before the first layer it only reshapes the input, of any rank
                    raise UnsupportedModelError(f"{where}: flatten only feature maps (or the input)")
                flat_repeat = shape[1] * shape[2] if len(shape) == 3 else 1
                ops.append(Op("flatten"))
                shape = (math.prod(shape),)
            else:
                why = {nn.BatchNorm1d: "normalisation cancels the factors", nn.BatchNorm2d: "normalisation cancels "
                       "the factors", nn.GroupNorm: "normalisation cancels the factors", nn.LayerNorm: "normalisation "
                       "cancels the factors", nn.Tanh: "not positively homogeneous", nn.Sigmoid: "not positively "
                       "homogeneous", nn.GELU: "not positively homogeneous", nn.SiLU: "not positively homogeneous"}
                raise UnsupportedModelError(f"{where}: not supported by MP-DP's perturbation "
                                            f"({why.get(type(m), 'unknown module, refused rather than ignored')})")
        if not layers or layers[-1].kind != "linear" or ops[-1].kind != "layer":
            raise UnsupportedModelError("the last module must be a linear layer (it carries the additive mask)")
        return cls(layer_specs=tuple(layers), ops=tuple(ops), skips=tuple(skips))

    @property
    def layers(self) -> int:
        return len(self.layer_specs)

    @property
    def out_dim(self) -> int:
        return self.layer_specs[-1].out

    def params(self) -> list[tuple[int, str]]:
        """(layer, 'weight' | 'bias') of each trainable tensor, in upload order."""
        return [(i, kind) for i, spec in enumerate(self.layer_specs) for kind in (("weight", "bias") if spec.bias
                                                                                 else ("weight",))]

    def shapes(self) -> list[tuple[int, ...]]:
        return [self.layer_specs[i].weight_shape if kind == "weight" else (self.layer_specs[i].out,)
                for i, kind in self.params()]

    def dim(self) -> int:
        return sum(int(np.prod(s)) for s in self.shapes())

    def noise_kinds(self) -> list[str]:
        """Per trainable tensor, the law of DDP noise whose product with its factor is Gaussian (spec §7.3):
        'dn' (a factor |DN*(1)| or |DN*(2)|^2), 'dn_x2' (a single |DN*(2)|: the client adds an X ~ |DN*(2)|) or
        'gaussian' (factor 1: the last bias)."""
        L = self.layers
        return ["dn" if kind == "weight" or i == 0 else ("gaussian" if i == L - 1 else "dn_x2")
                for i, kind in self.params()]


@dataclass(frozen=True)
class ServerSecrets:
    """One round's factors: r^(l), s^(l) for l = 1..L-1, and r = γ∘r^(a). Never logged, sent or checkpointed."""

    r: tuple[torch.Tensor, ...]
    s: tuple[torch.Tensor, ...]
    gamma: torch.Tensor
    r_a: torch.Tensor
    plan: FactorPlan = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def mask(self) -> torch.Tensor:
        """r = γ∘r^(a), the additive mask's per-output scale."""
        return self.gamma * self.r_a

    @property
    def upsilon(self) -> torch.Tensor:
        return self.mask @ self.mask

    def factor(self, p: int) -> torch.Tensor:
        """R of trainable tensor p (broadcastable to its shape)."""
        layer, kind = self.plan.params()[p]
        spec, L = self.plan.layer_specs[layer], self.plan.layers
        rows = self.r[layer] if layer < L - 1 else None
        if kind == "bias":
            return rows if rows is not None else torch.ones(spec.out, dtype=torch.float64)
        cols = self.s[layer - 1].repeat_interleave(spec.in_repeat) if layer > 0 else None
        extra = (1,) * (len(spec.weight_shape) - 2)
        if rows is None:
            return cols.reshape(1, -1, *extra)
        if cols is None:
            return rows.reshape(-1, 1, *extra)
        return (rows.reshape(-1, 1) * cols.reshape(1, -1)).reshape(spec.out, spec.inp, *extra)

    def odd_factor(self, layer: int) -> torch.Tensor:
        """R^(2l-1) of original layer l's weight (1-based)."""
        return self.factor([i for i, (lay, kind) in enumerate(self.plan.params()) if lay == layer - 1][0])

    def transitional(self, layer: int) -> torch.Tensor:
        """The diagonal of the transitional layer after original layer l (1-based): 1/(s^(l) r^(l))."""
        return 1.0 / (self.s[layer - 1] * self.r[layer - 1])

    def shortcut(self, block: int) -> torch.Tensor:
        """The diagonal on residual block b's shortcut: r of the body's last layer times s of the source layer."""
        sk = self.plan.skips[block]
        return self.r[sk.target] * self.s[sk.source]


@dataclass(frozen=True)
class ClientPayload:
    """What a client receives: the perturbed trainable tensors, the transitional diagonals, the plan (no factors),
    the sizes, the round id and the residual blocks' shortcut diagonals."""

    odd: tuple[torch.Tensor, ...]
    transitional: tuple[torch.Tensor, ...]
    sizes: tuple[int, ...]
    round_id: int
    plan: FactorPlan | None = None
    shortcuts: tuple[torch.Tensor, ...] = ()
    attempt: int = 0  # which run of the round (a round the upload protocol discarded is run again)


def draw_secrets(plan: FactorPlan, gen: np.random.Generator, mask_scale: float = 1.0) -> ServerSecrets:
    """Fresh factors with the laws of Eq. 13: |DN*(1)| on the first r and the last s, |DN*(2)| in between
    (for L = 2 both are |DN*(1)|); γ and r^(a) i.i.d. N(0, mask_scale^2) (the paper gives no law: dpfl's choice)."""
    L = plan.layers
    outs = [spec.out for spec in plan.layer_specs]
    r = tuple(dn_star_abs(1 if l == 1 else 2, outs[l - 1], gen) for l in range(1, L))
    s = tuple(dn_star_abs(1 if l == L - 1 else 2, outs[l - 1], gen) for l in range(1, L))
    gamma = torch.from_numpy(gen.normal(0.0, mask_scale, plan.out_dim))
    r_a = torch.from_numpy(gen.normal(0.0, mask_scale, plan.out_dim))
    return ServerSecrets(r, s, gamma, r_a, plan)


def round_generator(seed: int | None = None) -> np.random.Generator:
    """The per-round generator: from `secrets.randbits(63)` (deployment), or a given seed (simulation only)."""
    return np.random.default_rng(_secrets.randbits(63) if seed is None else seed)


def mp_server(weights: list[torch.Tensor] | tuple[torch.Tensor, ...], plan: FactorPlan, gen: np.random.Generator,
              round_id: int = 0, mask_scale: float = 1.0) -> tuple[ClientPayload, ServerSecrets]:
    """Eqs. 12-15: the perturbed expanded model for the clients, and the secrets for the server."""
    if [tuple(w.shape) for w in weights] != plan.shapes():
        raise ValueError(f"tensors of shapes {[tuple(w.shape) for w in weights]} do not match the plan {plan.shapes()}")
    sec = draw_secrets(plan, gen, mask_scale)
    L = plan.layers
    hats = []
    for p, ((layer, kind), w) in enumerate(zip(plan.params(), weights, strict=True)):
        hat = sec.factor(p) * w.to(torch.float64)
        if layer == L - 1:  # the additive mask: R^(a)_ij = γ_i r^(a)_i on the weight, + r on the bias
            hat = hat + (sec.mask.unsqueeze(1) if kind == "weight" else sec.mask)
        hats.append(hat)
    trans = tuple(sec.transitional(l) for l in range(1, L))
    shortcuts = tuple(sec.shortcut(b) for b in range(len(plan.skips)))
    return ClientPayload(tuple(hats), trans, plan.sizes, round_id, plan, shortcuts), sec


def _per_channel(d: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    return d.reshape(1, -1, *([1] * (h.dim() - 2)))


def forward(params: list[torch.Tensor] | tuple[torch.Tensor, ...], transitional: tuple[torch.Tensor, ...] | None,
            x: torch.Tensor, plan: FactorPlan | None = None,
            shortcuts: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [B, n_L], α [B]) of the expanded net, or of the plain net when `transitional` is None (α = 0).
    `plan` None: a bias-free MLP read from the tensors' shapes. `shortcuts`: the residual blocks' diagonals (the
    payload's for the expanded net; None in the plain net means identity shortcuts)."""
    if plan is None:
        plan = FactorPlan((params[0].shape[1], *[p.shape[0] for p in params]))
    if transitional is not None and len(shortcuts or ()) != len(plan.skips):
        raise ValueError(f"the expanded network has {len(plan.skips)} residual blocks and needs their shortcut "
                         f"diagonals, got {len(shortcuts or ())}")
    saved: dict[int, torch.Tensor] = {}
    tensors: dict[int, list[torch.Tensor]] = {}
    for (layer, _), t in zip(plan.params(), params, strict=True):
        tensors.setdefault(layer, []).append(t)
    L = plan.layers
    h, pending, pen = x, None, x
    for op in plan.ops:
        if op.kind == "layer":
            spec, (w, *b) = plan.layer_specs[op.index], tensors[op.index]
            if op.index == L - 1:
                pen = h
            h = F.linear(h, w, b[0] if b else None) if spec.kind == "linear" else \
                F.conv2d(h, w, b[0] if b else None, spec.stride, spec.padding)
            pending = op.index if op.index < L - 1 else None
        elif op.kind == "relu":
            h = torch.relu(h)
            if transitional is not None and pending is not None:
                h = torch.relu(h * _per_channel(transitional[pending], h))
            pending = None
        elif op.kind == "maxpool":
            h = F.max_pool2d(h, op.kernel, op.stride)
        elif op.kind == "avgpool":
            h = F.avg_pool2d(h, op.kernel, op.stride)
        elif op.kind == "flatten":
            h = h.flatten(1)
        elif op.kind == "skip_start":
            saved[op.index] = h
        elif op.kind == "skip_end":
            skip = saved.pop(op.index)
            h = h + (skip if shortcuts is None else skip * _per_channel(shortcuts[op.index], skip))
    if transitional is None:
        return h, torch.zeros(h.shape[0], dtype=h.dtype)
    return h, pen.flatten(1).sum(1) + (1.0 if plan.layer_specs[-1].bias else 0.0)


def recover(perturbed_grads: list[torch.Tensor], psi: list[torch.Tensor], phi: list[torch.Tensor],
            sec: ServerSecrets) -> list[torch.Tensor]:
    """Theorem 4: ∇F(W) = R∘(∇F̂ - rᵀΨ + υΦ) for every trainable tensor (also for sums and means)."""
    r, ups = sec.mask, sec.upsilon
    return [sec.factor(p) * (g - torch.tensordot(r, ps, dims=([0], [0])) + ups * f)
            for p, (g, ps, f) in enumerate(zip(perturbed_grads, psi, phi, strict=True))]

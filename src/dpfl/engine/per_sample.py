"""Exact per-sample clipping without per-sample parameter copies, for sequential models of Linear / Conv2d layers.

DP-SGD needs, for every record s drawn at a step, its gradient g_s at its own client's parameters, clipped to
one global L2 norm C, then summed per client: sum_s min(1, C / ||g_s||) g_s. The generic path
(`local_training._per_sample_grad_fn`) materialises every g_s with `vmap(grad(...))`, each sample carrying a
copy of its client's parameters. For a model that is a chain of layers this module computes the same sums
from the layers' inputs and output gradients instead (the "ghost clipping" / book-keeping idea):

1. **forward** of the packed records (all clients' batches back to back, `owner[s]` = the sample's client)
   with each client's own weights: every Linear / Conv2d is a *segmented* matrix product (rows of client k
   times W_k), done either as one GEMM per client or as one batched GEMM over clients padded to the widest
   batch, whichever the cost model below prefers; convolutions go through an im2col matrix U (rows =
   output positions, columns = (kh, kw, C_in), or (C_in, kh, kw) for <= 4 input channels), gathered with one
   cached index per input size (`_Conv2d.grid`); col2im is one index_add with the same index.
2. **one backward** (torch.autograd through the parameter-free layers; custom functions for Linear / Conv2d
   that return input gradients only) gives every layer's output gradient per sample.
3. **per-sample norms** layer by layer: Linear ||g_s a_s^T||^2 = ||a_s||^2 ||g_s||^2 (the ghost norm; bias
   ||g_s||^2); Conv2d materialises the per-sample weight gradient G_s = g_s^T U_s (one batched GEMM, the
   cost of the layer's weight gradient) and keeps it; biases sum g_s over positions.
4. the clip factors c_s = min(1, C / (||g_s|| + 1e-12)) exactly as the generic path, then the **per-client
   sums** sum_s c_s g_s: weighted segmented GEMMs (c g)^T a for Linear, a weighted segment sum of the kept
   G_s for Conv2d. No second backward.

Nothing is approximated: every per-sample norm is the norm of the exact per-sample gradient (up to float
rounding), so the sums equal the generic path's to float tolerance (tests/engine/test_per_sample.py).

Without clipping (plain SGD, FedProx, clip_mode "batch") the same forward/backward gives each client's
gradient sum as segmented GEMMs (c_s = 1), with no per-sample anything.

With `bf16` (LocalSpec.precision "bfloat16") the GEMMs of the forward, the backward and the conv per-sample weight
gradients take bfloat16 operands and give float32 results (`_low` / `_gemm`); everything that bounds a record's
contribution stays float32 and is computed from the very values that are summed: a conv's per-sample gradient G_s
(the bf16 GEMM's result, in float32) is normed, scaled and summed in float32, and a Linear's clipped weight sum is a
float32 GEMM of the same float32 a_s, g_s the ghost norm is taken of. So clipping bounds each record's contribution
to C as in float32; only the gradients themselves carry bf16 rounding (~2^-8 relative a product).

Supported: an `nn.Sequential` (nested Sequentials flattened; `forward` not overridden) of `Linear` (2-D
input), `Conv2d` (groups 1, zero padding given as numbers), parameter-free element-wise or per-sample layers
(ReLU, Tanh, Sigmoid, LeakyReLU, ELU, GELU, SiLU, Softplus, MaxPool2d, AvgPool2d, Flatten, Unflatten,
Identity, LogSoftmax / Softmax over a non-batch axis) and Dropout / Dropout2d, whose masks are drawn from
torch's global RNG with the generic path's shapes and order (so results match it exactly). Every parameter
must belong to a supported layer, each layer must appear once (no weight sharing), and the model has no
buffers. Anything else returns None from `compile_model` and the engine uses the generic vmap path.

One file over 600 lines on purpose: the four steps share the layer objects, the packing and the cost model, and
read as one pipeline; split, each part would only make sense beside the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor

# Cost model of a segmented GEMM (microseconds): one call's fixed cost, GEMM throughput, copy throughput.
# Only the choice between "one GEMM per client" and "one padded batched GEMM" depends on them.
CALL_US = 6.0
FLOPS_PER_US = 50_000.0  # MKL GEMM
NATIVE_CONV_US = 150.0  # one oneDNN convolution call on a small batch (primitive creation included)
NATIVE_FLOPS_PER_US = 90_000.0  # oneDNN direct convolution with >= 8 channels (proportionally less below)
COPY_US_PER_FLOAT = (0.25e-3, 2e-3)  # strided copies (im2col / col2im) within cache / beyond CACHE_FLOATS
CACHE_FLOATS = 8 << 20


@dataclass(frozen=True)
class CostProfile:
    """One device type's costs for the cost model (microseconds): a call's fixed cost, GEMM throughput, a native
    convolution's call and throughput, copy cost per float within / beyond `cache_floats`. Only choices between
    equivalent computations depend on them (per-client GEMMs or one padded batched GEMM; im2col or native)."""

    call_us: float
    flops_per_us: float
    native_conv_us: float
    native_flops_per_us: float
    copy_us_per_float: tuple[float, float]
    cache_floats: int


# The CPU: the constants above (measured on the project's 2-core machine). CUDA: a call is a kernel launch (~10 us),
# GEMMs run at tens of TFLOP/s and copies at HBM bandwidth (~1e-6 us a float read and written), so on a GPU the padded
# batched GEMM wins whenever there are more than a few clients. Estimates from data sheets, not measured here.
COST_PROFILES: dict[str, CostProfile] = {
    "cpu": CostProfile(CALL_US, FLOPS_PER_US, NATIVE_CONV_US, NATIVE_FLOPS_PER_US, COPY_US_PER_FLOAT, CACHE_FLOATS),
    "cuda": CostProfile(10.0, 20e6, 20.0, 20e6, (4e-6, 4e-6), 12 << 20),
}


def cost_profile(device: torch.device) -> CostProfile:
    """The cost model's profile for `device`'s type (the CPU's for a type without one of its own)."""
    return COST_PROFILES.get(device.type, COST_PROFILES["cpu"])


# Strategy overrides for tests and measurements (None: the cost model chooses).
FORCE_SEGMENTED: str | None = None  # "loop" (one GEMM per client) or "pad" (one batched GEMM over padded clients)
FORCE_CONV: str | None = None  # "gemm" (im2col GEMMs, col2im) or "native" (oneDNN per client)
# How sums over records are added up (a client's records; col2im's overlapping windows): on the CPU with index_add_,
# which adds in index order; on other devices with kernels whose order is fixed (a padded per-client sum, F.fold),
# since CUDA's index_add_ adds with atomics in no fixed order and a run would not repeat bit for bit. The results
# agree to float rounding. None: by device; True / False force the ordered / index_add_ kernels (tests).
FORCE_ORDERED_SUMS: bool | None = None


def ordered_sums(device: torch.device) -> bool:
    """Whether sums over records on `device` use the fixed-order kernels (see FORCE_ORDERED_SUMS)."""
    return FORCE_ORDERED_SUMS if FORCE_ORDERED_SUMS is not None else device.type != "cpu"


class Unsupported(Exception):
    """The model (or this input) is outside what the fast path computes exactly; use the generic path."""


# ---------------------------------------------------------------------------------------------- packing


class Packing:
    """One step's records, packed client by client: `owner` [S] (non-decreasing), k clients (some may be empty).

    The padded layout `[k, bmax, ...]` puts sample s at row `pos[s] = owner[s] * bmax + rank of s in its client`,
    the layout the generic plain-SGD path vmaps over (its dropout masks are drawn in that shape).

    With `slots`, every client holds exactly `slots` consecutive rows (the engine's padded layout, padding rows
    weighted 0 by the caller): the sizes are known, nothing is read from the device, and the padded layout is the
    packed one (`pad` / `unpad` are reshapes).
    """

    def __init__(self, owner: Tensor, k: int, slots: int | None = None) -> None:
        self.owner, self.k, self.s = owner, k, int(owner.numel())
        self.uniform = slots is not None
        if slots is not None:
            if self.s != k * slots:
                raise ValueError(f"{self.s} records are not {k} clients of {slots} slots")
            self.counts_t = torch.full((k,), slots, dtype=torch.int64, device=owner.device)
            self.counts: list[int] = [slots] * k
        else:
            self.counts_t = (torch.bincount(owner, minlength=k) if self.s
                             else torch.zeros(k, dtype=torch.int64, device=owner.device))
            self.counts = self.counts_t.tolist()
        bounds, lo = [], 0
        for n in self.counts:
            bounds.append((lo, lo + n))
            lo += n
        self.bounds = bounds
        self.bmax = max(self.counts, default=0)
        self.active = [k for k, n in enumerate(self.counts) if n]  # clients with records this step
        self.nonempty = len(self.active)
        self._row_sizes: dict[int, list[int]] = {}
        self._pos: Tensor | None = None
        self.costs = cost_profile(owner.device)  # the cost model's profile for where the records are

    def row_sizes(self, r: int) -> list[int]:
        """Rows per client when each sample has `r` rows (the split sizes of a `[S * r, ...]` matrix)."""
        sizes = self._row_sizes.get(r)
        if sizes is None:
            sizes = self._row_sizes[r] = [n * r for n in self.counts]
        return sizes

    @property
    def pos(self) -> Tensor:
        if self._pos is None and self.uniform:
            self._pos = torch.arange(self.s, device=self.owner.device)
        if self._pos is None:
            starts = torch.cumsum(self.counts_t, 0) - self.counts_t
            self._pos = self.owner * self.bmax + (torch.arange(self.s, device=self.owner.device) - starts[self.owner])
        return self._pos

    def pad(self, t: Tensor) -> Tensor:
        """`[S, ...]` -> `[k, bmax, ...]`, zeros in the padding."""
        if self.uniform:
            return t.contiguous().view(self.k, self.bmax, *t.shape[1:])
        out = t.new_zeros(self.k * self.bmax, *t.shape[1:])
        out.index_copy_(0, self.pos, t)
        return out.view(self.k, self.bmax, *t.shape[1:])

    def unpad(self, t: Tensor) -> Tensor:
        """`[k, bmax, ...]` -> `[S, ...]`."""
        if self.uniform:
            return t.reshape(self.k * self.bmax, *t.shape[2:])
        return t.reshape(self.k * self.bmax, *t.shape[2:]).index_select(0, self.pos)

    def loop_is_cheaper(self, rows: int, d: int, e: int) -> bool:
        """Cost model: per-client GEMMs vs one batched GEMM over the padded layout, for [rows x d] @ [d x e] a
        sample."""
        if FORCE_SEGMENTED is not None:
            return FORCE_SEGMENTED == "loop"
        c = self.costs
        flops = 2.0 * self.s * rows * d * e
        loop = self.nonempty * c.call_us + flops / c.flops_per_us
        padded_floats = self.k * self.bmax * rows * (d + e)
        copies = 0.0 if self.uniform else 2.0 * padded_floats * c.copy_us_per_float[padded_floats > c.cache_floats]
        pad = 4 * c.call_us + flops * (self.k * self.bmax) / max(1, self.s) / c.flops_per_us + copies
        return loop <= pad


def _low(t: Tensor) -> Tensor:
    """A GEMM operand in bfloat16 (no copy if it is already): the one place bf16 mode casts, so a test can show that
    a float32 run never does."""
    return t.bfloat16()


def _gemm(fn: Callable[..., Tensor], *operands: Tensor) -> Tensor:
    """`fn` (a GEMM, a convolution) of the operands in bfloat16, the result in float32 (bf16 mode's products; the
    GEMM accumulates in float32, its result is rounded to bfloat16 once)."""
    return fn(*(_low(t) for t in operands)).float()


def seg_mm(a: Tensor, b: Tensor, pk: Packing, bias: Tensor | None = None, bf16: bool = False) -> Tensor:
    """out[s] = a[s] @ b[owner[s]] (+ bias[owner[s]]) for a `[S, r, d]`, b `[k, d, e]`, bias `[k, e]` -> `[S, r, e]`.
    `bf16`: the products in bfloat16 (`_gemm`), the result and the bias addition in float32."""
    if bf16:
        out = _gemm(lambda x, y: seg_mm(x, y, pk), a, b)
        return out if bias is None else out.add_(bias.index_select(0, pk.owner).unsqueeze(1))
    s, r, d = a.shape
    e = b.shape[-1]
    if pk.loop_is_cheaper(r, d, e):
        # one split / unbind per operand instead of a slice per client: fewer Python-level torch calls, which
        # matters when client groups run in threads (the GIL serialises them)
        out = a.new_empty(s * r, e)
        a_parts, o_parts, b_parts = a.reshape(s * r, d).split(pk.row_sizes(r)), out.split(pk.row_sizes(r)), b.unbind(0)
        if bias is None:
            for k in pk.active:
                torch.mm(a_parts[k], b_parts[k], out=o_parts[k])
        else:
            bias_parts = bias.unbind(0)
            for k in pk.active:
                torch.addmm(bias_parts[k], a_parts[k], b_parts[k], out=o_parts[k])
        return out.view(s, r, e)
    ap = pk.pad(a).view(pk.k, pk.bmax * r, d)
    out = torch.bmm(ap, b) if bias is None else torch.baddbmm(bias.unsqueeze(1), ap, b)
    return pk.unpad(out.view(pk.k, pk.bmax, r, e))


def seg_tmm(a: Tensor, c: Tensor, pk: Packing, bf16: bool = False) -> Tensor:
    """out[k] = sum over client k's samples of a[s]^T @ c[s], a `[S, r, d]`, c `[S, r, e]` -> `[k, d, e]`.
    `bf16`: the products in bfloat16, the result in float32 (unclipped sums only: see the module docstring)."""
    if bf16:
        return _gemm(lambda x, y: seg_tmm(x, y, pk), a, c)
    s, r, d = a.shape
    e = c.shape[-1]
    if pk.loop_is_cheaper(r, d, e):
        sizes = pk.row_sizes(r)
        a_parts, c_parts = a.reshape(s * r, d).split(sizes), c.reshape(s * r, e).split(sizes)
        out = a.new_empty(pk.k, d, e) if len(pk.active) == pk.k else a.new_zeros(pk.k, d, e)
        o_parts = out.unbind(0)
        for k in pk.active:
            torch.mm(a_parts[k].t(), c_parts[k], out=o_parts[k])
        return out
    ap = pk.pad(a).view(pk.k, pk.bmax * r, d)
    cp = pk.pad(c).view(pk.k, pk.bmax * r, e)
    return torch.bmm(ap.transpose(1, 2), cp)


def seg_sum(v: Tensor, pk: Packing) -> Tensor:
    """out[k] = sum of v[s] over client k's samples: `[S, ...]` -> `[k, ...]`."""
    if ordered_sums(v.device):
        return pk.pad(v).sum(1) if pk.bmax else v.new_zeros(pk.k, *v.shape[1:])
    return v.new_zeros(pk.k, *v.shape[1:]).index_add_(0, pk.owner, v)


def segment_sum(v: Tensor, owner: Tensor, k: int) -> Tensor:
    """out[j] = sum of v[s] over the samples with owner[s] == j: `[S, ...]` -> `[k, ...]` (`seg_sum` without a
    packing; `owner` in any order)."""
    if not ordered_sums(v.device):
        return v.new_zeros(k, *v.shape[1:]).index_add_(0, owner, v)
    if len(owner) and bool((owner[1:] < owner[:-1]).any()):
        order = torch.argsort(owner, stable=True)
        v, owner = v[order], owner[order]
    return seg_sum(v, Packing(owner, k))


# ------------------------------------------------------------------------------------------------ layers


class _Step:
    """What one forward/backward needs and leaves behind: weights, packing, per-sample norms, sum makers."""

    def __init__(self, pk: Packing, params: Mapping[str, Tensor], trainable: set[str], clip: bool,
                 padded_dropout: bool, bf16: bool = False) -> None:
        self.pk, self.params, self.trainable, self.clip = pk, params, trainable, clip
        self.padded_dropout = padded_dropout
        self.bf16 = bf16  # GEMMs in bfloat16, results float32 (`_gemm`)
        self.sq_norms: Tensor | None = None  # [S], sum over trainable tensors of ||g_s||^2
        self.norm_names: list[str] = []
        self.makers: dict[str, Callable[[Tensor | None], Tensor]] = {}  # name -> (c or None) -> [k, ...] sum
        self.cache: dict = {}

    def add_sq_norm(self, name: str, v: Tensor) -> None:
        self.norm_names.append(name)
        self.sq_norms = v if self.sq_norms is None else self.sq_norms + v


class _ParamFn(torch.autograd.Function):
    """A Linear / Conv2d with per-client weights: forward as segmented GEMMs; backward returns the input
    gradient only and records what the per-sample norms and per-client sums need in the step."""

    @staticmethod
    def forward(ctx, a, anchor, layer, step):  # noqa: ARG004 -- anchor only makes the output require grad
        z, saved = layer.forward(a, step)
        ctx.layer, ctx.step, ctx.saved = layer, step, saved
        return z

    @staticmethod
    def backward(ctx, gz):
        ga = ctx.layer.backward(gz, ctx.saved, ctx.step, ctx.needs_input_grad[0])
        ctx.saved = None
        return ga, None, None, None


class _Linear:
    def __init__(self, module: nn.Linear, prefix: str) -> None:
        self.w = prefix + "weight"
        self.b = prefix + "bias" if module.bias is not None else None
        self.names = [n for n in (self.w, self.b) if n is not None]
        self.in_features, self.out_features = module.in_features, module.out_features

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) != 1 or shape[0] != self.in_features:
            raise Unsupported(f"Linear {self.w} gets per-sample shape {shape}; "
                              f"the fast path needs ({self.in_features},)")
        return (self.out_features,)

    def elements(self, shape: tuple[int, ...]) -> int:
        return 2 * (shape[0] + self.out_features)

    def forward(self, a: Tensor, step: _Step):
        pk, p = step.pk, step.params
        bias = p[self.b] if self.b is not None else None
        z = seg_mm(a.unsqueeze(1), p[self.w].transpose(1, 2), pk, bias, step.bf16).squeeze(1)
        return z, (a.detach() if self.w in step.trainable else None)

    def backward(self, gz: Tensor, a: Tensor | None, step: _Step, need_input: bool):
        pk = step.pk
        gz = gz.contiguous()
        if self.w in step.trainable:
            if step.clip:
                step.add_sq_norm(self.w, a.pow(2).sum(1) * gz.pow(2).sum(1))

            def weight_sum(c, gz=gz, a=a):  # clipped (c given): float32, from the a, gz the ghost norm is of
                g = gz if c is None else gz * c.unsqueeze(1)
                return seg_tmm(g.unsqueeze(1), a.unsqueeze(1), pk, step.bf16 and c is None)

            step.makers[self.w] = weight_sum
        if self.b is not None and self.b in step.trainable:
            if step.clip:
                step.add_sq_norm(self.b, gz.pow(2).sum(1))
            step.makers[self.b] = lambda c, gz=gz: seg_sum(gz if c is None else gz * c.unsqueeze(1), pk)
        if not need_input:
            return None
        return seg_mm(gz.unsqueeze(1), step.params[self.w], pk, bf16=step.bf16).squeeze(1)


class _Conv2d:
    def __init__(self, module: nn.Conv2d, prefix: str) -> None:
        if module.groups != 1:
            raise Unsupported("grouped Conv2d")
        if module.padding_mode != "zeros":
            raise Unsupported(f"Conv2d padding_mode {module.padding_mode!r}")
        pad = module.padding
        if isinstance(pad, str):
            if pad != "valid":
                raise Unsupported(f"Conv2d padding {pad!r}")
            pad = (0, 0)
        self.w = prefix + "weight"
        self.b = prefix + "bias" if module.bias is not None else None
        self.names = [n for n in (self.w, self.b) if n is not None]
        self.cin, self.cout = module.in_channels, module.out_channels
        self.kh, self.kw = module.kernel_size
        self.sh, self.sw = module.stride
        self.ph, self.pw = pad
        self.dh, self.dw = module.dilation
        self.ckk = self.cin * self.kh * self.kw
        # im2col column order: (C, kh, kw) gathered from NCHW memory when there are few channels (runs of kw
        # contiguous floats), else (kh, kw, C) from channels-last memory (runs of C contiguous floats).
        self.channels_last = self.cin > 4
        self._grid: dict[tuple, Tensor] = {}  # keyed by input size and device

    def geometry(self, h: int, w: int) -> tuple[int, int]:
        ho = (h + 2 * self.ph - self.dh * (self.kh - 1) - 1) // self.sh + 1
        wo = (w + 2 * self.pw - self.dw * (self.kw - 1) - 1) // self.sw + 1
        return ho, wo

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) != 3 or shape[0] != self.cin:
            raise Unsupported(f"Conv2d {self.w} gets per-sample shape {shape}; the fast path needs ({self.cin}, H, W)")
        ho, wo = self.geometry(shape[1], shape[2])
        if ho < 1 or wo < 1:
            raise Unsupported(f"Conv2d {self.w}: empty output for per-sample shape {shape}")
        return (self.cout, ho, wo)

    def elements(self, shape: tuple[int, ...]) -> int:
        ho, wo = self.geometry(shape[1], shape[2])
        return 2 * ho * wo * self.ckk + self.cout * self.ckk + 4 * ho * wo * self.cout + 2 * math.prod(shape)

    def grid(self, h: int, w: int, device: torch.device) -> Tensor:
        """Padded-grid position (row * Wp + col) of every (output position, kernel offset), in (ho, wo, i, j) order:
        `[Ho*Wo*kh*kw]`, made once per input size and device (im2col gathers with it, col2im adds with it)."""
        key = (h, w, device)
        idx = self._grid.get(key)
        if idx is None:
            ho, wo = self.geometry(h, w)
            wp = w + 2 * self.pw

            def span(n: int) -> Tensor:
                return torch.arange(n, device=device)

            rows = (span(ho) * self.sh).view(-1, 1, 1, 1) + (span(self.kh) * self.dh).view(1, 1, -1, 1)
            cols = (span(wo) * self.sw).view(1, -1, 1, 1) + (span(self.kw) * self.dw).view(1, 1, 1, -1)
            idx = (rows * wp + cols).reshape(-1)
            self._grid[key] = idx
        return idx

    def _nchw_index(self, h: int, w: int, device: torch.device) -> Tensor:
        """For the (C, kh, kw) column order: flat index into one padded NCHW sample of every (position, c, i, j)."""
        key = ("nchw", h, w, device)
        idx = self._grid.get(key)
        if idx is None:
            plane = (h + 2 * self.ph) * (w + 2 * self.pw)
            g = self.grid(h, w, device).view(-1, 1, self.kh * self.kw)  # [L, 1, kh*kw]
            idx = (g + plane * torch.arange(self.cin, device=device).view(1, -1, 1)).reshape(-1)  # (L, C, kh*kw)
            self._grid[key] = idx
        return idx

    def im2col(self, a: Tensor) -> Tensor:
        """`[S, C, H, W]` -> U `[S, Ho*Wo, C*kh*kw]`, columns in this layer's order: one gather with a cached index
        (2-3x cheaper than a strided copy of unfolded views)."""
        s, _, h, w = a.shape
        ho, wo = self.geometry(h, w)
        hp, wp = h + 2 * self.ph, w + 2 * self.pw
        if self.channels_last:
            x = a.permute(0, 2, 3, 1)  # NHWC view (no copy when `a` is channels-last)
            if self.ph or self.pw:
                x = F.pad(x, (0, 0, self.pw, self.pw, self.ph, self.ph))
            x = x.reshape(s, hp * wp, self.cin)
            return x.index_select(1, self.grid(h, w, a.device)).view(s, ho * wo, self.ckk)  # (kh, kw, C) columns
        x = a
        if self.ph or self.pw:
            x = F.pad(x, (self.pw, self.pw, self.ph, self.ph))
        x = x.reshape(s, self.cin * hp * wp)
        return x.index_select(1, self._nchw_index(h, w, a.device)).view(s, ho * wo, self.ckk)  # (C, kh, kw) columns

    def _wmat(self, step: _Step) -> Tensor:
        """Weights as `[k, Cout, C*kh*kw]` in the im2col column order (made once per step)."""
        key = (self.w, "mat")
        m = step.cache.get(key)
        if m is None:
            w = step.params[self.w]
            m = w.permute(0, 1, 3, 4, 2) if self.channels_last else w
            m = m.reshape(w.shape[0], self.cout, self.ckk)
            step.cache[key] = m = _low(m) if step.bf16 else m
        return m

    def _to_weight(self, m: Tensor) -> Tensor:
        """`[k, Cout, C*kh*kw]` in the im2col column order -> `[k, Cout, C, kh, kw]`."""
        if not self.channels_last:
            return m.reshape(-1, self.cout, self.cin, self.kh, self.kw)
        return m.reshape(-1, self.cout, self.kh, self.kw, self.cin).permute(0, 1, 4, 2, 3).contiguous()

    # -- cost model (microseconds) of the ways to do this layer's products for the step's packing
    def _costs(self, pk: Packing, l: int) -> tuple[float, float, float, float]:
        """(GEMM on U, one oneDNN convolution per client, im2col, col2im) for one product of this layer."""
        c = pk.costs  # the profile of the records' device type
        flops = 2.0 * pk.s * l * self.cout * self.ckk
        floats = float(pk.s * l * self.ckk)
        gemm = flops / c.flops_per_us + pk.nonempty * c.call_us
        native = (flops / (c.native_flops_per_us * min(1.0, min(self.cin, self.cout) / 8))
                  + pk.nonempty * c.native_conv_us)
        im2col = floats * c.copy_us_per_float[floats > c.cache_floats]
        if FORCE_CONV == "gemm":
            return gemm, math.inf, 0.0, 0.0
        if FORCE_CONV == "native":
            return gemm, 0.0, math.inf, math.inf
        return gemm, native, im2col, 2 * im2col + 2 * c.call_us

    def forward(self, a: Tensor, step: _Step):
        pk, p = step.pk, step.params
        s, _, h, w = a.shape
        ho, wo = self.geometry(h, w)
        gemm, native, im2col, _ = self._costs(pk, ho * wo)
        trains = self.w in step.trainable
        # U is needed for the per-sample weight gradients (clipping), or for the weight sums when that is cheaper
        need_u = trains and (step.clip or im2col + gemm < native)
        if step.bf16:  # U only feeds GEMMs: gathered in bfloat16 (half the copy and the memory)
            a = _low(a)
        u = self.im2col(a) if need_u else None
        bias = p[self.b] if self.b is not None else None
        if native < gemm + (0.0 if need_u else im2col):
            z = self._forward_native(a, step, bias)
        else:
            if u is None:
                u = self.im2col(a)
            z = seg_mm(u, self._wmat(step).transpose(1, 2), pk, bias, step.bf16)  # [S, L, Cout]
            z = z.view(s, ho, wo, self.cout).permute(0, 3, 1, 2)  # NCHW view of channels-last memory
        return z, ((u if need_u else None), a.detach())

    def _forward_native(self, a: Tensor, step: _Step, bias: Tensor | None) -> Tensor:
        pk, wt = step.pk, step.params[self.w]
        geo = ((self.sh, self.sw), (self.ph, self.pw), (self.dh, self.dw))
        parts = []
        for k in pk.active:
            lo, hi = pk.bounds[k]
            if step.bf16:  # the convolution in bfloat16, the result and the bias addition in float32
                z = _gemm(lambda x, y: F.conv2d(x, y, None, *geo), a[lo:hi], wt[k])
                parts.append(z if bias is None else z.add_(bias[k].view(-1, 1, 1)))
            else:
                parts.append(F.conv2d(a[lo:hi], wt[k], None if bias is None else bias[k], *geo))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def backward(self, gz: Tensor, saved, step: _Step, need_input: bool):
        pk = step.pk
        u, a = saved
        s, _, h, w = a.shape
        ho, wo = gz.shape[2], gz.shape[3]
        l = ho * wo
        gemm, native, _, col2im = self._costs(pk, l)
        trains = self.w in step.trainable
        native_input = need_input and native < gemm + col2im
        native_weight = trains and u is None  # sums without clipping, when oneDNN beats im2col + GEMM
        g3 = None  # [S, L, Cout]: output gradients position-major
        ga, gw = None, None
        if native_input or native_weight:
            ga, gw = self._backward_native(gz, a, step, native_input, native_weight)
        if trains:
            if step.clip:
                # [S, Cout, L] as a view where possible: the transposed position-major gradient when gz is
                # channels-last (as our GEMM forward leaves it), else NCHW; a copy only for other layouts
                if gz.is_contiguous():
                    gcl = gz.view(s, self.cout, l)
                else:
                    g3 = gz.permute(0, 2, 3, 1).reshape(s, l, self.cout)
                    gcl = g3.transpose(1, 2)
                # [S, Cout, C*kh*kw]: the per-sample weight gradients (float32 in bf16 mode too), kept for the sum
                per = _gemm(torch.bmm, gcl, u) if step.bf16 else torch.bmm(gcl, u)
                step.add_sq_norm(self.w, torch.linalg.vector_norm(per.view(s, -1), dim=1).pow(2))

                def weight_sum(c, per=per):
                    return self._to_weight(seg_sum(per.mul_(c.view(-1, 1, 1)), pk))
            elif gw is not None:

                def weight_sum(c, gw=gw):  # noqa: ARG001 -- c is None here
                    return gw
            else:
                g3 = gz.permute(0, 2, 3, 1).reshape(s, l, self.cout)

                def weight_sum(c, g3=g3, u=u):  # noqa: ARG001 -- c is None here
                    return self._to_weight(seg_tmm(g3, u, pk, step.bf16))

            step.makers[self.w] = weight_sum
        if self.b is not None and self.b in step.trainable:
            gb = gz.sum((2, 3))
            if step.clip:
                step.add_sq_norm(self.b, gb.pow(2).sum(1))
            step.makers[self.b] = lambda c, gb=gb: seg_sum(gb if c is None else gb * c.unsqueeze(1), pk)
        if not need_input or ga is not None:
            return ga
        if g3 is None:
            g3 = gz.permute(0, 2, 3, 1).reshape(s, l, self.cout)
        du = seg_mm(g3, self._wmat(step), pk, bf16=step.bf16)  # [S, L, C*kh*kw]
        return self._col2im(du, s, h, w, ho, wo)

    def _backward_native(self, gz: Tensor, a: Tensor, step: _Step, need_input: bool, need_weight: bool):
        """Per client, oneDNN's convolution backward: input gradients `[S, C, H, W]` and/or weight sums `[k, ...]`."""
        pk, wt = step.pk, step.params[self.w]
        parts, gw = [], (torch.zeros_like(wt) if need_weight else None)
        for k, (lo, hi) in enumerate(pk.bounds):
            if hi > lo:
                gzk, ak, wk = gz[lo:hi], a[lo:hi], wt[k]
                if step.bf16:
                    gzk, ak, wk = _low(gzk), _low(ak), _low(wk)
                gi, gk, _ = torch.ops.aten.convolution_backward(
                    gzk, ak, wk, None, [self.sh, self.sw], [self.ph, self.pw], [self.dh, self.dw], False,
                    [0, 0], 1, [need_input, need_weight, False])
                if step.bf16:
                    gi, gk = (None if gi is None else gi.float()), (None if gk is None else gk.float())
                if need_input:
                    parts.append(gi)
                if need_weight:
                    gw[k] = gk
        ga = (torch.cat(parts) if len(parts) > 1 else parts[0]) if need_input else None
        return ga, gw

    def _col2im(self, du: Tensor, s: int, h: int, w: int, ho: int, wo: int) -> Tensor:
        """Sum the im2col gradient back onto the input grid: `[S, Ho*Wo, C*kh*kw]` -> `[S, C, H, W]` (one index_add)."""
        hp, wp = h + 2 * self.ph, w + 2 * self.pw
        if ordered_sums(du.device):  # F.fold sums each input pixel's windows in a fixed order (CUDA: one thread each)
            if self.channels_last:  # (kh, kw, C) columns -> F.fold's (C, kh, kw)
                cols = du.view(s, ho * wo, self.kh * self.kw, self.cin).permute(0, 3, 2, 1)
            else:
                cols = du.view(s, ho * wo, self.ckk).transpose(1, 2)
            return F.fold(cols.reshape(s, self.ckk, ho * wo), (h, w), (self.kh, self.kw), dilation=(self.dh, self.dw),
                          padding=(self.ph, self.pw), stride=(self.sh, self.sw))
        if self.channels_last:
            src = du.view(s, -1, self.cin)  # [S, Ho*Wo*kh*kw, C]
            out = du.new_zeros(s, hp * wp, self.cin).index_add_(1, self.grid(h, w, du.device), src)
            out = out.view(s, hp, wp, self.cin)
            return out[:, self.ph : self.ph + h, self.pw : self.pw + w].permute(0, 3, 1, 2)
        out = du.new_zeros(s, self.cin * hp * wp).index_add_(1, self._nchw_index(h, w, du.device), du.reshape(s, -1))
        return out.view(s, self.cin, hp, wp)[:, :, self.ph : self.ph + h, self.pw : self.pw + w]

class _Dropout:
    """nn.Dropout / nn.Dropout2d with the generic path's masks: drawn from torch's global RNG in the shape the
    generic path draws them (`[S, ...]` packed for DP-SGD, `[k, bmax, ...]` padded for plain SGD)."""

    def __init__(self, module: nn.Module, feature: bool) -> None:
        self.module, self.feature = module, feature

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.feature and len(shape) != 3:
            raise Unsupported("Dropout2d on an input that is not [S, C, H, W]")
        return shape

    def __call__(self, h: Tensor, step: _Step) -> Tensor:
        p = float(self.module.p)
        if not self.module.training or p == 0.0 or h.numel() == 0:
            return h
        if p == 1.0:
            return h * torch.zeros((), dtype=h.dtype)
        shape = (h.shape[0], h.shape[1], *([1] * (h.dim() - 2))) if self.feature else tuple(h.shape)
        pk = step.pk
        if step.padded_dropout:
            noise = torch.empty(pk.k * pk.bmax, *shape[1:], dtype=h.dtype, device=h.device).bernoulli_(1 - p)
            noise = noise.index_select(0, pk.pos)
        else:
            noise = torch.empty(shape, dtype=h.dtype, device=h.device).bernoulli_(1 - p)
        return h * noise.div_(1 - p)


class _Module:
    """A parameter-free layer that acts on every sample independently: applied to the packed batch as is."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        m = self.module
        if isinstance(m, (nn.Softmax, nn.LogSoftmax)):
            dim = m.dim
            if dim is None or dim == 0 or (dim < 0 and dim + len(shape) + 1 < 1):
                raise Unsupported(f"{type(m).__name__} over dim {dim} (it must be a per-sample axis)")
        if isinstance(m, nn.Flatten):
            start = m.start_dim if m.start_dim >= 0 else m.start_dim + len(shape) + 1
            if start < 1:
                raise Unsupported("Flatten over the batch axis")
        if isinstance(m, nn.Unflatten) and (m.dim == 0 or (m.dim < 0 and m.dim + len(shape) + 1 < 1)):
            raise Unsupported("Unflatten of the batch axis")
        out = m(torch.zeros(2, *shape, device="meta"))
        return tuple(out.shape[1:])

    def __call__(self, h: Tensor, step: _Step) -> Tensor:  # noqa: ARG002
        return self.module(h)


_ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Softplus, nn.Identity)
_PER_SAMPLE = (nn.MaxPool2d, nn.AvgPool2d, nn.Flatten, nn.Unflatten, nn.LogSoftmax, nn.Softmax)


def _layers(seq: nn.Sequential, prefix: str, out: list) -> None:
    for name, m in seq.named_children():
        full = f"{prefix}{name}."
        if isinstance(m, nn.Sequential):
            if type(m).forward is not nn.Sequential.forward:
                raise Unsupported(f"{full[:-1]} overrides Sequential.forward")
            _layers(m, full, out)
        elif type(m) in (nn.Linear,) or (isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward):
            out.append(_Linear(m, full))
        elif type(m) in (nn.Conv2d,) or (isinstance(m, nn.Conv2d) and type(m).forward is nn.Conv2d.forward):
            out.append(_Conv2d(m, full))
        elif type(m) in (nn.Dropout, nn.Dropout2d):
            if getattr(m, "inplace", False):
                raise Unsupported("in-place dropout")
            out.append(_Dropout(m, feature=type(m) is nn.Dropout2d))
        elif type(m) in _ELEMENTWISE or type(m) in _PER_SAMPLE:
            if getattr(m, "inplace", False):
                raise Unsupported(f"in-place {type(m).__name__}")
            if isinstance(m, nn.MaxPool2d) and m.return_indices:
                raise Unsupported("MaxPool2d(return_indices=True)")
            if type(m) is nn.MaxPool2d and out and isinstance(out[-1], _Module) and type(out[-1].module) is nn.ReLU:
                # ReLU -> MaxPool2d runs as MaxPool2d -> ReLU: the same values and gradients bit for bit (max commutes
                # with ReLU, and both orders send a window's gradient to its first maximum, or nowhere when it is
                # <= 0), with the ReLU and its backward on the pooled tensor (4x smaller for a 2x2 / stride-2 pool)
                out.insert(len(out) - 1, _Module(m))
                continue
            out.append(_Module(m))
        else:
            raise Unsupported(f"layer {full[:-1]} of type {type(m).__name__}")


# ------------------------------------------------------------------------------------------------- model


@dataclass
class FastModel:
    """A model the fast path runs exactly (build with `compile_model`)."""

    layers: list
    param_names: tuple[str, ...]

    def stochastic(self) -> bool:
        """True when a dropout layer is active (training mode, p > 0): it draws from torch's global RNG."""
        return any(isinstance(layer, _Dropout) and layer.module.training and layer.module.p > 0
                   for layer in self.layers)

    def check(self, sample_shape: tuple[int, ...], names: Sequence[str]) -> int:
        """Validate the per-sample input shape and the parameter names; return floats held per sample."""
        if set(names) != set(self.param_names):
            raise Unsupported("parameter names differ from the model's")
        shape, elements = tuple(sample_shape), math.prod(sample_shape)
        for layer in self.layers:
            if isinstance(layer, (_Linear, _Conv2d)):
                elements += layer.elements(shape)
            shape = layer.out_shape(shape)
            elements += 2 * math.prod(shape)
        return elements

    def _run(self, params: Mapping[str, Tensor], frozen: Mapping[str, Tensor], x: Tensor, y: Tensor,
             owner: Tensor, loss_fn, clipped: bool, padded_dropout: bool, weight: Tensor | None = None,
             slots: int | None = None, bf16: bool = False):
        """One forward/backward recording what the layers' gradient makers need; `clipped`: per-sample norms are
        taken (clipped sums, norms), else plain sums."""
        k = next(iter(params.values())).shape[0]
        if slots is None and len(owner) and bool((owner[1:] < owner[:-1]).any()):
            order = torch.argsort(owner, stable=True)
            x, y, owner = x[order], y[order], owner[order]
            weight = weight[order] if weight is not None else None
        pk = Packing(owner, k, slots)
        step = _Step(pk, {**frozen, **params}, set(params), clipped, padded_dropout, bf16)
        anchor = torch.zeros((), requires_grad=True, device=x.device)
        with torch.enable_grad():
            h = x
            for layer in self.layers:
                if isinstance(layer, (_Linear, _Conv2d)):
                    trains = any(n in step.trainable for n in layer.names)
                    h = _ParamFn.apply(h, anchor if trains else None, layer, step)
                else:
                    h = layer(h, step)
            loss = loss_fn(h, y)
            if loss.shape != (pk.s,):
                raise Unsupported(f"the loss returned shape {tuple(loss.shape)}, expected ({pk.s},)")
            if weight is not None and not clipped:  # unclipped sums: the weight scales each record's gradient
                loss = loss * weight
            torch.autograd.grad(loss.sum(), anchor, allow_unused=True)
        missing = set(params) - set(step.makers)
        if missing:  # every trainable tensor must have been reached; never silently drop a gradient
            raise RuntimeError(f"fast per-sample path: no gradient for {sorted(missing)}")
        if clipped and sorted(step.norm_names) != sorted(params):
            raise RuntimeError("fast per-sample path: the clipping norm does not cover every trainable tensor")
        return step, weight

    def clipped_sum(self, params: Mapping[str, Tensor], frozen: Mapping[str, Tensor] | None, x: Tensor, y: Tensor,
                    owner: Tensor, clip: float | Tensor, loss_fn, weight: Tensor | None = None,
                    slots: int | None = None, bf16: bool = False, counts: Tensor | None = None) -> dict[str, Tensor]:
        """Per client, the sum over its samples of the per-sample gradients w.r.t. `params` (stacked `[k, ...]`),
        each clipped to global L2 norm `clip`: the same as `local_training._clipped_sum`.

        `clip`: one norm, or one per client (`[k]`, adaptive clipping's C_k: a sample is clipped to its client's).
        `weight` [S] (0 / 1) multiplies each sample's clip factor: a padding slot's weight 0 removes it from the sum.
        `slots`: every client holds exactly that many consecutive samples (`owner` is uniform; see `Packing`).
        `bf16`: the GEMMs in bfloat16; norms, clip factors and sums in float32 (the module docstring).
        `counts` (`[k]`, float32): adds each client's CENTRED count, sum over its samples of 1[norm <= clip] - 1/2
        (weighted: padding slots never count), the count adaptive clipping releases."""
        if len(owner) == 0:
            return {n: torch.zeros_like(v) for n, v in params.items()}
        step, weight = self._run(params, frozen or {}, x, y, owner, loss_fn, True, False, weight, slots, bf16)
        norms = step.sq_norms.sqrt()
        bound = clip.index_select(0, step.pk.owner) if isinstance(clip, Tensor) else clip  # (owner sorted by _run)
        factor = torch.clamp(bound / (norms + 1e-12), max=1.0)
        if weight is not None:
            factor = factor * weight.to(factor.dtype)
        if counts is not None:
            below = (norms <= bound).to(counts.dtype) - 0.5  # centred: sensitivity 1/2 (adaptive_clipping)
            counts.add_(seg_sum(below if weight is None else below * weight.to(counts.dtype), step.pk))
        return {n: step.makers[n](factor).reshape(v.shape) for n, v in params.items()}

    def per_sample_norms(self, params, frozen, x, y, owner, loss_fn, bf16: bool = False) -> Tensor:
        """||g_s|| over the trainable tensors, per sample (in the order of a stably sorted `owner`)."""
        step, _ = self._run(params, frozen or {}, x, y, owner, loss_fn, True, padded_dropout=False, bf16=bf16)
        return step.sq_norms.sqrt()

    def grad_sum(self, params: Mapping[str, Tensor], frozen: Mapping[str, Tensor] | None, x: Tensor, y: Tensor,
                 owner: Tensor, loss_fn, weight: Tensor | None = None, slots: int | None = None,
                 bf16: bool = False) -> dict[str, Tensor]:
        """Per client, the sum over its samples of the loss gradients (no clipping): dropout masks are drawn
        in the padded `[k, bmax, ...]` layout of the generic plain-SGD path. `weight` and `slots` as in
        `clipped_sum` (the weight multiplies each sample's loss); `bf16` as there."""
        if len(owner) == 0:
            return {n: torch.zeros_like(v) for n, v in params.items()}
        step, _ = self._run(params, frozen or {}, x, y, owner, loss_fn, False, True, weight, slots, bf16)
        return {n: step.makers[n](None).reshape(v.shape) for n, v in params.items()}


def compile_model(model: nn.Module) -> FastModel | None:
    """The fast exact path for `model`, or None when it is not a supported sequential model."""
    try:
        if not isinstance(model, nn.Sequential) or type(model).forward is not nn.Sequential.forward:
            raise Unsupported("not an nn.Sequential")
        if any(True for _ in model.buffers()):
            raise Unsupported("the model has buffers")
        layers: list = []
        _layers(model, "", layers)
        owned = [n for layer in layers if isinstance(layer, (_Linear, _Conv2d)) for n in layer.names]
        names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
        if sorted(owned) != sorted(names) or len(set(owned)) != len(owned):
            raise Unsupported("parameters outside supported layers, or shared")
        mods = [m for _, m in model.named_modules(remove_duplicate=False) if not isinstance(m, nn.Sequential)]
        if len({id(m) for m in mods}) != len(mods):
            raise Unsupported("a layer appears twice")
    except Unsupported:
        return None
    return FastModel(layers, tuple(names))

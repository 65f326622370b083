"""The fast path's convolution glue (`engine/per_sample.py`): ReLU -> MaxPool2d runs as MaxPool2d -> ReLU.

max-pool(ReLU(x)) == ReLU(max-pool(x)) exactly, and both orders send a window's gradient to its first maximum (or
nowhere when the maximum is <= 0), so the reordered chain must give the same sums bit for bit as the chain in the
model's order, also where windows tie (zero background, quantised inputs, all-negative windows), and equal the
materialised per-sample gradients (vmap) to float tolerance, for pools with stride 1 and 2, padding, ceil_mode and
dilation.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfl.engine import params as P
from dpfl.engine import per_sample as PS
from dpfl.engine.local_training import _clipped_sum, _per_sample_grad_fn
from dpfl.engine.losses import per_sample_loss
from dpfl.models import build_model, model_info

RTOL = 1e-5


pytestmark = pytest.mark.usefixtures("one_thread")


def _kinds(fast):
    return [type(layer.module).__name__ if isinstance(layer, PS._Module) else type(layer).__name__
            for layer in fast.layers]


def test_relu_before_a_max_pool_runs_after_it_and_nothing_else_moves():
    lenet = build_model("lenet5", model_info("lenet5").small_shape, 10, seed=0)
    assert _kinds(PS.compile_model(lenet)) == ["_Conv2d", "MaxPool2d", "ReLU", "_Conv2d", "MaxPool2d", "ReLU",
                                               "Flatten", "_Linear", "ReLU", "_Linear", "ReLU", "_Linear"]
    other = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Tanh(), nn.MaxPool2d(2), nn.ReLU(), nn.AvgPool2d(2),
                          nn.ReLU(), nn.Dropout(0.0), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(2, 3))
    assert _kinds(PS.compile_model(other)) == ["_Conv2d", "Tanh", "MaxPool2d", "ReLU", "AvgPool2d", "ReLU",
                                               "_Dropout", "MaxPool2d", "Flatten", "_Linear"]


def _in_model_order(model):
    """The fast model with its layers in the model's own order (no reordering)."""
    layers = []
    for name, m in model.named_children():
        if isinstance(m, nn.Conv2d):
            layers.append(PS._Conv2d(m, f"{name}."))
        elif isinstance(m, nn.Linear):
            layers.append(PS._Linear(m, f"{name}."))
        else:
            layers.append(PS._Module(m))
    return PS.FastModel(layers, tuple(n for n, _ in model.named_parameters()))


POOLS = {
    "2 stride 1": dict(kernel_size=2, stride=1),
    "2 stride 2": dict(kernel_size=2, stride=2),
    "3 stride 2 padding 1 ceil": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    "2 dilation 2": dict(kernel_size=2, stride=1, dilation=2),
}


def _tied_case(pool, cin, seed=0):
    """Conv -> ReLU -> MaxPool -> Conv -> ReLU -> MaxPool -> Linear on quantised images with a zero border, so many
    windows tie (equal conv outputs over the background) and some are entirely negative."""
    torch.manual_seed(seed)
    body = nn.Sequential(nn.Conv2d(cin, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(**pool),
                         nn.Conv2d(6, 8, 3), nn.ReLU(), nn.MaxPool2d(**pool), nn.Flatten())
    model = body.append(nn.Linear(body(torch.zeros(1, cin, 14, 14)).shape[1], 10))
    g = torch.Generator().manual_seed(seed + 1)
    counts = [4, 0, 3, 5]
    owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    x = torch.zeros(len(owner), cin, 14, 14)
    x[:, :, 4:10, 3:11] = torch.randint(-2, 3, (len(owner), cin, 6, 8), generator=g).float()
    y = torch.randint(0, 10, (len(owner),), generator=g)
    w = {n: v + 0.05 * v.abs().mean() * torch.randn((len(counts), *v.shape), generator=g)
         for n, v in P.model_params(model).items()}
    return model, w, x, y, owner, counts


@pytest.mark.parametrize("conv", ["auto", "gemm", "native"])
@pytest.mark.parametrize("cin", [1, 6])  # both im2col column orders
@pytest.mark.parametrize("pool", sorted(POOLS))
def test_reordered_pools_are_bit_identical_and_equal_the_per_sample_gradients(monkeypatch, pool, cin, conv):
    if conv != "auto":
        monkeypatch.setattr(PS, "FORCE_CONV", conv)
    model, w, x, y, owner, counts = _tied_case(POOLS[pool], cin)
    fast, plain = PS.compile_model(model), _in_model_order(model)
    assert _kinds(fast)[1:3] == ["MaxPool2d", "ReLU"] and _kinds(plain)[1:3] == ["ReLU", "MaxPool2d"]
    loss = per_sample_loss("cross_entropy")
    grads_of = _per_sample_grad_fn(model, loss)
    raw = P.global_norms(grads_of(P.select(w, owner), x, y))
    assert bool((raw > 0).all())
    for clip in (0.5 * float(raw.median()), 1e9):
        out = fast.clipped_sum(w, {}, x, y, owner, clip, loss)
        same = plain.clipped_sum(w, {}, x, y, owner, clip, loss)
        ref = _clipped_sum(grads_of, w, x, y, owner, clip)
        for n in ref:
            assert torch.equal(out[n], same[n]), n
            assert float((out[n] - ref[n]).norm() / ref[n].norm()) <= RTOL, n
    sums, same = fast.grad_sum(w, {}, x, y, owner, loss), plain.grad_sum(w, {}, x, y, owner, loss)
    assert all(torch.equal(sums[n], same[n]) for n in sums)
    assert torch.equal(fast.per_sample_norms(w, {}, x, y, owner, loss),
                       plain.per_sample_norms(w, {}, x, y, owner, loss))

"""Every registered model under `torch.func`: per-sample gradients with vmap(grad) equal gradients computed
one sample at a time, and vmap over a stack of client parameter copies works (the engine's two axes)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, stack_module_state, vmap

from dpfl.models import MODELS, build_model, model_info

ATOL = 1e-5


def _loss(kind: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean loss of a batch under the model's declared loss kind (vmap-safe: no F.one_hot)."""
    if kind == "cross_entropy":
        return F.cross_entropy(out, y)
    if kind == "nll":
        return F.nll_loss(out, y)
    if kind == "mse_onehot":
        onehot = (y.unsqueeze(-1) == torch.arange(out.shape[-1])).to(out.dtype)
        return 0.5 * (out - onehot).pow(2).sum(-1).mean()
    raise AssertionError(kind)


def _batch(name: str, n: int, dtype=None):
    """`n` samples in `dtype` (default: the model's dtype)."""
    dtype = dtype or model_info(name).dtype
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, *model_info(name).small_shape, generator=g, dtype=dtype)
    y = torch.randint(0, 10, (n,), generator=g)
    return x, y


def _batch_size(name: str) -> int:
    return 2 if name in ("resnet18_gn", "resnet_small_gn", "lenet5") else 4


def _per_sample_loss(model: torch.nn.Module, kind: str):
    def loss(params, x, y):
        out = functional_call(model, params, (x.unsqueeze(0),))
        return _loss(kind, out, y.unsqueeze(0))

    return loss


def _loop_grads(model: torch.nn.Module, kind: str, x: torch.Tensor, y: torch.Tensor) -> list[dict]:
    grads = []
    names = [n for n, _ in model.named_parameters()]
    for i in range(x.shape[0]):
        out = model(x[i : i + 1])
        gs = torch.autograd.grad(_loss(kind, out, y[i : i + 1]), list(model.parameters()))
        grads.append(dict(zip(names, gs, strict=True)))
    return grads


@pytest.mark.parametrize("name", sorted(MODELS))
def test_per_sample_grads_equal_one_at_a_time(name):
    info = model_info(name)
    model = build_model(name, info.small_shape, 10, seed=0).eval()  # eval: dropout off
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = _batch(name, _batch_size(name))
    per_sample = vmap(grad(_per_sample_loss(model, info.loss)), in_dims=(None, 0, 0))(params, x, y)
    expected = _loop_grads(model, info.loss, x, y)
    for k in params:
        assert per_sample[k].shape == (x.shape[0], *params[k].shape)
        for i in range(x.shape[0]):
            torch.testing.assert_close(
                per_sample[k][i], expected[i][k], atol=ATOL, rtol=0, msg=f"{name}:{k}[{i}]"
            )
    # and they are not trivially zero (logr's zero init still has non-zero gradients)
    assert any(per_sample[k].abs().max() > 0 for k in params)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_vmap_over_stacked_client_parameters(name):
    info = model_info(name)
    init = "torch" if "torch" in info.inits else "default"  # MP-DP's networks have only their own init
    clients = [build_model(name, info.small_shape, 10, seed=s, init=init).eval() for s in range(3)]
    params, _ = stack_module_state(clients)
    skeleton = copy.deepcopy(clients[0]).to("meta")
    x, y = _batch(name, _batch_size(name))

    out = vmap(lambda p, xb: functional_call(skeleton, p, (xb,)), in_dims=(0, None))(params, x)
    assert out.shape == (3, x.shape[0], 10)
    with torch.no_grad():
        for k, client in enumerate(clients):
            torch.testing.assert_close(out[k], client(x), atol=ATOL, rtol=1e-5)

    if name == "resnet18_gn":
        return  # clients x samples of 11M-parameter gradients: covered by the per-sample test above
    # Clients x samples, the DP-SGD layout: vmap over clients of vmap over samples of grad. Checked in
    # float64: in float32 the batched convolutions round differently from the one-sample loop, and a
    # ReLU input within ~1e-6 of zero (there are tens of thousands of them in the ResNets) can flip,
    # moving a gradient entry by ~1e-3. That is rounding, not a vmap error; float64 removes it.
    clients = [c.double() for c in clients]
    params, _ = stack_module_state(clients)
    skeleton = copy.deepcopy(clients[0]).to("meta")
    x = x.double()
    per_sample = vmap(grad(_per_sample_loss(skeleton, info.loss)), in_dims=(None, 0, 0))
    grads = vmap(per_sample, in_dims=(0, None, None))(params, x, y)
    for k, client in enumerate(clients):
        expected = _loop_grads(client, info.loss, x, y)
        for pname in params:
            for i in range(x.shape[0]):
                torch.testing.assert_close(grads[pname][k, i], expected[i][pname], atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", [n for n in sorted(MODELS) if model_info(n).stochastic])
def test_dropout_in_training_mode_under_vmap(name):
    info = model_info(name)
    model = build_model(name, info.small_shape, 10, seed=0).train()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = _batch(name, 1)
    x, y = x.expand(8, *x.shape[1:]), y.expand(8)  # the same sample 8 times
    torch.manual_seed(0)
    per_sample = vmap(grad(_per_sample_loss(model, info.loss)), in_dims=(None, 0, 0), randomness="different")(
        params, x, y
    )
    g = next(iter(per_sample.values()))
    assert torch.isfinite(g).all()
    # independent masks per sample: identical inputs give different gradients
    assert not all(torch.equal(g[0], g[i]) for i in range(1, 8))
    # eval mode is deterministic
    model.eval()
    det = vmap(grad(_per_sample_loss(model, info.loss)), in_dims=(None, 0, 0))(params, x, y)
    d = next(iter(det.values()))
    assert all(torch.equal(d[0], d[i]) for i in range(1, 8))


@pytest.mark.parametrize("name", ["relu_mlp", "cnn_digits_nobias", "logr"])
def test_per_sample_grads_in_float64(name):
    # The bidirectional CI configs run in float64; recovered gradients are compared at 1e-10 there.
    info = model_info(name)
    model = build_model(name, info.small_shape, 10, seed=0, init="torch").double().eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = _batch(name, 3, dtype=torch.float64)
    per_sample = vmap(grad(_per_sample_loss(model, info.loss)), in_dims=(None, 0, 0))(params, x, y)
    expected = _loop_grads(model, info.loss, x, y)
    for k in params:
        assert per_sample[k].dtype == torch.float64
        for i in range(3):
            torch.testing.assert_close(per_sample[k][i], expected[i][k], atol=1e-12, rtol=0)

"""Initialisation: schemes, seeding through `Purpose.INIT`, and no use of the global RNG when seeded."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dpfl.models import MODELS, build_model, cnn, init_parameters, lenet, mlp, model_info
from dpfl.seeding import Purpose, torch_generator


def _weights(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]


def _fans(w: torch.Tensor) -> tuple[int, int]:
    receptive = w[0][0].numel() if w.dim() > 2 else 1
    return w.shape[1] * receptive, w.shape[0] * receptive


def _assert_uniform(w: torch.Tensor, bound: float, where: str) -> None:
    """w looks like i.i.d. U(-bound, bound).

    Tolerances (n = w.numel(), smallest tensor here n = 320): for U(-a, a) the sample std has relative
    standard error sqrt((kurtosis - 1) / (4 n)) = sqrt(0.2 / n) (kurtosis 9/5), and the sample mean has
    standard error (a / sqrt 3) / sqrt n. We allow 5 standard errors (two-sided p < 1e-6 per check).
    The max is within a * 10 / n of the bound except with probability (1 - 10/n)^n < e^-10, and it can
    never exceed the bound.
    """
    n = w.numel()
    std = bound / math.sqrt(3)
    assert w.abs().max() <= bound, where
    assert w.abs().max() >= bound * (1 - 10 / n), where
    assert abs(w.std().item() / std - 1) < 5 * math.sqrt(0.2 / n), where
    assert abs(w.mean().item()) < 5 * std / math.sqrt(n), where


@pytest.mark.parametrize("name", ["cnn_pfa", "logr", "cnn_rhdp", "mlp2"])
def test_keras_init_is_glorot_uniform_with_zero_biases(name):
    info = model_info(name)
    model = build_model(name, info.reference_shape, 10, seed=11, init="keras")
    layers = _weights(model)
    assert layers
    for lname, layer in layers:
        if layer.bias is not None:
            assert torch.count_nonzero(layer.bias) == 0, lname
        fan_in, fan_out = _fans(layer.weight)
        _assert_uniform(layer.weight.detach(), math.sqrt(6 / (fan_in + fan_out)), f"{name}.{lname}")


def test_keras_and_torch_inits_are_distinguishable():
    # cnn_pfa conv1: Glorot bound sqrt(6 / (64 + 1024)) ≈ 0.074 vs PyTorch's 1/sqrt(64) = 0.125.
    keras = build_model("cnn_pfa", (1, 28, 28), 10, seed=0, init="keras").conv1.weight
    torch_ = build_model("cnn_pfa", (1, 28, 28), 10, seed=0, init="torch").conv1.weight
    assert keras.abs().max() < 0.075 < 0.12 < torch_.abs().max()
    assert torch.count_nonzero(build_model("cnn_pfa", (1, 28, 28), 10, seed=0).conv1.bias) == 16


@pytest.mark.parametrize("name", ["cnn_pfa", "lenet5", "relu_mlp"])
def test_torch_init_follows_pytorch_default(name):
    # The default scheme is PyTorch's: kaiming_uniform(a=sqrt 5) weights, U(±1/sqrt(fan_in)) biases.
    model = build_model(name, model_info(name).small_shape, 10, seed=2)
    for lname, layer in _weights(model):
        fan_in, _ = _fans(layer.weight)
        _assert_uniform(layer.weight.detach(), 1 / math.sqrt(fan_in), f"{name}.{lname}")
        if layer.bias is not None:
            assert layer.bias.abs().max() <= 1 / math.sqrt(fan_in)


@pytest.mark.parametrize(
    ("name", "construct"),
    [
        ("cnn_pfa", lambda: cnn.CNNPFA((1, 28, 28), 10)),
        ("lenet5", lambda: lenet.LeNet5((3, 32, 32), 10)),
        ("mlp2", lambda: mlp.MLP2(784, 10)),
        ("cnn_mnist_splitting", lambda: cnn.CNNMnistSplitting((1, 28, 28), 10)),
    ],
)
def test_torch_scheme_is_bitwise_pytorch_construction(name, construct):
    # Unseeded builds draw from the global RNG with the same calls, in the same order, as the modules'
    # own reset_parameters, so they reproduce plain PyTorch construction exactly.
    torch.manual_seed(123)
    reference = construct()
    torch.manual_seed(123)
    shape = (784,) if name == "mlp2" else model_info(name).reference_shape
    built = build_model(name, shape, 10, init="torch")
    ref_params = dict(reference.named_parameters())
    for pname, p in built.named_parameters():
        assert torch.equal(p, ref_params[pname]), pname


def test_logr_zero_init_by_default():
    model = build_model("logr", (784,), 10, seed=5)
    assert all(torch.count_nonzero(p) == 0 for p in model.parameters())
    assert torch.count_nonzero(build_model("logr", (784,), 10, seed=5, init="torch").fc.weight) > 0


def test_torchvision_init_for_resnets():
    model = build_model("resnet_small_gn", (3, 32, 32), 10, seed=4)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    # All 3x3 convs with 16 output channels share std sqrt(2 / fan_out) = sqrt(2 / 144); pool them.
    w = torch.cat([m.weight.detach().flatten() for m in convs if m.out_channels == 16])
    n, std = w.numel(), math.sqrt(2 / (16 * 9))
    # Normal: the sample std has relative standard error sqrt(1 / (2 n)); allow 5 of them.
    assert abs(w.std().item() / std - 1) < 5 * math.sqrt(1 / (2 * n))
    for m in model.modules():
        if isinstance(m, nn.GroupNorm):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)


def test_dlg_init_is_uniform_half():
    model = build_model("dlg_lenet", (3, 32, 32), 10, seed=0)
    for pname, p in model.named_parameters():
        assert p.abs().max() <= 0.5, pname
    _assert_uniform(model.fc.weight.detach(), 0.5, "dlg_lenet.fc")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_same_seed_same_weights_different_seed_different(name):
    shape = model_info(name).small_shape
    a = build_model(name, shape, 10, seed=7)
    b = build_model(name, shape, 10, seed=7)
    c = build_model(name, shape, 10, seed=8)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    random_tensors = [k for k in pa if (pa[k] != pa[k].flatten()[0]).any()]  # not constant (zeros, GN ones)
    if name == "logr":
        assert not random_tensors  # zero init: nothing random, seeds agree
    else:
        assert random_tensors
        assert all(not torch.equal(pa[k], pc[k]) for k in random_tensors)


def test_seeded_build_draws_from_the_init_stream():
    model = build_model("cnn_digits", (1, 8, 8), 10, seed=9)
    fresh = cnn.CNNDigits((1, 8, 8), 10)
    init_parameters(fresh, "torch", torch_generator(9, Purpose.INIT))
    for (n, p), (_, q) in zip(model.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_seeded_build_leaves_global_rng_alone():
    torch.manual_seed(0)
    state = torch.get_rng_state()
    for name in MODELS:
        build_model(name, model_info(name).small_shape, 10, seed=1)
    assert torch.equal(torch.get_rng_state(), state)


def test_unseeded_build_follows_global_rng():
    torch.manual_seed(42)
    a = build_model("mlp2", (64,), 10)
    torch.manual_seed(42)
    b = build_model("mlp2", (64,), 10)
    c = build_model("mlp2", (64,), 10)
    assert torch.equal(a.fc1.weight, b.fc1.weight)
    assert not torch.equal(b.fc1.weight, c.fc1.weight)


def test_init_parameters_rejects_unknown_modules_and_schemes():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3))

    with pytest.raises(TypeError, match="Odd"):
        init_parameters(Odd(), "torch")
    with pytest.raises(ValueError, match="unknown init scheme"):
        init_parameters(nn.Linear(2, 2), "xavier")

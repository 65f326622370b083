"""Architectures: the specs' exact parameter counts, tensor counts, layer names and output shapes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfl.models import MODELS, build_model, count_parameters, model_info


@pytest.mark.parametrize(
    ("name", "shape", "n_classes", "params", "tensors"),
    [
        ("logr", (784,), 10, 7_850, 2),
        ("logr", (1, 28, 28), 10, 7_850, 2),
        ("mlp2", (1, 28, 28), 10, 50_816, 2),
        ("mlp2", (1, 28, 28), 26, 51_840, 2),
        ("mlp2", (3, 32, 32), 10, 3072 * 64 + 64 * 10, 2),  # FedCEO's CIFAR MLP, d = 3072
        ("relu_mlp", (64,), 10, 64 * 64 + 64 * 32 + 32 * 10, 3),  # ci_digits_mlp 64-64-32-10
        ("cnn_pfa", (1, 28, 28), 10, 26_010, 8),
        ("cnn_rhdp", (1, 28, 28), 10, 28_938, 6),
        ("cnn_mnist_dp", (1, 28, 28), 10, 28_938, 6),
        ("cnn_mnist_splitting", (1, 28, 28), 10, 260 + 5_020 + 6_420 + 210, 8),
        ("cnn_digits", (1, 8, 8), 10, 80 + 1_290, 4),
        ("cnn_digits_nobias", (1, 8, 8), 10, 72 + 1_152 + 2_560, 3),
        ("lenet5", (3, 32, 32), 10, 1_141_194, 10),
        ("dlg_lenet", (3, 32, 32), 10, 912 + 3_612 + 3_612 + 7_690, 8),
        ("resnet18_gn", (3, 32, 32), 10, 11_181_642, 62),
        ("resnet18_gn", (3, 224, 224), 10, 11_181_642, 62),  # spatial size does not change the count
        ("resnet_small_gn", (3, 32, 32), 10, 269_722, 59),
        ("mpdp_mlp", (1, 8, 8), 10, 6_464, 3),  # the relu_mlp network
        ("mpdp_cnn", (1, 8, 8), 10, 3_784, 3),  # the cnn_digits_nobias network
        ("mpdp_resnet", (3, 32, 32), 10, 314_416, 22),  # stem, 18 block convs, 2 strided convs, head
    ],
)
def test_parameter_and_tensor_counts(name, shape, n_classes, params, tensors):
    model = build_model(name, shape, n_classes, seed=0)
    assert count_parameters(model) == params
    assert len(list(model.parameters())) == tensors


def test_resnet_small_variants():
    assert count_parameters(build_model("resnet_small_gn", (3, 32, 32), 10, shortcut="projection")) == 272_474
    # ResNet-32: 5 blocks per stage instead of 3; each extra block adds two p->p 3x3 convs and two
    # GroupNorms (2p affine parameters each).
    extra = sum(2 * (2 * p * p * 9 + 2 * 2 * p) for p in (16, 32, 64))
    assert count_parameters(build_model("resnet_small_gn", (3, 32, 32), 10, depth=32)) == 269_722 + extra


def test_mlp_options():
    m = build_model("relu_mlp", (1, 8, 8), 10, hidden=[16, 16, 8])
    assert [mod.out_features for mod in m if isinstance(mod, nn.Linear)] == [16, 16, 8, 10]
    assert m.head_name == "fc4" and m.get_submodule(m.head_name).out_features == 10
    assert count_parameters(build_model("relu_mlp", (5,), 3, hidden=4)) == 5 * 4 + 4 * 3
    with_bias = build_model("relu_mlp", (64,), 10, bias=True)
    assert count_parameters(with_bias) == 6_464 + 64 + 32 + 10
    assert count_parameters(build_model("mlp2", (784,), 10, hidden=128)) == 784 * 128 + 128 * 10
    assert isinstance(build_model("mlp2", (784,), 10, dropout=0.0).dropout, nn.Identity)
    assert isinstance(build_model("cnn_mnist_splitting", (1, 28, 28), 10, dropout=0).conv2_drop, nn.Identity)
    assert count_parameters(build_model("logr", (20,), 10, bias=False)) == 200


def test_bias_free_models_have_no_biases():
    for name in ("mlp2", "relu_mlp", "cnn_digits_nobias", "mpdp_mlp", "mpdp_cnn", "mpdp_resnet"):
        model = build_model(name, model_info(name).small_shape, 10, seed=0)
        assert all(not n.endswith("bias") for n, _ in model.named_parameters()), name


def test_relu_mlp_is_a_plain_relu_stack():
    # ReLU after every layer but the last, last layer linear (bidirectional.md §7.1, §7.5).
    model = build_model("relu_mlp", (64,), 10)
    kinds = [type(m).__name__ for m in model]
    assert kinds == ["Flatten", "Linear", "ReLU", "Linear", "ReLU", "Linear"]
    cnn = build_model("cnn_digits_nobias", (1, 8, 8), 10)
    assert [type(m).__name__ for m in cnn] == [
        "Conv2d",
        "ReLU",
        "MaxPool2d",
        "Conv2d",
        "ReLU",
        "Flatten",
        "Linear",
    ]


def test_layer_names_used_by_other_specs():
    # FedCEO folds per tensor and CENTAUR splits off the head by name (fedceo.md §5, §6.3).
    lenet = dict(build_model("lenet5", (3, 32, 32), 10).named_parameters())
    assert {k: tuple(v.shape) for k, v in lenet.items()} == {
        "conv1.weight": (32, 3, 5, 5),
        "conv1.bias": (32,),
        "conv2.weight": (64, 32, 5, 5),
        "conv2.bias": (64,),
        "fc1.weight": (512, 1600),
        "fc1.bias": (512,),
        "fc2.weight": (512, 512),
        "fc2.bias": (512,),
        "fc3.weight": (10, 512),
        "fc3.bias": (10,),
    }
    mlp = dict(build_model("mlp2", (1, 28, 28), 26).named_parameters())
    assert {k: tuple(v.shape) for k, v in mlp.items()} == {"fc1.weight": (64, 784), "fc2.weight": (26, 64)}
    pfa = [n for n, _ in build_model("cnn_pfa", (1, 28, 28), 10).named_parameters()]
    assert pfa == [
        f"{layer}.{kind}" for layer in ("conv1", "conv2", "fc1", "fc2") for kind in ("weight", "bias")
    ]


def test_resnet18_gn_follows_torchvision_layout():
    model = build_model("resnet18_gn", (3, 32, 32), 10, seed=0)
    names = {n for n, _ in model.named_parameters()}
    for expected in (
        "conv1.weight",
        "bn1.weight",
        "layer1.0.conv1.weight",
        "layer1.1.bn2.bias",
        "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.weight",
        "layer4.1.conv2.weight",
        "fc.weight",
        "fc.bias",
    ):
        assert expected in names
    assert "layer1.0.downsample.0.weight" not in names
    assert model.conv1.kernel_size == (7, 7) and model.conv1.stride == (2, 2)
    assert isinstance(model.maxpool, nn.MaxPool2d)
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 20 and all(m.num_groups == 2 for m in norms)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_vmap_safety_invariants(name):
    model = build_model(name, model_info(name).small_shape, 10, seed=0)
    assert list(model.buffers()) == []
    for m in model.modules():
        assert not isinstance(m, nn.modules.batchnorm._BatchNorm)
        assert not getattr(m, "inplace", False), f"{name}: in-place {type(m).__name__}"


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("which", ["small", "reference"])
def test_output_shapes(name, which):
    info = model_info(name)
    shape = info.small_shape if which == "small" else info.reference_shape
    if name == "resnet18_gn" and which == "reference":
        shape = (3, 64, 64)
    model = build_model(name, shape, 10, seed=0).eval()
    x = torch.randn(3, *shape, generator=torch.Generator().manual_seed(0), dtype=info.dtype)  # the model's dtype
    with torch.no_grad():
        out = model(x)
    assert out.shape == (3, 10)
    assert torch.isfinite(out).all()
    if info.loss == "nll":  # log-probabilities
        torch.testing.assert_close(out.exp().sum(-1), torch.ones(3))


def test_digits_shape_supported_by_the_demo_models():
    x = torch.rand(5, 1, 8, 8)
    for name in ("logr", "mlp2", "relu_mlp", "cnn_digits", "cnn_digits_nobias", "resnet_small_gn"):
        assert build_model(name, (1, 8, 8), 10, seed=1).eval()(x).shape == (5, 10), name
    # flattened digits work for the flattening models
    assert build_model("relu_mlp", (64,), 10)(x.flatten(1)).shape == (5, 10)


def test_other_reasonable_shapes():
    assert build_model("cnn_rhdp", (3, 32, 32), 10)(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert (
        count_parameters(build_model("cnn_rhdp", (3, 32, 32), 10))
        == 3 * 16 * 25 + 16 + 12_832 + 32 * 8 * 8 * 10 + 10
    )
    assert build_model("lenet5", (1, 28, 28), 26)(torch.randn(2, 1, 28, 28)).shape == (2, 26)
    assert build_model("resnet18_gn", (1, 28, 28), 10)(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_float64():
    model = build_model("cnn_digits_nobias", (1, 8, 8), 10, seed=0).double()
    assert model(torch.randn(2, 1, 8, 8, dtype=torch.float64)).dtype == torch.float64

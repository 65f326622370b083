"""Registry API: names, info, options, and the errors for bad names, shapes and options."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import dpfl.models as models_pkg
from dpfl.models import MODELS, ModelInfo, build_model, count_parameters, model_info

EXPECTED_NAMES = {
    "logr",
    "mlp2",
    "relu_mlp",
    "cnn_pfa",
    "cnn_rhdp",
    "cnn_mnist_dp",
    "cnn_mnist_splitting",
    "cnn_digits",
    "cnn_digits_nobias",
    "lenet5",
    "dlg_lenet",
    "resnet18_gn",
    "resnet_small_gn",
    "mpdp_mlp",
    "mpdp_cnn",
    "mpdp_resnet",
}


def test_package_exports():
    for attr in ("build_model", "MODELS", "model_info", "count_parameters"):
        assert hasattr(models_pkg, attr)
        assert attr in models_pkg.__all__


def test_registered_names():
    assert set(MODELS) == EXPECTED_NAMES


def test_models_mapping_is_read_only_and_builds_like_build_model():
    with pytest.raises(TypeError):
        MODELS["new"] = lambda *a: None  # type: ignore[index]
    a = MODELS["cnn_digits"]((1, 8, 8), 10, seed=3)
    b = build_model("cnn_digits", (1, 8, 8), 10, seed=3)
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb and torch.equal(pa, pb)


@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
def test_model_info_is_consistent_with_the_model(name):
    info = model_info(name)
    assert isinstance(info, ModelInfo) and info.name == name
    assert info.loss in ("cross_entropy", "nll", "mse_onehot")
    assert info.inits[:2] == ("default", info.default_init)
    # every model takes Keras' init but MP-DP's networks, which take only their own (their runs' shared start)
    assert "keras" in info.inits or info.inits == ("default", "mpdp")
    assert next(build_model(name, info.small_shape, 7).parameters()).dtype == (info.dtype or torch.get_default_dtype())
    model = build_model(name, info.small_shape, 7, seed=0)
    assert type(model).loss_kind == info.loss
    assert model.head_name == info.head
    head = model.get_submodule(info.head)
    assert isinstance(head, nn.Linear) and head.out_features == 7
    # The reference setting of the spec gives the reference parameter count.
    ref = build_model(name, info.reference_shape, info.reference_classes, seed=0)
    assert count_parameters(ref) == info.reference_params
    with pytest.raises(TypeError):
        info.options["x"] = 1  # type: ignore[index]


def test_loss_kinds():
    kinds = {n: model_info(n).loss for n in MODELS}
    assert kinds["cnn_mnist_splitting"] == "nll"
    mse = ("relu_mlp", "cnn_digits_nobias", "mpdp_mlp", "mpdp_cnn", "mpdp_resnet")
    assert {kinds[n] for n in mse} == {"mse_onehot"}
    assert {k for n, k in kinds.items() if n not in ("cnn_mnist_splitting", *mse)} == {"cross_entropy"}


def test_stochastic_flag_matches_dropout_layers():
    for name in MODELS:
        info = model_info(name)
        model = build_model(name, info.small_shape, 10, seed=0)
        has_dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())
        assert has_dropout == info.stochastic, name


def test_unknown_model_name():
    with pytest.raises(ValueError, match=r"unknown model 'resnet50'.*available:.*logr"):
        build_model("resnet50", (3, 32, 32), 10)
    with pytest.raises(ValueError, match="unknown model"):
        model_info("nope")


@pytest.mark.parametrize(
    ("name", "shape", "pattern"),
    [
        ("cnn_pfa", (784,), r"model 'cnn_pfa' cannot take input shape \(784,\).*\(C, H, W\).*accepts"),
        ("cnn_rhdp", (28, 28), r"'cnn_rhdp'.*\(28, 28\).*\(C, H, W\)"),
        ("lenet5", (1, 8, 8), r"'lenet5'.*\(1, 8, 8\).*conv2.*window.*accepts.*\(3, 32, 32\)"),
        ("cnn_pfa", (1, 8, 8), r"'cnn_pfa'.*\(1, 8, 8\).*conv2.*spatial size 3"),
        ("cnn_mnist_splitting", (1, 8, 8), r"'cnn_mnist_splitting'.*\(1, 8, 8\)"),
        ("resnet18_gn", (3, 32), r"'resnet18_gn'.*\(3, 32\).*accepts"),
        ("resnet_small_gn", (3, 32, 32, 1), r"'resnet_small_gn'"),
        ("logr", (0, 5), r"'logr'.*\(0, 5\).*at least 1"),
        ("mlp2", (), r"'mlp2'.*\(\)"),
        ("cnn_digits", (1, 0, 8), r"'cnn_digits'.*\(1, 0, 8\)"),
    ],
)
def test_incompatible_input_shapes(name, shape, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_model(name, shape, 10)


def test_input_shape_must_be_ints():
    with pytest.raises(ValueError, match="input_shape must be a tuple of ints"):
        build_model("logr", (1.0, 28, 28), 10)
    with pytest.raises(ValueError, match="input_shape must be a tuple of ints"):
        build_model("logr", 784, 10)
    # torch.Size, lists and numpy integers are fine
    model = build_model("logr", tuple(np.array([2, 3])), np.int64(4), seed=np.int64(1))
    assert count_parameters(model) == 28
    assert count_parameters(build_model("logr", torch.Size([784]), 10)) == 7850
    assert count_parameters(build_model("logr", [1, 28, 28], 10)) == 7850


@pytest.mark.parametrize(
    ("name", "options", "pattern"),
    [
        ("mlp2", {"hiden": 32}, r"'mlp2'.*unknown option.*hiden.*accepts.*dropout.*hidden.*init"),
        ("cnn_pfa", {"dropout": 0.1}, r"'cnn_pfa'.*unknown option"),
        ("mlp2", {"dropout": 1.5}, r"'mlp2'.*dropout must be a number in \[0, 1\)"),
        ("mlp2", {"hidden": 0}, r"'mlp2'.*hidden must be a positive integer"),
        ("relu_mlp", {"hidden": "64"}, r"'relu_mlp'.*hidden must be a sequence"),
        ("relu_mlp", {"hidden": (64, -1)}, r"'relu_mlp'.*positive integer"),
        ("relu_mlp", {"bias": "false"}, r"'relu_mlp'.*bias must be true or false"),
        ("resnet_small_gn", {"depth": 21}, r"depth must be 6n \+ 2"),
        ("resnet_small_gn", {"shortcut": "conv"}, r"shortcut must be 'pad' or 'projection'"),
        ("resnet18_gn", {"norm_groups": 3}, r"'resnet18_gn'.*norm_groups=3 must divide"),
        ("cnn_pfa", {"init": "zeros"}, r"'cnn_pfa'.*unknown init 'zeros'.*allowed"),
        ("logr", {"init": "glorot"}, r"'logr'.*unknown init 'glorot'"),
    ],
)
def test_bad_options(name, options, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_model(name, model_info(name).small_shape, 10, **options)


@pytest.mark.parametrize("n_classes", [0, -3, 2.0, True])
def test_bad_n_classes(n_classes):
    with pytest.raises(ValueError, match=r"'logr'.*n_classes must be a positive integer"):
        build_model("logr", (4,), n_classes)


@pytest.mark.parametrize("seed", [-1, 1.5, "0"])
def test_bad_seed(seed):
    with pytest.raises(ValueError, match=r"'logr'.*seed must be a non-negative integer"):
        build_model("logr", (4,), 2, seed=seed)


def test_count_parameters_counts_trainable_only():
    model = build_model("cnn_rhdp", (1, 28, 28), 10, seed=0)
    assert count_parameters(model) == 28_938
    model.conv1.weight.requires_grad_(False)
    assert count_parameters(model) == 28_938 - 16 * 25

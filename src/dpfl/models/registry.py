"""The model registry: every architecture of the specs, by name.

    model = build_model("cnn_pfa", (1, 28, 28), 10, seed=0, init="keras")
    model_info("cnn_pfa").loss          # "cross_entropy"
    count_parameters(model)             # 26010

Contracts every registered model keeps (the engine runs many clients at once with
`torch.func.functional_call` + `vmap`, over stacked parameters and over samples):

* input is a batch ``[B, *input_shape]``; output is ``[B, n_classes]``: logits, except
  `cnn_mnist_splitting`, which outputs log-probabilities (loss ``"nll"``). The loss each model is trained
  with is `ModelInfo.loss` (also the class attribute ``loss_kind``), one of ``"cross_entropy"``,
  ``"nll"``, ``"mse_onehot"`` (the names of `dpfl.engine.losses`);
* no BatchNorm, no buffers, no in-place operations, no data-dependent Python control flow;
  per-sample gradients with ``vmap(grad(...))`` equal those computed one sample at a time;
* dropout layers (`mlp2`, `cnn_mnist_splitting`; `ModelInfo.stochastic`) are active in ``train()`` mode
  and draw from torch's global RNG; under `vmap` use ``randomness="different"``, or call ``eval()``;
* initialisation is explicit (see `dpfl.models.initialization`): the module is constructed on the
  ``meta`` device and every parameter is then drawn under the model's scheme from
  ``dpfl.seeding.torch_generator(seed, Purpose.INIT)`` when `seed` is given (same seed, same weights;
  the global RNG is neither read nor advanced), or from the global RNG when `seed` is None;
* parameters are in torch's default dtype unless `ModelInfo.dtype` names one (MP-DP's networks, ``mpdp_*``, are
  float64: their recovery is checked to 1e-10); inputs must be of the parameters' dtype.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import torch
from torch import nn

from dpfl.models import cnn, lenet, linear, mlp, mpdp_networks, resnet
from dpfl.models._geometry import ShapeError
from dpfl.models.initialization import init_parameters
from dpfl.seeding import Purpose, torch_generator

LossKind = Literal["cross_entropy", "nll", "mse_onehot"]

_IMAGE = "(C, H, W) images whose size fits every layer's window"
_ANY = "any shape with positive dimensions (flattened to one feature vector per sample)"


@dataclass(frozen=True)
class ModelInfo:
    """What a registered model is and how to use it.

    `reference_shape`, `reference_classes` and `reference_params` are the spec's setting and the
    parameter count it gives there. `small_shape` is a cheap input the model accepts (used by tests
    and smoke runs). `head` is the name of the output layer under the default options (CENTAUR-style
    splits, last-layer methods); a built model's own ``head_name`` attribute is always right.
    `options` maps each builder option to its default (`init` and `seed` are accepted by all models).
    `inits` lists the accepted ``init`` values; `stochastic` says the default build has dropout. `dtype` is the
    dtype `build_model` gives the parameters (None: torch's default dtype).
    """

    name: str
    description: str
    spec: str
    loss: LossKind
    accepts: str
    input_rank: int | None
    reference_shape: tuple[int, ...]
    reference_classes: int
    reference_params: int
    small_shape: tuple[int, ...]
    head: str
    default_init: str
    inits: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    stochastic: bool = False
    dtype: torch.dtype | None = None


@dataclass(frozen=True)
class _Entry:
    info: ModelInfo
    builder: Callable[..., nn.Module]
    user: bool = False  # registered with `register_model`: built by its own code under a seeded RNG


def _info(**kw: Any) -> ModelInfo:
    # `inits`: the schemes accepted besides "default" and the model's own (torch's and Keras' unless it says).
    default_init = kw.setdefault("default_init", "torch")
    kw["inits"] = tuple(dict.fromkeys(("default", default_init, *kw.get("inits", ("torch", "keras")))))
    kw["options"] = MappingProxyType(dict(kw.get("options", {})))
    return ModelInfo(**kw)


_ENTRIES: dict[str, _Entry] = {}


def _register(builder: Callable[..., nn.Module], **kw: Any) -> None:
    info = _info(**kw)
    _ENTRIES[info.name] = _Entry(info, builder)


_register(
    linear.build_logr,
    name="logr",
    description="multinomial logistic regression: Flatten -> Linear(d, n_classes), zero init",
    spec="heterogeneous_dp.md §7.1",
    loss="cross_entropy",
    accepts=_ANY,
    input_rank=None,
    reference_shape=(1, 28, 28),
    reference_classes=10,
    reference_params=7_850,
    small_shape=(1, 8, 8),
    head="fc",
    default_init="zeros",
    options={"bias": True},
)
_register(
    mlp.build_mlp2,
    name="mlp2",
    description="FedCEO MLP-2-Layers: Linear(d, 64) -> Dropout(0.5) -> ReLU -> Linear(64, n), no biases",
    spec="fedceo.md §5",
    loss="cross_entropy",
    accepts=_ANY,
    input_rank=None,
    reference_shape=(1, 28, 28),
    reference_classes=10,
    reference_params=50_816,
    small_shape=(1, 8, 8),
    head="fc2",
    options={"hidden": 64, "dropout": 0.5},
    stochastic=True,
)
_register(
    mlp.build_relu_mlp,
    name="relu_mlp",
    description="bias-free ReLU MLP (ReLU after every layer but the last), MSE on one-hot targets",
    spec="bidirectional.md §7.1, §11 ci_digits_mlp (64-64-32-10)",
    loss="mse_onehot",
    accepts=_ANY,
    input_rank=None,
    reference_shape=(1, 8, 8),
    reference_classes=10,
    reference_params=6_464,
    small_shape=(1, 8, 8),
    head="fc3",
    options={"hidden": (64, 32), "bias": False},
)
_register(
    cnn.build_cnn_pfa,
    name="cnn_pfa",
    description="PFA 2-layer CNN (tensorflow-privacy tutorial model); PFA configs use init='keras'",
    spec="heterogeneous_dp.md §7.1",
    loss="cross_entropy",
    accepts=_IMAGE + "; the spec's shape is (1, 28, 28)",
    input_rank=3,
    reference_shape=(1, 28, 28),
    reference_classes=10,
    reference_params=26_010,
    small_shape=(1, 28, 28),
    head="fc2",
)
for _name, _spec in (
    ("cnn_rhdp", "heterogeneous_dp.md §7.1 (thesis Table B.1)"),
    ("cnn_mnist_dp", "clustered_dpfl.md §8 (same network as cnn_rhdp)"),
):
    _register(
        cnn.build_cnn_rhdp,
        name=_name,
        description="conv(16, 5x5)-pool-conv(32, 5x5)-pool-linear CNN",
        spec=_spec,
        loss="cross_entropy",
        accepts=_IMAGE + "; the spec's shape is (1, 28, 28)",
        input_rank=3,
        reference_shape=(1, 28, 28),
        reference_classes=10,
        reference_params=28_938,
        small_shape=(1, 28, 28),
        head="fc",
    )
_register(
    cnn.build_cnn_mnist_splitting,
    name="cnn_mnist_splitting",
    description="operator-splitting reference MNIST CNN with Dropout2d; outputs log_softmax (NLL loss)",
    spec="operator_splitting.md §10",
    loss="nll",
    accepts=_IMAGE + "; the spec's shape is (1, 28, 28)",
    input_rank=3,
    reference_shape=(1, 28, 28),
    reference_classes=10,
    reference_params=11_910,
    small_shape=(1, 28, 28),
    head="fc2",
    options={"dropout": 0.5},
    stochastic=True,
)
_register(
    cnn.build_cnn_digits,
    name="cnn_digits",
    description="conv(8, 3x3, pad 1)-ReLU-maxpool-linear CNN for 1x8x8 digits",
    spec="clustered_dpfl.md §8",
    loss="cross_entropy",
    accepts=_IMAGE + "; meant for (1, 8, 8) digits",
    input_rank=3,
    reference_shape=(1, 8, 8),
    reference_classes=10,
    reference_params=1_370,
    small_shape=(1, 8, 8),
    head="fc",
)
_register(
    cnn.build_cnn_digits_nobias,
    name="cnn_digits_nobias",
    description="bias-free conv(8)-maxpool-conv(16)-linear CNN, MSE on one-hot targets",
    spec="bidirectional.md §11 ci_digits_cnn",
    loss="mse_onehot",
    accepts=_IMAGE + "; meant for (1, 8, 8) digits",
    input_rank=3,
    reference_shape=(1, 8, 8),
    reference_classes=10,
    reference_params=3_784,
    small_shape=(1, 8, 8),
    head="fc",
    options={"bias": False},
)
_register(
    lenet.build_lenet5,
    name="lenet5",
    description="FedCEO LeNet-5: conv(32, 5)-pool-conv(64, 5)-pool-fc 512-fc 512-fc, ReLU after convs",
    spec="fedceo.md §5",
    loss="cross_entropy",
    accepts=_IMAGE + "; the spec's shape is (3, 32, 32)",
    input_rank=3,
    reference_shape=(3, 32, 32),
    reference_classes=10,
    reference_params=1_141_194,
    small_shape=(3, 32, 32),
    head="fc3",
)
_register(
    lenet.build_dlg_lenet,
    name="dlg_lenet",
    description="DLG attack's sigmoid LeNet (12-channel convs, fc 768 -> n), U(-0.5, 0.5) init",
    spec="fedceo.md §8",
    loss="cross_entropy",
    accepts=_IMAGE + "; the spec's shape is (3, 32, 32)",
    input_rank=3,
    reference_shape=(3, 32, 32),
    reference_classes=10,
    reference_params=15_826,
    small_shape=(3, 32, 32),
    head="fc",
    default_init="dlg",
)
_register(
    resnet.build_resnet18_gn,
    name="resnet18_gn",
    description="torchvision ResNet-18 layout (ImageNet stem) with GroupNorm(2, C) for BatchNorm",
    spec="clustered_dpfl.md §8",
    loss="cross_entropy",
    accepts="(C, H, W) images (any C; CIFAR 3x32x32 or ImageNet 3x224x224 sizes)",
    input_rank=3,
    reference_shape=(3, 32, 32),
    reference_classes=10,
    reference_params=11_181_642,
    small_shape=(3, 32, 32),
    head="fc",
    default_init="torchvision",
    options={"norm_groups": 2},
)
_register(
    resnet.build_resnet_small_gn,
    name="resnet_small_gn",
    description="CIFAR ResNet-(6n+2) (default ResNet-20, 3x3 stem, no max-pool) with GroupNorm(2, C)",
    spec="dpfl choice (He et al. 2016 §4.2 CIFAR ResNet)",
    loss="cross_entropy",
    accepts="(C, H, W) images (any C; meant for 3x32x32)",
    input_rank=3,
    reference_shape=(3, 32, 32),
    reference_classes=10,
    reference_params=269_722,
    small_shape=(3, 8, 8),
    head="fc",
    default_init="torchvision",
    options={"depth": 20, "norm_groups": 2, "shortcut": "pad"},
)
# MP-DP's networks: float64, and only MP-DP's own initialisation (the one every run of its comparison starts from).
_MPDP = dict(loss="mse_onehot", default_init="mpdp", inits=(), dtype=torch.float64)
_register(
    mpdp_networks.build_mpdp_mlp,
    name="mpdp_mlp",
    description="MP-DP's ReLU MLP (ReLU after every layer but the last, no biases by default), float64, MSE on one-hot",
    spec="bidirectional.md §11 ci_digits_mlp (64-64-32-10)",
    accepts=_ANY,
    input_rank=None,
    reference_shape=(1, 8, 8),
    reference_classes=10,
    reference_params=6_464,
    small_shape=(1, 8, 8),
    head="fc3",
    options={"hidden": (64, 32), "bias": False},
    **_MPDP,
)
_register(
    mpdp_networks.build_mpdp_cnn,
    name="mpdp_cnn",
    description="MP-DP's conv(8)-maxpool-conv(16)-linear CNN (no biases by default), float64, MSE on one-hot targets",
    spec="bidirectional.md §11 ci_digits_cnn",
    accepts=_IMAGE + "; meant for (1, 8, 8) digits",
    input_rank=3,
    reference_shape=(1, 8, 8),
    reference_classes=10,
    reference_params=3_784,
    small_shape=(1, 8, 8),
    head="fc",
    options={"bias": False},
    **_MPDP,
)
_register(
    mpdp_networks.build_mpdp_resnet,
    name="mpdp_resnet",
    description="MP-DP's norm-free ResNet of tied residual blocks (experimental), float64, MSE on one-hot targets",
    spec="bidirectional.md §11 full configs (ResNet20 shape), §7.4",
    accepts="square (C, H, W) images",
    input_rank=3,
    reference_shape=(3, 32, 32),
    reference_classes=10,
    reference_params=314_416,
    small_shape=(3, 8, 8),
    head="fc",
    options={"widths": (16, 32, 64), "blocks": 3, "bias": False},
    **_MPDP,
)


def _entry(name: str) -> _Entry:
    try:
        return _ENTRIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; available: {sorted(_ENTRIES)}") from None


def model_info(name: str) -> ModelInfo:
    """The `ModelInfo` of registered model `name` (ValueError if unknown)."""
    return _entry(name).info


def _as_int(value: object) -> int | None:
    """`value` as an int if it is an integer (Python, numpy or 0-d torch integer; not bool), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _as_shape(name: str, input_shape: object) -> tuple[int, ...]:
    try:
        dims = tuple(_as_int(d) for d in input_shape)  # type: ignore[union-attr]
    except TypeError:
        dims = (None,)
    if any(d is None for d in dims):
        raise ValueError(
            f"model {name!r}: input_shape must be a tuple of ints (one sample, no batch axis), "
            f"got {input_shape!r}"
        )
    return dims  # type: ignore[return-value]


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    n_classes: int,
    seed: int | None = None,
    **options: Any,
) -> nn.Module:
    """Build registered model `name` for samples of `input_shape` (no batch axis) and `n_classes` outputs.

    `options` are the model's `ModelInfo.options` plus ``init``: ``"default"`` (the model's
    `ModelInfo.default_init`), ``"torch"`` (PyTorch's defaults), ``"keras"`` (Glorot-uniform weights,
    zero biases), or the model's own default scheme. With `seed`, weights come from
    ``torch_generator(seed, Purpose.INIT)`` only; without, from the global torch RNG.

    Returns a CPU module in training mode, in `ModelInfo.dtype` (torch's default dtype unless the model names one);
    move or cast it as needed.
    Raises ValueError for an unknown name, an input shape the model cannot take (naming the model, the
    shape and what it accepts), a bad `n_classes`, or unknown / invalid options.
    """
    entry = _entry(name)
    info = entry.info
    shape = _as_shape(name, input_shape)
    classes = _as_int(n_classes)
    if classes is None or classes < 1:
        raise ValueError(f"model {name!r}: n_classes must be a positive integer, got {n_classes!r}")
    seed_ = None if seed is None else _as_int(seed)
    if seed is not None and (seed_ is None or seed_ < 0):
        raise ValueError(f"model {name!r}: seed must be a non-negative integer or None, got {seed!r}")
    if entry.user:
        return _build_user_model(entry, shape, classes, seed_, options)
    init = options.pop("init", "default")
    if init not in info.inits:
        raise ValueError(f"model {name!r}: unknown init {init!r}; allowed: {list(info.inits)}")
    scheme = info.default_init if init == "default" else init
    unknown = sorted(set(options) - set(info.options))
    if unknown:
        raise ValueError(
            f"model {name!r}: unknown option(s) {unknown}; it accepts {sorted(info.options) + ['init']}"
        )
    try:
        # Construct without values or random draws, then give every parameter its value below.
        with torch.device("meta"):
            model = entry.builder(shape, classes, **options)
            if info.dtype is not None:
                model = model.to(dtype=info.dtype)
    except ShapeError as err:
        raise ValueError(
            f"model {name!r} cannot take input shape {shape}: {err}. It accepts {info.accepts}."
        ) from None
    except ValueError as err:
        raise ValueError(f"model {name!r}: {err}") from None
    model = model.to_empty(device="cpu")
    generator = torch_generator(seed_, Purpose.INIT) if seed_ is not None else None
    return init_parameters(model, scheme, generator)


def _build_user_model(entry: _Entry, shape: tuple[int, ...], classes: int, seed: int | None,
                      options: dict[str, Any]) -> nn.Module:
    """A `register_model` builder's module, its random draws seeded from the run seed (global RNG untouched)."""
    name = entry.info.name
    if options.pop("init", "default") != "default":
        raise ValueError(f"model {name!r} is initialised by its own builder: init must be 'default'")
    unknown = sorted(set(options) - set(entry.info.options))
    if unknown:
        raise ValueError(f"model {name!r}: unknown option(s) {unknown}; it accepts {sorted(entry.info.options)}")
    kwargs = {**entry.info.options, **options}
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=torch_generator(seed, Purpose.INIT))))
        try:
            model = entry.builder(shape, classes, **kwargs)
        except (TypeError, ValueError) as err:
            raise ValueError(f"model {name!r} could not be built for input shape {shape} and {classes} classes: "
                             f"{err}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"model {name!r}: its builder must return a torch.nn.Module, got {type(model).__name__}")
    model.loss_kind = entry.info.loss  # type: ignore[assignment]
    return model.to("cpu").train()


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalar parameters of `model`."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _builder_for(name: str) -> Callable[..., nn.Module]:
    def build(
        input_shape: tuple[int, ...], n_classes: int, seed: int | None = None, **options: Any
    ) -> nn.Module:
        return build_model(name, input_shape, n_classes, seed=seed, **options)

    build.__name__ = f"build_{name}"
    build.__qualname__ = build.__name__
    build.__doc__ = f"`build_model({name!r}, ...)`: {_ENTRIES[name].info.description}."
    return build


_BUILDERS: dict[str, Callable[..., nn.Module]] = {n: _builder_for(n) for n in _ENTRIES}
MODELS: Mapping[str, Callable[..., nn.Module]] = MappingProxyType(_BUILDERS)
"""Registered names -> builders with `build_model`'s signature minus the name (read-only; includes the models
registered with `register_model`)."""
BUILTIN_MODELS: tuple[str, ...] = tuple(_ENTRIES)


def register_model(name: str, builder: Callable[..., nn.Module], *, loss: LossKind | str = "cross_entropy",
                   description: str = "", head: str | None = None, options: Mapping[str, Any] | None = None,
                   replace: bool = False) -> None:
    """Make ``builder(input_shape, n_classes, **options) -> nn.Module`` available as model `name`.

    Configs then use ``model: {name: ..., options: {...}}``. `loss` is a name in `dpfl.engine.losses.LOSSES`
    (see `register_loss` there); `head` names the output layer's module (CENTAUR-style private heads);
    `options` maps each builder option to its default. The builder runs under a torch RNG seeded from the run
    seed (same seed, same weights; the global RNG is left as it was). The engine's contract applies: no
    buffers (BatchNorm breaks per-sample gradients, hence DP-SGD), no in-place ops on inputs, vmap-safe.
    """
    from dpfl.engine.losses import LOSSES

    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a model name must be an identifier (letters, digits, _), got {name!r}")
    if name in BUILTIN_MODELS or name == "provided":
        raise ValueError(f"{name!r} is a built-in model name; choose another name")
    if name in _ENTRIES and not replace:
        raise ValueError(f"model {name!r} is already registered; pass replace=True to replace it")
    if not callable(builder):
        raise ValueError(f"builder must be callable, got {type(builder).__name__}")
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; allowed: {sorted(LOSSES)} (register one with register_loss)")
    info = ModelInfo(
        name=name, description=description or f"user-registered model {name!r}", spec="user-registered",
        loss=loss, accepts="what its builder accepts", input_rank=None, reference_shape=(), reference_classes=0,
        reference_params=0, small_shape=(), head=head or "", default_init="builder", inits=("default",),
        options=MappingProxyType(dict(options or {})),
    )
    _ENTRIES[name] = _Entry(info, builder, user=True)
    _BUILDERS[name] = _builder_for(name)

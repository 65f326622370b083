"""Fully connected networks: `mlp2` (FedCEO, fedceo.md §5) and `relu_mlp` (bidirectional.md §7.1)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

from torch import nn

from dpfl.models._geometry import flat_size
from dpfl.models._options import dropout_rate, flag, positive_int


class MLP2(nn.Sequential):
    """FedCEO's "MLP-2-Layers": Flatten -> fc1 Linear(d, 64, bias=False) -> Dropout(0.5) -> ReLU ->
    fc2 Linear(64, n_classes, bias=False).

    Logits, cross-entropy (the paper's final softmax is absorbed into the loss). 50,816 parameters
    for 784 -> 10, 51,840 for 26 classes. CENTAUR's split: representation = `fc1` (+dropout, ReLU),
    head = `fc2`. With `dropout=0` the dropout layer is an `nn.Identity` (the model is deterministic).
    In training mode the dropout draws from torch's global RNG; under `torch.func.vmap` call it with
    ``randomness="different"`` (per-sample or per-client masks).
    """

    loss_kind: ClassVar[str] = "cross_entropy"
    head_name: ClassVar[str] = "fc2"

    def __init__(self, in_features: int, n_classes: int, hidden: int = 64, dropout: float = 0.5) -> None:
        super().__init__(
            OrderedDict(
                flatten=nn.Flatten(start_dim=1),
                fc1=nn.Linear(in_features, hidden, bias=False),
                dropout=nn.Dropout(dropout) if dropout > 0 else nn.Identity(),
                relu=nn.ReLU(),
                fc2=nn.Linear(hidden, n_classes, bias=False),
            )
        )


class ReluMLP(nn.Sequential):
    """Flatten -> fc1 -> ReLU -> ... -> fcL: ReLU after every layer but the last, no biases by default.

    The MP-DP model of bidirectional.md §7.1 (trained with MSE on one-hot targets, ½‖y − ȳ‖²). It is
    a plain `nn.Sequential` of Flatten / Linear / ReLU so a factor plan can walk it. `hidden=(64, 32)`
    on 64 features and 10 classes is the spec's ``ci_digits_mlp`` "64-64-32-10" network (6,464
    parameters).
    """

    loss_kind: ClassVar[str] = "mse_onehot"
    head_name: str  # "fc{L}", set per instance

    def __init__(
        self, in_features: int, n_classes: int, hidden: Sequence[int] = (64, 32), bias: bool = False
    ) -> None:
        layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten(start_dim=1))
        widths = [in_features, *hidden, n_classes]
        for i in range(len(widths) - 1):
            layers[f"fc{i + 1}"] = nn.Linear(widths[i], widths[i + 1], bias=bias)
            if i < len(widths) - 2:
                layers[f"relu{i + 1}"] = nn.ReLU()
        super().__init__(layers)
        self.head_name = f"fc{len(widths) - 1}"


def build_mlp2(
    input_shape: tuple[int, ...], n_classes: int, *, hidden: int = 64, dropout: float = 0.5
) -> MLP2:
    return MLP2(
        flat_size(input_shape),
        n_classes,
        hidden=positive_int(hidden, "hidden"),
        dropout=dropout_rate(dropout),
    )


def build_relu_mlp(
    input_shape: tuple[int, ...],
    n_classes: int,
    *,
    hidden: Sequence[int] | int = (64, 32),
    bias: bool = False,
) -> ReluMLP:
    if isinstance(hidden, int) and not isinstance(hidden, bool):
        hidden = (hidden,)
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise ValueError(f"hidden must be a sequence of positive integers, got {hidden!r}")
    widths = tuple(positive_int(h, "each hidden width") for h in hidden)
    return ReluMLP(flat_size(input_shape), n_classes, hidden=widths, bias=flag(bias, "bias"))

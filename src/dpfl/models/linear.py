"""Linear models: `logr`, the multinomial logistic regression of PFA (heterogeneous_dp.md §7.1)."""

from __future__ import annotations

from collections import OrderedDict
from typing import ClassVar

from torch import nn

from dpfl.models._geometry import flat_size
from dpfl.models._options import flag


class LogisticRegression(nn.Sequential):
    """Flatten -> Linear(d, n_classes); logits, trained with cross-entropy.

    On 784 features and 10 classes: 2 tensors (`fc.weight`, `fc.bias`), 7,850 parameters. The PFA
    code's double softmax is not replicated (spec §9.16). Its registry default init is all zeros.
    """

    loss_kind: ClassVar[str] = "cross_entropy"
    head_name: ClassVar[str] = "fc"

    def __init__(self, in_features: int, n_classes: int, bias: bool = True) -> None:
        super().__init__(
            OrderedDict(
                flatten=nn.Flatten(start_dim=1),
                fc=nn.Linear(in_features, n_classes, bias=bias),
            )
        )


def build_logr(input_shape: tuple[int, ...], n_classes: int, *, bias: bool = True) -> LogisticRegression:
    return LogisticRegression(flat_size(input_shape), n_classes, bias=flag(bias, "bias"))

"""Evaluation of one model (a parameter dict) on a test set, in batches.

The model runs where its parameters are: each batch of records is moved there (a no-op on the CPU), so a test
set may stay on the CPU while a CUDA run evaluates.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.func import functional_call

from dpfl.engine.losses import per_sample_loss


@torch.no_grad()
def outputs(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor,
            batch_size: int = 2048) -> torch.Tensor:
    """`model`'s outputs with `params` on `x`, in batches, in eval mode (restored after): what anyone holding the
    released model can compute (the attacks' view of it)."""
    was_training = model.training
    model.eval()
    device = _device(params)
    try:
        return torch.cat([functional_call(model, dict(params), (x[lo : lo + batch_size].to(device),)).to(x.device)
                          for lo in range(0, len(x), batch_size)])
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
             loss: str = "cross_entropy", batch_size: int = 2048) -> tuple[float | None, float | None]:
    """(accuracy, mean loss) of `model` with `params`; accuracy is None for regression losses."""
    if len(x) == 0:
        return None, None
    loss_fn = per_sample_loss(loss)
    correct, total_loss = 0, 0.0
    classify = loss != "mse"
    device = _device(params)
    for lo in range(0, len(x), batch_size):
        xb, yb = x[lo : lo + batch_size].to(device), y[lo : lo + batch_size].to(device)
        out = functional_call(model, dict(params), (xb,))
        total_loss += float(loss_fn(out, yb).sum())
        if classify:
            correct += int((out.argmax(-1) == yb).sum())
    n = len(x)
    return (correct / n if classify else None), total_loss / n


def _device(params: Mapping[str, torch.Tensor]) -> torch.device:
    """Where the parameters are (the CPU for an empty dict)."""
    return next(iter(params.values())).device if params else torch.device("cpu")

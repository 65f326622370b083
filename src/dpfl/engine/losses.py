"""Per-sample losses by name, so models declare which loss they are trained with."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y, reduction="none")


def _nll(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.nll_loss(out, y, reduction="none")


def _mse_onehot(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """0.5 * ||out - onehot(y)||^2 (the bidirectional spec's loss); one-hot by comparison, which vmap supports."""
    onehot = (y.unsqueeze(-1) == torch.arange(out.shape[-1], device=y.device)).to(out.dtype)
    return 0.5 * (out - onehot).pow(2).sum(-1)


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (out.reshape(y.shape) - y).pow(2)


LOSSES: dict[str, LossFn] = {
    "cross_entropy": _cross_entropy,
    "nll": _nll,
    "mse_onehot": _mse_onehot,
    "mse": _mse,
}


def register_loss(name: str, fn: LossFn, *, replace: bool = False) -> None:
    """Make ``fn(output [B, ...], target [B]) -> loss [B]`` (one value per sample, no reduction) loss `name`.

    The engine computes per-sample gradients of it under vmap, so it must be written with batch-safe torch
    operations (no `.item()`, no data-dependent Python control flow).
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a loss name must be an identifier, got {name!r}")
    if name in LOSSES and not replace:
        raise ValueError(f"loss {name!r} is already registered; pass replace=True to replace it")
    if not callable(fn):
        raise ValueError(f"a loss must be callable, got {type(fn).__name__}")
    LOSSES[name] = fn


def per_sample_loss(name: str) -> LossFn:
    """The loss `name` returning one value per sample (no reduction)."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; allowed: {sorted(LOSSES)}") from None

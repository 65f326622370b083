"""A model's tensors as one vector and back, and its L2 norm (MP-DP's uploads are lists of float64 tensors in the
FactorPlan's order)."""

from __future__ import annotations

import torch


def norm(ts: list[torch.Tensor]) -> float:
    return float(torch.sqrt(sum((t**2).sum() for t in ts)))


def flat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


def unflat(v: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, i = [], 0
    for t in like:
        out.append(v[i:i + t.numel()].reshape(t.shape))
        i += t.numel()
    return out


def clip_factor(norm_: float, bound: float) -> float:
    """min(1, bound / norm): the scale that brings a vector of norm `norm_` within `bound`."""
    return min(1.0, bound / norm_) if norm_ > 0 else 1.0

"""Adaptive demasking (spec bidirectional.md §10, W3): a client removes MP-DP's model hiding with its own labels.

The perturbed model outputs ŷ(x) = y(x) + α(x) r with α(x) computable by the client and r the server's secret
mask. With labelled data (x, ȳ) the client fits r̂ = argmin_r Σ‖ŷ(x) - α(x) r - ȳ(x)‖², i.e. per output
r̂_i = Σ α (ŷ_i - ȳ_i) / Σ α². Folding the transitional layers and subtracting r̂ α from the last layer gives an
ordinary network that computes y(x) + α(x)(r - r̂): with teacher targets (ȳ = y) it is the true function exactly,
with one-hot labels an estimate whose accuracy the report states.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpfl.algorithms.secure.mpdp.perturb import forward
from dpfl.algorithms.secure.mpdp.views import ClientView


@dataclass
class Demasked:
    r_hat: torch.Tensor
    params: list[torch.Tensor]  # an ordinary network for the view's plan (no transitional layers)
    shortcuts: tuple[torch.Tensor, ...] = ()  # its residual shortcuts' diagonals (not identities: W3 folding)

    def predict(self, x: torch.Tensor, view: ClientView) -> torch.Tensor:
        out, _ = forward(self.params, None, x.to(torch.float64), view.plan, self.shortcuts or None)
        return out


def estimate_mask(view: ClientView, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Least squares r̂ from the client's data (targets: one-hot labels, or a teacher's outputs)."""
    y_hat, alpha = view.outputs(x)
    return (alpha[:, None] * (y_hat - targets.to(torch.float64))).sum(0) / (alpha**2).sum()


def demask(view: ClientView, x: torch.Tensor, targets: torch.Tensor) -> Demasked:
    """r̂ and the folded network with r̂ α(x) removed from its output."""
    r_hat = estimate_mask(view, x, targets)
    params = view.folded()
    plan = view.plan
    last = [i for i, (layer, _) in enumerate(plan.params()) if layer == plan.layers - 1]
    w = last[0]
    params[w] = params[w] - r_hat[:, None] * view.alpha_weights()[None, :]
    if len(last) == 2:  # α carries +1 for the last bias
        params[last[1]] = params[last[1]] - r_hat
    return Demasked(r_hat, params, view.folded_shortcuts())

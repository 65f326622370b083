"""The oracle aggregator: weights ∝ 1/σ_i² from each client's *true* update-noise variance.

σ_i² = T_i · η² · p · C² · z_i² / b_i² (spec heterogeneous_dp §4.5, all-clipped regime), so the
weights minimise the aggregated noise Σ w_i² σ_i² subject to Σ w_i = 1. It needs the true noise
multipliers, which a real server does not have: it is *privileged*, reads the engine's diagnostics
channel, and any run using it is labelled an oracle (an upper reference, not a deployable method).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
from dpfl.engine import params as P


@dataclass(frozen=True)
class NoiseChannel:
    """Engine-only facts per selected client: local steps, noise multiplier, clip, learning rate."""

    steps: torch.Tensor  # int64 [K]
    noise_multipliers: torch.Tensor  # float64 [K]
    clip: float
    lr: float

    def update_noise_variance(self, view: ServerView, dim: int) -> torch.Tensor:
        """σ_i² = T_i η² p C² z_i² / b_i²: the expected squared norm of the noise in client i's update."""
        b = view.batch_sizes.to(torch.float64)
        scale = torch.tensor(self.lr * self.clip, dtype=torch.float64) ** 2 * dim  # in torch: overflows to inf
        return self.steps.to(torch.float64) * scale * self.noise_multipliers**2 / b**2


@dataclass(frozen=True)
class OracleAverage(ServerStep):
    """Weighted mean with w_i ∝ 1/σ_i² (analytic). Privileged: needs the diagnostics channel."""

    server_lr: float = 1.0
    privileged: bool = True

    def weights(self, view: ServerView, channel: NoiseChannel | None = None, dim: int | None = None) -> torch.Tensor:
        if channel is None or dim is None:
            raise ValueError("the oracle aggregator needs the engine's noise channel (it is privileged)")
        var = channel.update_noise_variance(view, dim)
        if (var <= 0).any():
            raise ValueError("the oracle needs positive noise for every client "
                             "(a noiseless client would take all weight)")
        inv = 1.0 / var
        return (inv / inv.sum()).to(torch.float32)

    def aggregation_weights(self, state: Any, view: ServerView, channel: NoiseChannel | None,
                            dim: int) -> torch.Tensor:
        return self.weights(view, channel, dim)

    def update(self, state: Any, params: P.Params, uploads: Any, inputs: RoundInputs) -> ServerUpdate:
        new = self.aggregate(params, uploads, inputs.view, inputs.seed, inputs.round_, channel=inputs.channel)
        return ServerUpdate(new, state, {})

    def aggregate(self, global_params: P.Params, uploads: P.Params, view: ServerView, seed: int, round_: int,
                  channel: NoiseChannel | None = None) -> P.Params:
        w = self.weights(view, channel, P.num_parameters(global_params))
        mean = {n: torch.einsum("k,k...->...", w, u) for n, u in uploads.items()}
        return P.axpy(self.server_lr, mean, global_params)

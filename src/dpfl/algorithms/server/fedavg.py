"""FedAvg-style aggregation: a weighted mean of client updates, applied with a server learning rate.

The weighting is the only difference between FedAvg (uniform or by record count) and WeiAvg (by
reported epsilon, PFA's "WeiAvg" baseline); each exposes its weights for the round's diagnostics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import ServerStep
from dpfl.engine import params as P

WEIGHTINGS = ("uniform", "samples", "epsilon")


@dataclass(frozen=True)
class FedAvg(ServerStep):
    """w <- w + server_lr * sum_i p_i Δ_i.

    p_i is uniform, proportional to client record counts (`samples`), or to the clients' *reported*
    epsilons (`epsilon`, i.e. WeiAvg: it trusts the reports, and a liar gets a large weight).
    """

    weighting: str = "uniform"
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"FedAvg weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if not self.server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {self.server_lr}")

    def weights(self, view: ServerView) -> torch.Tensor:
        k = len(view)
        if self.weighting == "uniform":
            return torch.full((k,), 1.0 / k)
        raw = view.n_records.to(torch.float64) if self.weighting == "samples" else view.eps_reported
        if self.weighting == "epsilon" and not torch.isfinite(raw).all():
            raise ValueError("WeiAvg needs every client's reported epsilon; some clients declared no budget")
        return (raw / raw.sum()).to(torch.float32)

    def aggregation_weights(self, state: Any, view: ServerView, channel: object, dim: int) -> torch.Tensor:
        return self.weights(view)

    def aggregate(self, global_params: P.Params, uploads: P.Params, view: ServerView, seed: int,
                  round_: int) -> P.Params:
        w = self.weights(view)  # from the view's metadata, on the CPU: to the uploads' device
        mean = {n: torch.einsum("k,k...->...", w.to(u.device), u) for n, u in uploads.items()}
        return P.axpy(self.server_lr, mean, global_params)

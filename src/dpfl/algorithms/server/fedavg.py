"""FedAvg aggregation: the (weighted) mean of client updates, applied with a server learning rate."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpfl.engine import params as P


@dataclass(frozen=True)
class FedAvg:
    """w <- w + server_lr * sum_i p_i Δ_i, with p_i uniform or proportional to client record counts."""

    weighting: str = "uniform"
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        if self.weighting not in ("uniform", "samples"):
            raise ValueError(f"FedAvg weighting must be 'uniform' or 'samples', got {self.weighting!r}")
        if not self.server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {self.server_lr}")

    def weights(self, n_records: torch.Tensor) -> torch.Tensor:
        if self.weighting == "uniform":
            return torch.full((len(n_records),), 1.0 / len(n_records))
        n = n_records.to(torch.float64)
        return (n / n.sum()).to(torch.float32)

    def aggregate(self, global_params: P.Params, uploads: P.Params, n_records: torch.Tensor, expected_clients: float,
                  seed: int, round_: int) -> P.Params:
        w = self.weights(n_records)
        mean = {n: torch.einsum("k,k...->...", w, u) for n, u in uploads.items()}
        return P.axpy(self.server_lr, mean, global_params)

"""What the server sees about the clients it aggregates: their public facts and *reported* budgets.

Aggregators read only this (never the true budgets or the noise actually injected), so a client that
misreports its epsilon affects exactly the components that trust reports (spec heterogeneous_dp §6).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ServerView:
    """Per selected client (in upload order): records, batch size, reported epsilon and delta."""

    clients: torch.Tensor  # int64 [K]
    n_records: torch.Tensor  # int64 [K]
    batch_sizes: torch.Tensor  # int64 [K]
    eps_reported: torch.Tensor  # float64 [K]; inf where no budget is declared
    deltas: torch.Tensor  # float64 [K]
    expected_clients: float  # expected number of participants (fixed denominators)

    def __len__(self) -> int:
        return len(self.clients)

    @classmethod
    def simple(cls, n_records, expected_clients: float | None = None, eps_reported=None) -> ServerView:
        """A view with only record counts (and optionally reported epsilons), for tests and non-private runs."""
        n = torch.as_tensor(n_records, dtype=torch.int64)
        eps = torch.full((len(n),), float("inf"), dtype=torch.float64) if eps_reported is None else \
            torch.as_tensor(eps_reported, dtype=torch.float64)
        return cls(torch.arange(len(n)), n, torch.ones(len(n), dtype=torch.int64), eps,
                   torch.zeros(len(n), dtype=torch.float64),
                   float(len(n) if expected_clients is None else expected_clients))

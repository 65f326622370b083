"""Upload stages: what leaves a client after local training, and the DP event that is (if any).

An upload stage maps the cohort's stacked updates `[K, ...]` (local end model minus broadcast model)
to what the server receives. Its randomness comes from each client's own noise stream for the
upload, keyed by (seed, round, client), so a client's upload is the same alone or in a cohort.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from dp_accounting import DpEvent

from dpfl.algorithms.stages import UploadMechanism
from dpfl.engine import params as P
from dpfl.seeding import Purpose, torch_generator

# Upload noise uses its own stream, distinct from the DP-SGD noise of the local steps.
UPLOAD_STREAM_OFFSET = 1 << 20


def upload_noise(dim: int, clients: Sequence[int], seed: int, round_: int,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """Standard normal `[K, dim]` on `device` (the uploads'), one row per client from that client's upload stream."""
    rows = [
        torch.randn(dim, generator=torch_generator(seed, Purpose.NOISE, round_, UPLOAD_STREAM_OFFSET + c, device),
                    device=device)
        for c in clients
    ]
    return torch.stack(rows) if rows else torch.zeros(0, dim, device=device)


@dataclass(frozen=True)
class FullUpdate(UploadMechanism):
    """Upload the whole update in float32, unchanged."""

    unit: str | None = None
    accounted: bool = True

    def apply(self, deltas: P.Params, clients: Sequence[int], seed: int, round_: int) -> P.Params:
        return deltas

    def event(self, client: int, round_: int, cohort: int) -> DpEvent | None:
        return None

    def events_for_every_client(self) -> bool:
        return True  # no event at all

    def bytes_per_upload(self, dim: int) -> int:
        return 4 * dim

    def describe(self) -> str:
        return "full update"

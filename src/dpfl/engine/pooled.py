"""All clients' training records in one tensor, so a cohort's minibatches are one gather."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def _head(ids: Sequence[int], limit: int = 10) -> str:
    """At most ``limit`` ids for an error message: ``[0, 1, ..., 9, ...]`` (a million ids would be megabytes)."""
    shown = ", ".join(str(i) for i in ids[:limit])
    return f"[{shown}, ...]" if len(ids) > limit else f"[{shown}]"


@dataclass(frozen=True)
class PooledData:
    """Concatenated client records; client `i` owns rows `offsets[i] : offsets[i] + sizes[i]`.

    `x`, `y` and `offsets` live on the run's device (`to`); `sizes` stays on the CPU: it is bookkeeping (record
    counts read as Python ints), never an operand of the training tensors.
    """

    x: torch.Tensor
    y: torch.Tensor
    offsets: torch.Tensor  # int64 [n_clients], on x's device
    sizes: torch.Tensor  # int64 [n_clients], on the CPU

    @classmethod
    def from_clients(cls, xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor]) -> PooledData:
        if len(xs) != len(ys) or not xs:
            raise ValueError("need the same non-zero number of feature and label tensors")
        sizes = torch.tensor([len(x) for x in xs], dtype=torch.int64)
        if (sizes < 1).any():
            empty = torch.nonzero(sizes < 1).flatten()
            raise ValueError(f"{len(empty)} of {len(sizes)} clients have no training records: {_head(empty.tolist())}")
        offsets = torch.cumsum(sizes, 0) - sizes
        x = torch.cat(list(xs))
        return cls(x, torch.cat(list(ys)), offsets.to(x.device), sizes)

    @property
    def device(self) -> torch.device:
        """Where the records are, and so where the engine trains on them."""
        return self.x.device

    def to(self, device: torch.device | str) -> PooledData:
        """The same records on `device` (this object itself when they are there already)."""
        device = torch.device(device)
        if self.x.device == device and self.y.device == device and self.offsets.device == device:
            return self
        return PooledData(self.x.to(device), self.y.to(device), self.offsets.to(device), self.sizes.cpu())

    @property
    def n_clients(self) -> int:
        return len(self.sizes)

    def size(self, client: int) -> int:
        return int(self.sizes[client])

    def client(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Client `client`'s records (views)."""
        lo, n = int(self.offsets[client]), int(self.sizes[client])
        return self.x[lo : lo + n], self.y[lo : lo + n]

    def gather(self, clients: torch.Tensor,
               local_idx: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Padded batches `[K, B, ...]` for per-client local indices, with a validity mask `[K, B]`.

        Padding rows repeat a valid record of the same client and are masked out, so they never
        contribute to any gradient.
        """
        k = len(local_idx)
        width = max((len(i) for i in local_idx), default=0)
        rows = torch.zeros(k, width, dtype=torch.int64, device=self.device)
        mask = torch.zeros(k, width, dtype=torch.bool, device=self.device)
        for j, idx in enumerate(local_idx):
            m = len(idx)
            rows[j, :m] = idx
            mask[j, :m] = True
        rows = rows + self.offsets[clients].unsqueeze(1)
        return self.x[rows], self.y[rows], mask

    def gather_packed(self, clients: torch.Tensor,
                      local_idx: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All clients' batches back to back `[S, ...]`, with `owner[s]` = position of the sample's client.

        No padding: per-sample work is proportional to the records actually drawn.
        """
        counts = torch.tensor([len(i) for i in local_idx], dtype=torch.int64, device=self.device)
        owner = torch.repeat_interleave(torch.arange(len(local_idx), device=self.device), counts)
        if len(owner) == 0:
            return self.x[:0], self.y[:0], owner
        rows = torch.cat(list(local_idx)) + self.offsets[clients].repeat_interleave(counts)
        return self.x[rows], self.y[rows], owner

    def gather_slots(self, clients: torch.Tensor, local_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed-capacity batches: `local_idx` `[k, c]` (client j's record indices in row j) -> records `[k * c, ...]`
        client by client, every client `c` rows (the engine's padded layout; which slots count is the caller's)."""
        rows = (local_idx + self.offsets[clients].unsqueeze(1)).reshape(-1)
        return self.x[rows], self.y[rows]

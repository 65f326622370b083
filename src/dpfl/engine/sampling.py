"""Per-client minibatch index streams: Poisson, fixed-size without replacement, or shuffled epochs.

Each client draws from its own generator, so its batches are the same whether it trains alone or in a
cohort. A Poisson batch is used exactly as drawn (never truncated or padded into the sum): the
accountant's sampled Gaussian mechanism assumes exactly that event. Masks, permutations and noise are drawn on
the generator's device, so a CUDA run's randomness never leaves the GPU.
"""

from __future__ import annotations

from typing import Literal

import torch

Sampling = Literal["poisson", "fixed", "shuffle"]
SAMPLINGS: tuple[str, ...] = ("poisson", "fixed", "shuffle")

# Pre-draw Poisson masks in blocks of at most this many uniforms per client (bounds memory).
_BLOCK_ELEMENTS = 1 << 20


class BatchStream:
    """Yields one index tensor per local step for a client with `n` records and batch size `b`.

    Poisson masks are drawn in blocks whose size depends only on (n, steps), so the stream is the same
    whether the client runs alone or in a cohort.
    """

    def __init__(self, kind: str, n: int, batch_size: int, generator: torch.Generator, steps: int) -> None:
        if kind not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {kind!r}")
        if n < 1:
            raise ValueError(f"a client needs at least one record, got n={n}")
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        if kind == "fixed" and batch_size > n:
            raise ValueError(f"fixed-size sampling needs batch size <= records ({batch_size} > {n})")
        self.kind, self.n, self.batch_size, self.g = (kind, n, min(batch_size, n) if kind == "shuffle" else batch_size,
                                                      generator)
        self.rate = min(1.0, batch_size / n)
        self.remaining = steps
        self._block: torch.Tensor | None = None
        self._block_pos = 0
        self._perm: torch.Tensor | None = None
        self._perm_pos = 0

    def next(self) -> torch.Tensor:
        """Indices (into this client's records) of the next batch."""
        self.remaining -= 1
        if self.kind == "poisson":
            return self._next_poisson()
        if self.kind == "fixed":
            return torch.randperm(self.n, generator=self.g, device=self.g.device)[: self.batch_size]
        return self._next_shuffle()

    def _next_poisson(self) -> torch.Tensor:
        if self._block is None or self._block_pos == self._block.shape[0]:
            rows = max(1, min(self.remaining + 1, _BLOCK_ELEMENTS // self.n))
            self._block = torch.rand(rows, self.n, generator=self.g, device=self.g.device) < self.rate
            self._block_pos = 0
        row = self._block[self._block_pos]
        self._block_pos += 1
        return row.nonzero().squeeze(1)

    def _next_shuffle(self) -> torch.Tensor:
        if self._perm is None or self._perm_pos >= self.n:
            self._perm = torch.randperm(self.n, generator=self.g, device=self.g.device)
            self._perm_pos = 0
        idx = self._perm[self._perm_pos : self._perm_pos + self.batch_size]
        self._perm_pos += self.batch_size
        return idx


class NoiseStream:
    """Standard normal vectors of length `dim`, one per step, from a client's own generator.

    Drawn in blocks whose size depends only on (dim, steps), so the stream is identical whether the
    client runs alone or with others.
    """

    def __init__(self, dim: int, steps: int, generator: torch.Generator) -> None:
        self.dim, self.remaining, self.g = dim, steps, generator
        self._block: torch.Tensor | None = None
        self._pos = 0

    def next(self) -> torch.Tensor:
        if self._block is None or self._pos == self._block.shape[0]:
            rows = max(1, min(self.remaining, _BLOCK_ELEMENTS // max(1, self.dim)))
            self._block = torch.randn(rows, self.dim, generator=self.g, device=self.g.device)
            self._pos = 0
        out = self._block[self._pos]
        self._pos += 1
        self.remaining -= 1
        return out

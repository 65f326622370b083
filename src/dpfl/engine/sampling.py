"""Per-client minibatch index streams: Poisson, fixed-size without replacement, or shuffled epochs.

Each client draws from its own generator, so its batches are the same whether it trains alone or in a
cohort. A Poisson batch is used exactly as drawn (never truncated or padded into the sum): the
accountant's sampled Gaussian mechanism assumes exactly that event. Masks, permutations and noise are drawn on
the generator's device, so a CUDA run's randomness never leaves the GPU.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch.nn.utils.rnn import pad_sequence

Sampling = Literal["poisson", "fixed", "shuffle"]
SAMPLINGS: tuple[str, ...] = ("poisson", "fixed", "shuffle")

# Pre-draw Poisson masks in blocks of at most this many uniforms per client (bounds memory).
_BLOCK_ELEMENTS = 1 << 20
# Slot blocks (`SlotBatches`): at most about this many mask / index elements held for a block of steps.
_SLOT_ELEMENTS = 1 << 24


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
        if self.kind == "poisson":  # `_masks` counts the step off `remaining`
            return self._masks(1)[0].nonzero().squeeze(1)
        self.remaining -= 1
        if self.kind == "fixed":
            return torch.randperm(self.n, generator=self.g, device=self.g.device)[: self.batch_size]
        return self._next_shuffle()

    def masks(self, steps: int) -> torch.Tensor:
        """The next `steps` Poisson batches as membership masks `[steps, n]` (bool), cut from the blocks `next`
        draws, so a stream yields the same batches whichever way it is read (and no host sync: no `nonzero`)."""
        if self.kind != "poisson":
            raise ValueError(f"masks are for Poisson sampling, not {self.kind!r}")
        return self._masks(steps)

    def _masks(self, steps: int) -> torch.Tensor:
        parts = []
        while steps > 0:
            if self._block is None or self._block_pos == self._block.shape[0]:
                rows = max(1, min(self.remaining, _BLOCK_ELEMENTS // self.n))  # the steps left, this one included
                self._block = torch.rand(rows, self.n, generator=self.g, device=self.g.device) < self.rate
                self._block_pos = 0
            take = min(steps, self._block.shape[0] - self._block_pos)
            parts.append(self._block[self._block_pos : self._block_pos + take])
            self._block_pos += take
            self.remaining -= take
            steps -= take
        return parts[0] if len(parts) == 1 else torch.cat(parts)

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


@dataclass(frozen=True)
class SlotBlock:
    """Steps `start .. start + len(counts)` of a cohort's first `k` clients as fixed-capacity batches: each client's
    batch at a step fills `cap` slots, its drawn records first (in the order `BatchStream.next` gives them), then
    padding slots that index the client's record 0 and carry `mask` False (clip weight 0). `caps[j]`, the largest
    batch at step j, is known on the host: slots past it are padding for every client (a step may use the first
    `caps[j]` only)."""

    start: int
    index: torch.Tensor  # [T, k, cap] int64: local record indices
    mask: torch.Tensor  # [T, k, cap] bool: True on a drawn record
    counts: torch.Tensor  # [T, k] int64: records drawn (0 past a client's last step)
    cap: int
    caps: list[int]


class SlotBatches:
    """A cohort's batches in blocks of steps as fixed-capacity slots (the padded layout of the engine), drawn from
    the clients' own `BatchStream`s in the same blocks as `next`, so the records are the same as the packed layout's.

    `steps` must be non-increasing (the clients still training at a step are a prefix). `cap` is the largest batch
    any client draws in the block (`caps` per step), so a Poisson batch always fits whole (never truncated); finding
    them costs one host read per block (Poisson only, the batch sizes; fixed and shuffle sizes are known on the host).
    A block holds about `budget` mask / index elements at most; everything it yields lives on `device`.
    """

    def __init__(self, streams: Sequence[BatchStream], steps: Sequence[int], device: torch.device | str,
                 budget: int = _SLOT_ELEMENTS) -> None:
        if any(a < b for a, b in zip(steps, steps[1:], strict=False)):
            raise ValueError("steps must be non-increasing")
        self.streams, self.steps, self.device, self.budget = list(streams), list(steps), torch.device(device), budget

    def __iter__(self) -> Iterator[SlotBlock]:
        t, total = 0, (self.steps[0] if self.steps else 0)
        poisson = bool(self.streams) and self.streams[0].kind == "poisson"
        dev = self.device
        while t < total:
            k = sum(1 for s in self.steps if s > t)
            streams = self.streams[:k]
            per_step = sum(s.n for s in streams) if poisson else k * max(s.batch_size for s in streams)
            span = max(1, min(total - t, self.budget // max(1, per_step)))
            lens = [min(span, self.steps[i] - t) for i in range(k)]
            if poisson:
                masks = [s.masks(m).to(dev) for s, m in zip(streams, lens, strict=True)]
                counts = torch.zeros(span, k, dtype=torch.int64, device=dev)
                for i, m in enumerate(masks):
                    counts[: lens[i], i] = m.sum(1)
                caps = [max(row) for row in counts.tolist()]  # the block's one host read
            else:
                drawn = [[s.next().to(dev) for _ in range(m)] for s, m in zip(streams, lens, strict=True)]
                sizes = [[len(ix) for ix in d] for d in drawn]
                caps = [max(z[j] for z in sizes if j < len(z)) for j in range(span)]
                counts = torch.tensor([[z[j] if j < len(z) else 0 for z in sizes] for j in range(span)],
                                      dtype=torch.int64, device=dev)
            cap = max(caps)
            sub = max(1, min(span, self.budget // max(1, k * cap)))
            for lo in range(0, span, sub):
                hi = min(span, lo + sub)
                index = torch.zeros(hi - lo, k, cap, dtype=torch.int64, device=dev)
                for i in range(k if cap else 0):
                    m = min(hi, lens[i]) - lo
                    if m <= 0:
                        break  # lens is non-increasing
                    if poisson:
                        index[:m, i] = _compact(masks[i][lo : lo + m], cap)
                    else:
                        part = pad_sequence(drawn[i][lo : lo + m], batch_first=True)
                        index[:m, i, : part.shape[1]] = part
                c = counts[lo:hi]
                mask = torch.arange(cap, device=dev) < c.unsqueeze(2)
                yield SlotBlock(t + lo, index, mask, c, cap, caps[lo:hi])
            t += span


def _compact(mask: torch.Tensor, cap: int) -> torch.Tensor:
    """`[m, n]` membership masks -> `[m, cap]` indices of the members in increasing order (what `nonzero` gives),
    then zeros; without a host sync. Every row has at most `cap` members."""
    m, n = mask.shape
    slot = torch.where(mask, mask.cumsum(1) - 1, cap)  # non-members all go to the dropped column `cap`
    out = torch.zeros(m, cap + 1, dtype=torch.int64, device=mask.device)
    out.scatter_(1, slot, torch.arange(n, device=mask.device).expand(m, n))
    return out[:, :cap]

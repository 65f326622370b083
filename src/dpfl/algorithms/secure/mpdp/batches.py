"""FedSGD's batches in MP-DP's comparison (spec bidirectional.md §11): each client draws its batch without replacement
from its own records; an epoch is ceil(|D_k| / b) rounds, each epoch a fresh permutation keyed by (seed, epoch, k)."""

from __future__ import annotations

import math

import torch

from dpfl.seeding import Purpose, numpy_generator


def fedsgd_batch(x: torch.Tensor, y: torch.Tensor, batch: int, seed: int, client: int,
                 round_: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client `client`'s batch of round `round_` (0-based) from its records `x`, `y`."""
    per_epoch = math.ceil(len(x) / batch)
    epoch, pos = divmod(round_, per_epoch)
    order = numpy_generator(seed, Purpose.BATCH, epoch, client).permutation(len(x))
    idx = order[pos * batch:(pos + 1) * batch]
    return x[idx], y[idx]

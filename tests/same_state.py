"""`same_state(a, b)`: two server-step states equal bit for bit (nested dicts of tensors and plain values), for the
tests that a step's `update` leaves the state it is given unchanged."""

from __future__ import annotations

import torch


def same_state(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b

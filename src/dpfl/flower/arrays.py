"""dpfl parameters (name -> torch tensor) <-> Flower ArrayRecords; float32 round-trips bit for bit."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from dpfl.engine import params as P


def to_record(params: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """One Array per tensor, in the params' order (a copy: the record never aliases the tensors)."""
    record = ArrayRecord()
    for name, t in params.items():
        record[name] = Array.from_numpy_ndarray(np.ascontiguousarray(t.detach().cpu().numpy()))
    return record


def from_record(record: ArrayRecord, like: Mapping[str, torch.Tensor] | None = None) -> P.Params:
    """The tensors of `record`; with `like`, checked to have its names, shapes and dtypes (and put in its order)."""
    got = {name: torch.from_numpy(np.array(arr.numpy(), copy=True)) for name, arr in record.items()}
    if like is None:
        return got
    if set(got) != set(like):
        raise ValueError(f"the arrays are {sorted(got)}, expected {sorted(like)}")
    out: P.Params = {}
    for name, ref in like.items():
        t = got[name]
        if t.shape != ref.shape or t.dtype != ref.dtype:
            raise ValueError(f"array {name} is {tuple(t.shape)} {t.dtype}, expected {tuple(ref.shape)} {ref.dtype}")
        out[name] = t
    return out

"""A federated dataset from the user's own data, one entry per client: tensors, arrays or torch Datasets.

    data = federated_data([(x_a, y_a), (x_b, y_b)], test=(x_test, y_test))
    data = federated_data([{"train": hospital_a_train, "test": hospital_a_test}, ...])   # torch Datasets

The data is already split among clients (the user's silos), so nothing is partitioned. The vectorised
engine trains on tensors, so torch Datasets are read once into memory (samples are stacked as they come:
every sample of every client must have the same shape). Labels are class indices; the number of classes
is the largest label + 1 unless given (give it: a class no silo holds would otherwise shrink the model). Every
problem is a one-line `DataError` naming the client and split.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dpfl.data.errors import DataError
from dpfl.data.federated import ClientData, FederatedDataset

__all__ = ["federated_data"]

Split = Any  # (x, y) of tensors or arrays, or a torch.utils.data.Dataset of (x, y) items


def _as_pair(split: Split, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x float32 [N, ...], y int64 [N]) from a pair of tensors/arrays or a Dataset of (x, y) items."""
    if isinstance(split, (tuple, list)) and len(split) == 2:
        x, y = split
    elif hasattr(split, "__getitem__") and hasattr(split, "__len__"):
        items = [split[i] for i in range(len(split))]
        if not items:
            raise DataError(f"{where}: the dataset is empty")
        if any(not (isinstance(it, (tuple, list)) and len(it) == 2) for it in items[:1]):
            raise DataError(f"{where}: a Dataset must yield (x, y) pairs, got {type(items[0]).__name__}")
        try:
            x = torch.stack([torch.as_tensor(it[0]) for it in items])
        except RuntimeError as err:
            raise DataError(f"{where}: samples differ in shape ({err})") from None
        except (TypeError, ValueError) as err:
            raise DataError(f"{where}: samples are not numeric arrays ({type(err).__name__}: {err})") from None
        try:
            y = torch.as_tensor([int(it[1]) for it in items])
        except (TypeError, ValueError) as err:
            raise DataError(f"{where}: labels must be class indices (integers) ({type(err).__name__}: {err})") \
                from None
    else:
        raise DataError(f"{where}: expected (x, y) tensors or arrays, or a torch Dataset of (x, y) items; got "
                        f"{type(split).__name__}")
    x, y = _tensor(x, f"{where}: x", torch.float32), _tensor(y, f"{where}: labels", None)
    if y.is_floating_point():
        if not torch.equal(y, y.round()):
            raise DataError(f"{where}: labels must be class indices (integers), got non-integer values")
    y = y.to(torch.int64).reshape(-1)
    if x.ndim < 2 or x.shape[0] != y.shape[0]:
        raise DataError(f"{where}: x must be [N, ...] with one label per sample; got x {tuple(x.shape)}, "
                        f"y {tuple(y.shape)}")
    if not torch.isfinite(x).all():
        raise DataError(f"{where}: x has NaN or infinite values")
    if y.numel() and int(y.min()) < 0:
        raise DataError(f"{where}: labels must be >= 0, got {int(y.min())}")
    return x, y


def _tensor(value: Any, what: str, dtype: torch.dtype | None) -> torch.Tensor:
    """A tensor of numbers, or a DataError (numpy's and torch's ValueError/TypeError for strings, objects, ragged
    lists would name neither the client nor the split)."""
    try:
        t = torch.as_tensor(np.asarray(value) if not isinstance(value, torch.Tensor) else value)
        if not (t.is_floating_point() or t.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                                                     torch.bool)):
            raise TypeError(f"dtype {t.dtype}")
        return t.to(dtype) if dtype is not None else t
    except (TypeError, ValueError, RuntimeError) as err:
        raise DataError(f"{what} must be numbers ({type(err).__name__}: {' '.join(str(err).split())})") from None


def _client(entry: Any, i: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(entry, Mapping):
        unknown = sorted(set(entry) - {"train", "test", "val"})
        if unknown or "train" not in entry:
            raise DataError(f"client {i}: a mapping needs 'train' and may have 'test' and 'val' (got keys "
                             f"{sorted(entry)})")
        return {k: _as_pair(v, f"client {i} {k}") for k, v in entry.items()}
    return {"train": _as_pair(entry, f"client {i}")}


def federated_data(clients: Sequence[Any], test: Split | None = None, *, n_classes: int | None = None,
                   name: str = "provided") -> FederatedDataset:
    """One client per entry of `clients`: ``(x, y)``, a torch Dataset, or ``{"train": ..., "test": ..., "val": ...}``.

    `test` is the global test set the global model is evaluated on; without it, the union of the clients'
    test splits is used (one of the two is needed). A client's ``val`` split is what hyperparameter searches
    select on; it is never trained on.
    """
    if isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence) or not len(clients):
        raise DataError("clients must be a non-empty list with one entry per client")
    parts = [_client(entry, i) for i, entry in enumerate(clients)]
    if test is not None:
        x_test, y_test = _as_pair(test, "test")
    else:
        held = [p["test"] for p in parts if "test" in p]
        if not held:
            raise DataError("give a global test set (test=(x, y)) or per-client 'test' splits: dpfl evaluates the "
                             "global model on them")
        x_test, y_test = torch.cat([x for x, _ in held]), torch.cat([y for _, y in held])
    shape = tuple(parts[0]["train"][0].shape[1:])
    labels = [y_test] + [y for p in parts for _, y in p.values()]
    for i, p in enumerate(parts):
        for split, (x, _) in p.items():
            if tuple(x.shape[1:]) != shape:
                raise DataError(f"client {i} {split}: samples have shape {tuple(x.shape[1:])}, client 0's {shape}")
    if tuple(x_test.shape[1:]) != shape:
        raise DataError(f"test samples have shape {tuple(x_test.shape[1:])}, the clients' {shape}")
    seen = max(int(y.max()) for y in labels if y.numel()) + 1
    if n_classes is None:
        n_classes = seen
    elif isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 1:
        raise DataError(f"n_classes must be an integer >= 1, got {n_classes!r}")
    elif n_classes < seen:
        where = "test" if y_test.numel() and int(y_test.max()) == seen - 1 else next(
            f"client {i} {split}" for i, p in enumerate(parts) for split, (_, y) in p.items()
            if y.numel() and int(y.max()) == seen - 1)
        raise DataError(f"{where}: label {seen - 1} is outside the {n_classes} classes (0..{n_classes - 1}; "
                        "n_classes)")
    empty = (x_test[:0].clone(), y_test[:0].clone())
    out = [ClientData(*p["train"], *p.get("test", empty), *p.get("val", empty)) for p in parts]
    empty_clients = [i for i, c in enumerate(out) if c.n_train == 0]
    if empty_clients:
        raise DataError(f"clients {empty_clients[:10]} have no training data")
    info = {"dataset": name, "n_clients": len(out), "partition": "provided"}
    return FederatedDataset(out, x_test, y_test, int(n_classes), shape, info)

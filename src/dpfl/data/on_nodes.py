"""The server's view of a federation whose training records stay on the clients' own machines: each client's record
count (which its node reports), never its records, and the test set the server holds.

A FederatedRun needs a client's count for the sampling rate, the batch size and the noise calibration; it reads the
records only when it trains the client itself, which a federation's server never does (its clients train through
`FederatedRun.remote_clients`). Each client's training split is therefore a stand-in of the right length: a
zero-stride view of one zero (no memory, whatever the count), marked by ``info["records"] == NODES`` so that the run
refuses to train on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from dpfl.data.errors import DataError
from dpfl.data.federated import ClientData, FederatedDataset

__all__ = ["NODES", "on_nodes", "records_on_nodes"]

NODES = "on the clients' nodes"  # FederatedDataset.info["records"]: the server holds counts, not records


def records_on_nodes(counts: Sequence[int], x_test: torch.Tensor, y_test: torch.Tensor, n_classes: int, *,
                     info: dict[str, Any] | None = None) -> FederatedDataset:
    """Clients known by their training-record counts (in client order), and the server's test set.

    Raises `DataError` for a client without records or an empty test set (the server evaluates on it)."""
    if not len(counts):
        raise DataError("a federation needs at least one client")
    empty = [i for i, n in enumerate(counts) if int(n) < 1]
    if empty:
        raise DataError(f"clients {empty[:10]} reported no training records")
    if not len(y_test):
        raise DataError("the server's test set is empty: it evaluates the global model on it")
    shape = tuple(x_test.shape[1:])
    nothing = x_test[:0].clone(), y_test[:0].clone()
    clients = [ClientData(torch.zeros((), dtype=x_test.dtype).expand(int(n), *shape),
                          torch.zeros((), dtype=y_test.dtype).expand(int(n)), *nothing) for n in counts]
    return FederatedDataset(clients, x_test, y_test, n_classes, shape, {**(info or {}), "records": NODES})


def on_nodes(data: FederatedDataset) -> bool:
    """True when `data`'s training records are on the clients' nodes (`records_on_nodes`), not here."""
    return getattr(data, "info", {}).get("records") == NODES

"""PooledData: client records in one tensor (engine/pooled.py)."""

import pytest
import torch

from dpfl.engine.pooled import PooledData


def _clients(sizes):
    xs = [torch.full((n, 2), float(i)) for i, n in enumerate(sizes)]
    return xs, [torch.full((n,), i) for i, n in enumerate(sizes)]


def test_offsets_and_views():
    data = PooledData.from_clients(*_clients([2, 3, 1]))
    assert data.offsets.tolist() == [0, 2, 5] and data.n_clients == 3 and data.size(1) == 3
    x, y = data.client(1)
    assert torch.equal(x, torch.ones(3, 2)) and torch.equal(y, torch.ones(3, dtype=y.dtype))


def test_empty_clients_error_lists_at_most_ten_ids():
    """Before: every empty client's id went into the message (7.9 MB for a million clients)."""
    sizes = [0] * 100_000 + [1]
    with pytest.raises(ValueError) as err:
        PooledData.from_clients(*_clients(sizes))
    msg = str(err.value)
    assert msg == "100000 of 100001 clients have no training records: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ...]"
    with pytest.raises(ValueError, match=r"^1 of 3 clients have no training records: \[1\]$"):
        PooledData.from_clients(*_clients([1, 0, 2]))


def test_needs_matching_non_empty_inputs():
    with pytest.raises(ValueError, match="same non-zero number"):
        PooledData.from_clients([], [])

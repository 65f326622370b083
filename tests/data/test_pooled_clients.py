"""`FederatedDataset.from_arrays` keeps its clients pooled (one tensor per split plus offsets) and makes a client's
ClientData on access: each client's records are exactly the rows its partition gave it, in the same order, and
`iid_flat` is `iid`'s draw without a Python array per client."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpfl.data.builtin import make_classification
from dpfl.data.federated import ClientData, FederatedDataset, PooledClients
from dpfl.data.partition import iid, iid_flat
from dpfl.seeding import Purpose, numpy_generator


@pytest.mark.parametrize("n, clients, sizes", [(100, 7, None), (50, 5, [3, 0, 10, 2, 5]), (13, 13, None),
                                                (9, 1, None)])
def test_iid_flat_is_iids_draw_in_one_array(n, clients, sizes):
    parts = iid(n, clients, np.random.default_rng(4), sizes=sizes)
    flat, counts = iid_flat(n, clients, np.random.default_rng(4), sizes=sizes)
    assert counts.tolist() == [len(p) for p in parts]
    assert flat.dtype == np.int64 and flat.tolist() == np.concatenate(parts).tolist()
    assert all((np.diff(p) > 0).all() for p in parts)  # each client's indices sorted


def test_a_pooled_client_holds_the_rows_its_iid_share_names():
    ds = make_classification(n_samples=500, n_features=3, n_classes=4, seed=2)
    fd = FederatedDataset.from_arrays(ds, 12, seed=5)
    assert isinstance(fd.clients, PooledClients) and len(fd.clients) == 12
    parts = iid(ds.n_train, 12, numpy_generator(5, Purpose.PARTITION))
    for c, part in zip(fd.clients, parts, strict=True):
        assert isinstance(c, ClientData)
        assert torch.equal(c.x_train, ds.x_train[torch.from_numpy(part)])
        assert torch.equal(c.y_train, ds.y_train[torch.from_numpy(part)])
        assert c.n_test == c.n_val == 0 and c.x_test.shape == (0, 3) and c.x_val.dtype == ds.x_train.dtype
    assert torch.equal(fd.clients[-1].x_train, fd.clients[11].x_train)
    assert [c.n_train for c in fd.clients[2:5]] == fd.train_sizes[2:5].tolist()
    assert fd.label_counts().tolist() == [np.bincount(c.y_train.numpy(), minlength=4).tolist() for c in fd.clients]
    with pytest.raises(IndexError):
        fd.clients[12]


def test_pooled_held_out_splits_follow_each_clients_streams():
    """With test and validation fractions each client's split still comes from its own (PARTITION, 1/2, client)
    streams: the pooled clients equal the ones built one by one from them."""
    ds = make_classification(n_samples=600, n_features=2, n_classes=3, seed=1)
    fd = FederatedDataset.from_arrays(ds, 6, partition="dirichlet", alpha=0.5, client_test_fraction=0.2,
                                      client_val_fraction=0.1, seed=3)
    x64 = fd.with_feature_dtype(torch.float64)
    assert isinstance(x64.clients, PooledClients)
    for c, c64 in zip(fd.clients, x64.clients, strict=True):
        assert c.n_test > 0 and c.n_val > 0
        for name in ("x_train", "x_test", "x_val"):
            assert torch.equal(getattr(c64, name), getattr(c, name).double())
    assert fd.test_sizes.tolist() == [c.n_test for c in fd.clients]
    assert sum(fd.train_sizes + fd.test_sizes) + sum(c.n_val for c in fd.clients) == ds.n_train


def test_pooled_clients_refuse_offsets_that_do_not_cover_their_rows():
    x, y = torch.zeros(4, 2), torch.zeros(4, dtype=torch.int64)
    empty = (x[:0], y[:0], np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="offsets must rise from 0 to its 4 rows"):
        PooledClients({"train": (x, y, np.array([0, 3, 3])), "test": empty, "val": empty})
    ok = PooledClients({"train": (x, y, np.array([0, 1, 4])), "test": empty, "val": empty})
    assert [c.n_train for c in ok] == [1, 3]

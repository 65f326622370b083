import numpy as np
import pytest
import torch

from dpfl.data import ArrayDataset, FederatedDataset, federated_dataset, make_least_squares, make_logistic


def _indexed(n_train=300, n_test=40, n_classes=5):
    """x holds each sample's own index, so a client's rows say exactly which samples it got."""
    y = torch.arange(n_train) % n_classes
    return ArrayDataset(
        "indexed",
        torch.arange(n_train, dtype=torch.float32)[:, None],
        y,
        -torch.ones(n_test, 1),
        torch.arange(n_test) % n_classes,
        n_classes=n_classes,
    )


def _owned(fd):
    """Per client: indices of its train samples and of its local test samples."""
    return [(c.x_train[:, 0].long().numpy(), c.x_test[:, 0].long().numpy()) for c in fd.clients]


def test_iid_partition_of_the_train_split():
    ds = _indexed()
    fd = FederatedDataset.from_arrays(ds, n_clients=7)
    assert fd.n_clients == 7 and fd.n_classes == 5 and fd.input_shape == (1,)
    assert fd.train_sizes.tolist() == [43] * 6 + [42]
    owned = np.concatenate([tr for tr, _ in _owned(fd)])
    assert np.array_equal(np.sort(owned), np.arange(300))
    for c in fd.clients:
        assert torch.equal(c.y_train, ds.y_train[c.x_train[:, 0].long()])  # labels follow their samples
        assert c.n_test == 0 and c.x_test.shape == (0, 1)
    assert torch.equal(fd.x_test, ds.x_test) and torch.equal(fd.y_test, ds.y_test)
    assert fd.info["partition"] == "iid" and fd.info["dataset"] == "indexed"


def test_client_test_fraction_splits_each_share():
    fd = FederatedDataset.from_arrays(_indexed(), 5, client_test_fraction=0.25, seed=3)
    seen = []
    for c, (tr, te) in zip(fd.clients, _owned(fd), strict=True):
        assert len(te) == round(0.25 * (len(tr) + len(te)))
        assert not set(tr) & set(te)
        seen.extend(tr)
        seen.extend(te)
        assert torch.equal(c.y_test, torch.from_numpy(te) % 5)
    assert sorted(seen) == list(range(300))
    assert fd.test_sizes.tolist() == [15] * 5


def test_max_train_samples_subsamples_first_and_is_seeded():
    a = FederatedDataset.from_arrays(_indexed(), 4, max_train_samples=100, seed=1)
    b = FederatedDataset.from_arrays(_indexed(), 4, max_train_samples=100, seed=1)
    c = FederatedDataset.from_arrays(_indexed(), 4, max_train_samples=100, seed=2)
    assert a.train_sizes.sum() == 100
    owned_a = np.sort(np.concatenate([tr for tr, _ in _owned(a)]))
    owned_c = np.sort(np.concatenate([tr for tr, _ in _owned(c)]))
    assert len(np.unique(owned_a)) == 100 and owned_a.max() > 100  # a random subset, not the first 100
    assert all(torch.equal(x.x_train, y.x_train) for x, y in zip(a.clients, b.clients, strict=True))
    assert not np.array_equal(owned_a, owned_c)


def test_shards_and_dirichlet_partitions():
    ds = _indexed(n_train=400, n_classes=4)
    shards = FederatedDataset.from_arrays(ds, 8, partition="shards", shards_per_client=2)
    counts = shards.label_counts()
    assert counts.shape == (8, 4) and counts.sum() == 400
    assert ((counts > 0).sum(axis=1) <= 2).all()
    assert shards.info["shards_per_client"] == 2

    skewed = FederatedDataset.from_arrays(ds, 8, partition="dirichlet", alpha=0.05, seed=0)
    flat = FederatedDataset.from_arrays(ds, 8, partition="dirichlet", alpha=1000.0, seed=0)
    assert skewed.train_sizes.sum() == flat.train_sizes.sum() == 400
    share = lambda fd: np.mean(fd.label_counts().max(axis=1) / fd.train_sizes)  # noqa: E731
    assert share(skewed) > 0.6 > 0.35 > share(flat)


def test_iid_sizes_are_honoured():
    fd = FederatedDataset.from_arrays(_indexed(), 3, sizes=[10, 20, 30])
    assert fd.train_sizes.tolist() == [10, 20, 30]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"partition": "label_shards"}, "partition must be one of iid, shards, dirichlet"),
        ({"partition": "shards", "sizes": [1, 2]}, "sizes applies to partition='iid' only"),
        ({"client_test_fraction": 1.0}, r"client_test_fraction must be in \[0, 1\)"),
        ({"max_train_samples": 0}, "max_train_samples must be an int >= 1"),
        ({"seed": -2}, "seed must be a non-negative int"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FederatedDataset.from_arrays(_indexed(), 2, **kwargs)


def test_federated_dataset_on_digits_routes_options():
    fd = federated_dataset("digits", 6, partition="dirichlet", alpha=0.3, seed=2, normalize=(0.5, 0.5))
    assert fd.n_clients == 6 and fd.train_sizes.sum() == 1438 and fd.input_shape == (1, 8, 8)
    assert float(fd.x_test.min()) == -1.0  # normalised: (0 - 0.5) / 0.5
    assert fd.info["alpha"] == 0.3 and fd.info["dataset"] == "digits"
    with pytest.raises(ValueError, match="unknown option.*alpah"):
        federated_dataset("digits", 2, alpah=0.3)


def test_federated_synthetic_uses_the_run_seed_for_data_and_split():
    a = federated_dataset("synthetic", 4, seed=3, n_samples=200, n_features=5)
    b = federated_dataset("synthetic", 4, seed=3, n_samples=200, n_features=5)
    c = federated_dataset("synthetic", 4, seed=4, n_samples=200, n_features=5)
    assert torch.equal(a.x_test, b.x_test) and not torch.equal(a.x_test, c.x_test)
    assert a.input_shape == (5,) and a.train_sizes.sum() == 160


@pytest.mark.parametrize("maker,n_classes", [(make_least_squares, 0), (make_logistic, 2)])
def test_from_convex(maker, n_classes):
    p = maker(preset="small", shift_scale=0.5)
    fd = FederatedDataset.from_convex(p)
    assert fd.n_clients == 5 and fd.input_shape == (20,) and fd.n_classes == n_classes
    assert fd.train_sizes.tolist() == [200] * 5
    for c, a, b in zip(fd.clients, p.A, p.b, strict=True):
        assert c.x_train.dtype == torch.float32 and c.y_train.dtype == torch.float32
        torch.testing.assert_close(c.x_train, torch.from_numpy(a).float())
        torch.testing.assert_close(c.y_train, torch.from_numpy(b).float())
        assert c.n_test == 0
    assert fd.x_test.shape == (0, 20) and fd.info["shift_scale"] == 0.5
    if n_classes == 0:
        with pytest.raises(ValueError, match="real-valued targets"):
            fd.label_counts()


@pytest.mark.needs_fmnist
def test_fashion_mnist_shards(fmnist_dir, monkeypatch):
    from dpfl.data import catalog

    monkeypatch.setattr(catalog, "SYSTEM_LOCATIONS", {"fashion_mnist": (fmnist_dir,)})
    fd = federated_dataset("fashion_mnist", 20, partition="shards", max_train_samples=6000, seed=0)
    assert fd.train_sizes.sum() == 6000 and fd.x_test.shape == (10000, 1, 28, 28)
    classes = (fd.label_counts() > 0).sum(axis=1)
    assert classes.max() <= 4 and classes.mean() < 3  # 2 shards, each straddling at most 2 classes


def test_client_val_fraction_gives_80_10_10_and_leaves_the_test_split_alone():
    """The validation split is cut from what the test split leaves, with its own stream (spec fedceo.md §5)."""
    ds = _indexed(n_train=600)
    plain = FederatedDataset.from_arrays(ds, 5, client_test_fraction=0.1, seed=3)
    fd = FederatedDataset.from_arrays(ds, 5, client_test_fraction=0.1, client_val_fraction=0.1, seed=3)
    assert fd.train_sizes.tolist() == [96] * 5 and fd.test_sizes.tolist() == [12] * 5
    assert [c.n_val for c in fd.clients] == [12] * 5
    for c, p in zip(fd.clients, plain.clients, strict=True):
        tr, te, va = (t[:, 0].long().numpy() for t in (c.x_train, c.x_test, c.x_val))
        assert torch.equal(c.x_test, p.x_test)  # adding a validation split does not move the test split
        assert not (set(tr) & set(va)) and not (set(te) & set(va))
        assert sorted([*tr, *va]) == sorted(p.x_train[:, 0].long().tolist())  # carved out of the old train split
        assert torch.equal(c.y_val, torch.from_numpy(va) % 5)  # labels follow their samples
        rest = np.bincount(p.y_train.numpy(), minlength=5) * (12 / 108)  # stratified: each class's share, rounded
        assert np.all(np.abs(np.bincount(c.y_val.numpy(), minlength=5) - rest) < 1)
    assert fd.info["client_val_fraction"] == 0.1 and "client_val_fraction" not in plain.info
    assert all(c.n_val == 0 and c.x_val.shape == (0, 1) for c in plain.clients)
    again = FederatedDataset.from_arrays(ds, 5, client_test_fraction=0.1, client_val_fraction=0.1, seed=3)
    assert all(torch.equal(a.x_val, b.x_val) for a, b in zip(fd.clients, again.clients, strict=True))


@pytest.mark.parametrize("test, val", [(0.5, 0.5), (0.0, 1.0), (0.2, -0.1), (0.9, 0.2)])
def test_client_val_fraction_must_leave_training_data(test, val):
    with pytest.raises(ValueError, match="client_val_fraction must be in"):
        FederatedDataset.from_arrays(_indexed(), 3, client_test_fraction=test, client_val_fraction=val)


# ---- more clients than training records (config fuzzer) -------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"partition": "shards", "shards_per_client": 1}, {"partition": "dirichlet", "alpha": 0.5},
     {"partition": "dirichlet_quota", "alpha": 0.5}, {"client_test_fraction": 0.2}],
)
def test_more_clients_than_records_is_one_short_line_up_front(kwargs):
    """Before: iid handed most of 10^4 clients an empty share (no error), the others failed later or deep
    in the partitioner; a million clients took ~90 s and the engine then listed every empty client."""
    with pytest.raises(ValueError) as err:
        FederatedDataset.from_arrays(_indexed(n_train=50), 10_000, **kwargs)
    msg = str(err.value)
    assert msg == ("n_clients=10000 exceeds the 50 training records of dataset 'indexed': "
                   "every client needs at least one record")


def test_more_clients_than_records_counts_the_subsample():
    with pytest.raises(ValueError, match=r"n_clients=120 exceeds the 100 training records .*max_train_samples=100"):
        FederatedDataset.from_arrays(_indexed(), 120, max_train_samples=100)
    # a max_train_samples above the data is no limit
    with pytest.raises(ValueError, match=r"exceeds the 300 training records of dataset 'indexed': every"):
        FederatedDataset.from_arrays(_indexed(), 301, max_train_samples=10**6)


def test_a_million_clients_on_digits_fails_at_once():
    with pytest.raises(ValueError,
                       match=r"^n_clients=1000000 exceeds the \d+ training records of dataset 'digits'") as err:
        federated_dataset("digits", 10**6)
    assert len(str(err.value)) < 200 and "\n" not in str(err.value)


def test_as_many_clients_as_records_and_explicit_empty_sizes_still_work():
    fd = FederatedDataset.from_arrays(_indexed(n_train=30), 30)
    assert fd.train_sizes.tolist() == [1] * 30
    # iid with explicit sizes may leave clients empty (the rule: one size per client, >= 0, sum <= records)
    fd = FederatedDataset.from_arrays(_indexed(n_train=3), 5, sizes=[1, 1, 1, 0, 0])
    assert fd.train_sizes.tolist() == [1, 1, 1, 0, 0]
    with pytest.raises(ValueError, match="sizes must sum to at most n=3"):
        FederatedDataset.from_arrays(_indexed(n_train=3), 5, sizes=[1, 1, 1, 1, 0])


@pytest.mark.parametrize("n_clients", [0, -3, True, 2.0, None])
def test_bad_n_clients(n_clients):
    with pytest.raises(ValueError, match="n_clients must be an int >= 1"):
        FederatedDataset.from_arrays(_indexed(), n_clients)


def test_features_follow_a_float64_network_and_labels_stay():
    """A float64 network (MP-DP's) reads float64 records: `with_feature_dtype` casts every client's and the test
    set's features exactly and leaves the labels; a dataset already in that dtype is returned as is."""
    import torch

    from dpfl.data.federated import ClientData, FederatedDataset

    x = torch.rand(6, 2, dtype=torch.float32)
    y = torch.tensor([0, 1, 0, 1, 1, 0])
    data = FederatedDataset([ClientData(x[:3], y[:3], x[3:4], y[3:4]), ClientData(x[4:], y[4:], x[:0], y[:0])],
                            x, y, 2, (2,))
    wide = data.with_feature_dtype(torch.float64)
    assert wide.x_test.dtype == torch.float64 and torch.equal(wide.x_test, x.double())
    assert all(c.x_train.dtype == torch.float64 and c.x_test.dtype == torch.float64 for c in wide.clients)
    assert wide.clients[0].y_train is data.clients[0].y_train
    assert data.with_feature_dtype(torch.float32) is data and wide.with_feature_dtype(torch.float64) is wide

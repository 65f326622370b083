"""A dataset split among clients: per-client train/test tensors plus a global test set.

Built from an ArrayDataset by partitioning its TRAIN split only; the dataset's own test split stays
whole as the global test set, so accuracy numbers remain comparable with centralised results.
Random streams (dpfl.seeding, keyed by the seed): the optional subsample uses (DATA, round 1), the partition
(PARTITION, round 0, client 0), client i's train/test split (PARTITION, round 1, client i) and its
train/validation split (PARTITION, round 2, client i), so adding a validation split leaves the test splits as
they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dpfl.data.arrays import ArrayDataset
from dpfl.data.partition import dirichlet, dirichlet_quota, iid, iid_equal, label_shards
from dpfl.data.splits import stratified_split
from dpfl.seeding import Purpose, numpy_generator

PARTITIONS = ("iid", "shards", "dirichlet", "dirichlet_quota", "iid_equal")


def _empty_like_rows(x: torch.Tensor) -> torch.Tensor:
    return x[:0].clone()


def _rows_per_client(x: torch.Tensor, y: torch.Tensor,
                     indices: list[np.ndarray]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x[idx], y[idx]) for each client's row indices, gathered in one operation and split into views."""
    sizes = [len(idx) for idx in indices]
    flat = torch.from_numpy(np.concatenate(indices) if indices else np.empty(0, dtype=np.int64))
    xs, ys = torch.split(x[flat], sizes), torch.split(y[flat], sizes)
    return list(zip(xs, ys, strict=True))


@dataclass
class ClientData:
    """One client's local train and test tensors, and an optional validation split (for tuning, never trained on).

    ``x_val``/``y_val`` default to empty tensors shaped like the test split.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.x_val is None:
            self.x_val = _empty_like_rows(self.x_test)
        if self.y_val is None:
            self.y_val = _empty_like_rows(self.y_test)

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.x_test.shape[0])

    @property
    def n_val(self) -> int:
        return int(self.x_val.shape[0])


@dataclass
class FederatedDataset:
    """Clients' data, the global test set and what a model needs to know (classes, sample shape).

    ``n_classes == 0`` marks real-valued targets (least squares). ``info`` records how the split
    was made (dataset name, partition, seed, ...) for the run's config and reports.
    """

    clients: list[ClientData]
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_classes: int
    input_shape: tuple[int, ...]
    info: dict = field(default_factory=dict)

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    @property
    def train_sizes(self) -> np.ndarray:
        return np.array([c.n_train for c in self.clients], dtype=np.int64)

    @property
    def test_sizes(self) -> np.ndarray:
        return np.array([c.n_test for c in self.clients], dtype=np.int64)

    def label_counts(self) -> np.ndarray:
        """(n_clients, n_classes) counts of each class in each client's train split."""
        if self.n_classes < 1:
            raise ValueError("label_counts needs class labels; this dataset has real-valued targets (n_classes=0)")
        return np.stack(
            [np.bincount(c.y_train.numpy(), minlength=self.n_classes) for c in self.clients]
        ).astype(np.int64)

    def with_feature_dtype(self, dtype: torch.dtype) -> FederatedDataset:
        """This dataset with floating-point features in `dtype` (a float64 network reads float64 records; a float32
        record converts exactly); itself if they already are, or if the features are not floating point."""
        xs = [self.x_test, *(t for c in self.clients for t in (c.x_train, c.x_test, c.x_val))]
        if not dtype.is_floating_point or all(t is None or not t.is_floating_point() or t.dtype == dtype for t in xs):
            return self
        cast = lambda t: t.to(dtype) if t is not None and t.is_floating_point() else t  # noqa: E731
        clients = [ClientData(cast(c.x_train), c.y_train, cast(c.x_test), c.y_test, cast(c.x_val), c.y_val)
                   for c in self.clients]
        return FederatedDataset(clients, cast(self.x_test), self.y_test, self.n_classes, self.input_shape,
                                dict(self.info))

    @classmethod
    def from_arrays(
        cls,
        ds: ArrayDataset,
        n_clients: int,
        partition: str = "iid",
        alpha: float = 0.5,
        shards_per_client: int = 2,
        sizes: Sequence[int] | None = None,
        client_test_fraction: float = 0.0,
        seed: int = 0,
        max_train_samples: int | None = None,
        client_val_fraction: float = 0.0,
        samples_per_client: int | None = None,
    ) -> FederatedDataset:
        """Partition ``ds``'s train split among ``n_clients`` (``partition`` = iid | shards | dirichlet |
        dirichlet_quota).

        ``max_train_samples`` first keeps a seeded random subset of the train split;
        ``client_test_fraction`` then holds out a stratified share of each client's data as its
        local test set, and ``client_val_fraction`` (of the client's whole share, e.g. 0.1 and 0.1 for the
        80/10/10 split) a stratified validation set from what remains. ``sizes`` applies to iid only, ``alpha`` to
        dirichlet and dirichlet_quota, ``shards_per_client`` to shards; ``samples_per_client`` (dirichlet_quota and
        iid_equal) is each client's quota, default floor(train samples / clients). iid_equal (MP-DP's comparison):
        equal shards of one permutation, each in the permutation's order.
        """
        if partition not in PARTITIONS:
            raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
        if samples_per_client is not None and partition not in ("dirichlet_quota", "iid_equal"):
            raise ValueError("samples_per_client applies to partitions 'dirichlet_quota' and 'iid_equal' only, got "
                             f"{partition!r}")
        if sizes is not None and partition != "iid":
            raise ValueError(f"sizes applies to partition='iid' only, got partition={partition!r}")
        if not 0.0 <= client_test_fraction < 1.0:
            raise ValueError(f"client_test_fraction must be in [0, 1), got {client_test_fraction!r}")
        if not 0.0 <= client_val_fraction < 1.0 or client_test_fraction + client_val_fraction >= 1.0:
            raise ValueError("client_val_fraction must be in [0, 1) and leave training data "
                             f"(client_test_fraction + client_val_fraction < 1), got {client_val_fraction!r} with "
                             f"client_test_fraction {client_test_fraction!r}")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if not isinstance(n_clients, (int, np.integer)) or isinstance(n_clients, bool) or n_clients < 1:
            raise ValueError(f"n_clients must be an int >= 1, got {n_clients!r}")
        if max_train_samples is not None and (
            not isinstance(max_train_samples, (int, np.integer)) or isinstance(max_train_samples, bool)
            or max_train_samples < 1
        ):
            raise ValueError(f"max_train_samples must be an int >= 1 or None, got {max_train_samples!r}")
        available = ds.n_train if max_train_samples is None else min(ds.n_train, int(max_train_samples))
        # Before any per-client work. Only iid with explicit ``sizes`` may leave clients empty (a size of 0);
        # its rule (one size per client, sizes >= 0, summing to at most the records) is checked by ``iid``.
        if sizes is None and n_clients > available:
            limited = f" (max_train_samples={max_train_samples})" if available < ds.n_train else ""
            raise ValueError(f"n_clients={n_clients} exceeds the {available} training records of dataset "
                             f"{ds.name!r}{limited}: every client needs at least one record")
        pool = np.arange(ds.n_train, dtype=np.int64)
        if max_train_samples is not None and max_train_samples < ds.n_train:
            chosen = numpy_generator(seed, Purpose.DATA, 1).choice(ds.n_train, max_train_samples, replace=False)
            pool = np.sort(chosen)
        labels = ds.y_train.numpy()[pool]
        rng = numpy_generator(seed, Purpose.PARTITION)
        if partition == "iid":
            parts = iid(len(pool), n_clients, rng, sizes=sizes)
        elif partition == "iid_equal":
            parts = iid_equal(len(pool), n_clients, rng, samples_per_client)
        elif partition == "shards":
            parts = label_shards(labels, n_clients, shards_per_client, rng)
        elif partition == "dirichlet_quota":
            quota = len(pool) // n_clients if samples_per_client is None else samples_per_client
            parts = dirichlet_quota(labels, n_clients, alpha, quota, rng)
        else:
            parts = dirichlet(labels, n_clients, alpha, rng)
        splits: dict[str, list[np.ndarray]] = {"train": [], "test": [], "val": []}
        for i, part in enumerate(parts):
            if client_test_fraction > 0:
                train_pos, test_pos = stratified_split(
                    labels[part], client_test_fraction, numpy_generator(seed, Purpose.PARTITION, 1, i)
                )
            else:  # nothing held out, nothing drawn (a generator per client costs ~60 us, 6 s for 100,000 clients)
                train_pos, test_pos = np.arange(len(part), dtype=np.int64), np.empty(0, dtype=np.int64)
            val_pos = np.empty(0, dtype=np.int64)
            if client_val_fraction > 0 and len(train_pos):
                # a fraction of the rest that makes the validation split client_val_fraction of the whole share
                keep, held = stratified_split(labels[part[train_pos]],
                                              client_val_fraction / (1.0 - client_test_fraction),
                                              numpy_generator(seed, Purpose.PARTITION, 2, i))
                train_pos, val_pos = train_pos[keep], train_pos[held]
            for name, pos in (("train", train_pos), ("test", test_pos), ("val", val_pos)):
                splits[name].append(pool[part[pos]])
        # One gather per split for all clients, then views per client: thousands of tiny index ops would each
        # pay torch's thread start-up (20x slower than the gather itself on a busy 2-core machine).
        views = {name: _rows_per_client(ds.x_train, ds.y_train, idx) for name, idx in splits.items()}
        clients = [ClientData(*views["train"][i], *views["test"][i], *views["val"][i]) for i in range(len(parts))]
        info = dict(
            dataset=ds.name, n_clients=n_clients, partition=partition, seed=int(seed),
            client_test_fraction=client_test_fraction, max_train_samples=max_train_samples,
        )
        if client_val_fraction:
            info["client_val_fraction"] = client_val_fraction
        if partition == "iid_equal" and samples_per_client is not None:
            info["samples_per_client"] = int(samples_per_client)
        if partition == "dirichlet":
            info["alpha"] = alpha
        elif partition == "shards":
            info["shards_per_client"] = shards_per_client
        elif sizes is not None:
            info["sizes"] = [int(s) for s in sizes]
        return cls(clients, ds.x_test, ds.y_test, ds.n_classes, ds.input_shape, info)

    @classmethod
    def from_convex(cls, problem) -> FederatedDataset:  # noqa: ANN001 (ConvexProblem; avoids an import cycle)
        """Clients with ``x = A_i`` and ``y = b_i`` (float32) and no test data, for the convex problems.

        Least squares has real targets (``n_classes = 0``); logistic labels stay in {-1, +1} as the
        loss expects, with ``n_classes = 2``.
        """
        d = problem.dim
        empty_x = torch.empty((0, d), dtype=torch.float32)
        empty_y = torch.empty(0, dtype=torch.float32)
        clients = [
            ClientData(
                torch.from_numpy(np.asarray(a, dtype=np.float32)),
                torch.from_numpy(np.asarray(b, dtype=np.float32)),
                empty_x.clone(),
                empty_y.clone(),
            )
            for a, b in zip(problem.A, problem.b, strict=True)
        ]
        n_classes = 2 if problem.kind == "logistic" else 0
        info = dict(dataset=problem.kind, **problem.params)
        return cls(clients, empty_x, empty_y, n_classes, (d,), info)

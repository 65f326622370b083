"""A dataset split among clients: per-client train/test tensors plus a global test set.

Built from an ArrayDataset by partitioning its TRAIN split only; the dataset's own test split stays
whole as the global test set, so accuracy numbers remain comparable with centralised results.
Random streams (dpfl.seeding, keyed by the seed): the optional subsample uses (DATA, round 1), the partition
(PARTITION, round 0, client 0), client i's train/test split (PARTITION, round 1, client i) and its
train/validation split (PARTITION, round 2, client i), so adding a validation split leaves the test splits as
they were.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np
import torch

from dpfl.data.arrays import ArrayDataset
from dpfl.data.partition import dirichlet, dirichlet_quota, iid_equal, iid_flat, label_shards
from dpfl.data.splits import stratified_split
from dpfl.seeding import Purpose, numpy_generator

PARTITIONS = ("iid", "shards", "dirichlet", "dirichlet_quota", "iid_equal")


def _empty_like_rows(x: torch.Tensor) -> torch.Tensor:
    return x[:0].clone()


SPLITS = ("train", "test", "val")


class PooledClients(Sequence["ClientData"]):
    """Every client's train, test and validation records as one tensor per split plus offsets: client i's rows of a
    split are ``offsets[i] : offsets[i + 1]``. A sequence of ClientData, each made on access from views, so a
    population holds 24 bytes per client (three offsets) besides its records, not six tensor objects per client.

    ``splits`` maps each of "train", "test", "val" to (x, y, offsets), offsets an int64 array of n_clients + 1.
    """

    def __init__(self, splits: dict[str, tuple[torch.Tensor, torch.Tensor, np.ndarray]]) -> None:
        if set(splits) != set(SPLITS):
            raise ValueError(f"splits must be {SPLITS}, got {sorted(splits)}")
        lengths = {len(offsets) for _, _, offsets in splits.values()}
        if len(lengths) != 1 or min(lengths) < 1:
            raise ValueError("every split needs the same n_clients + 1 offsets")
        for name, (x, y, offsets) in splits.items():
            if offsets[0] != 0 or offsets[-1] != len(x) or len(x) != len(y) or (np.diff(offsets) < 0).any():
                raise ValueError(f"split {name!r}: offsets must rise from 0 to its {len(x)} rows")
        self._splits = {name: (x, y, np.asarray(offsets, dtype=np.int64)) for name, (x, y, offsets) in splits.items()}

    def __len__(self) -> int:
        return len(self._splits["train"][2]) - 1

    @overload
    def __getitem__(self, i: int) -> ClientData: ...
    @overload
    def __getitem__(self, i: slice) -> list[ClientData]: ...

    def __getitem__(self, i: int | slice) -> ClientData | list[ClientData]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        j = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"client {i} out of range ({n} clients)")
        views = []
        for name in SPLITS:
            x, y, offsets = self._splits[name]
            lo, hi = int(offsets[j]), int(offsets[j + 1])
            views += [x[lo:hi], y[lo:hi]]
        return ClientData(*views)

    def __iter__(self) -> Iterator[ClientData]:
        return (self[j] for j in range(len(self)))

    def split(self, name: str) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """(x, y, offsets) of split `name` ("train", "test" or "val") for every client."""
        return self._splits[name]

    def sizes(self, name: str) -> np.ndarray:
        """Each client's record count in split `name`."""
        return np.diff(self._splits[name][2])

    def map_features(self, cast) -> PooledClients:  # noqa: ANN001 (a tensor -> tensor function)
        """These clients with `cast` applied to every split's features."""
        return PooledClients({name: (cast(x), y, offsets) for name, (x, y, offsets) in self._splits.items()})

    @classmethod
    def gather(cls, x: torch.Tensor, y: torch.Tensor, splits: dict[str, tuple[np.ndarray, np.ndarray]]
               ) -> PooledClients:
        """Clients whose split `name` holds rows ``flat[offsets[i]:offsets[i + 1]]`` of (x, y), for `splits` mapping
        name -> (flat row indices, offsets): one gather per split for all clients."""
        return cls({name: (x[torch.from_numpy(flat)], y[torch.from_numpy(flat)], offsets)
                    for name, (flat, offsets) in splits.items()})


def _offsets(sizes: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))]).astype(np.int64)


def _local_splits(parts: Sequence[np.ndarray], pool: np.ndarray, labels: np.ndarray, test_fraction: float,
                  val_fraction: float, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each client's share `parts[i]` (positions in `pool`) split into train, test and validation rows: split name ->
    (the rows of every client in client order, offsets)."""
    splits: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
    for i, part in enumerate(parts):
        if test_fraction > 0:
            train_pos, test_pos = stratified_split(labels[part], test_fraction,
                                                   numpy_generator(seed, Purpose.PARTITION, 1, i))
        else:  # nothing held out, nothing drawn (a generator per client costs ~60 us, 6 s for 100,000 clients)
            train_pos, test_pos = np.arange(len(part), dtype=np.int64), np.empty(0, dtype=np.int64)
        val_pos = np.empty(0, dtype=np.int64)
        if val_fraction > 0 and len(train_pos):
            # a fraction of the rest that makes the validation split val_fraction of the whole share
            keep, held = stratified_split(labels[part[train_pos]], val_fraction / (1.0 - test_fraction),
                                          numpy_generator(seed, Purpose.PARTITION, 2, i))
            train_pos, val_pos = train_pos[keep], train_pos[held]
        for name, pos in (("train", train_pos), ("test", test_pos), ("val", val_pos)):
            splits[name].append(pool[part[pos]])
    return {name: (np.concatenate(idx).astype(np.int64) if idx else np.zeros(0, dtype=np.int64),
                   _offsets([len(a) for a in idx])) for name, idx in splits.items()}


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
    was made (dataset name, partition, seed, ...) for the run's config and reports. ``clients`` is any sequence of
    ClientData: a list, or (``from_arrays``) a PooledClients that makes each on access.
    """

    clients: Sequence[ClientData]
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
        if isinstance(self.clients, PooledClients):
            return self.clients.sizes("train")
        return np.array([c.n_train for c in self.clients], dtype=np.int64)

    @property
    def test_sizes(self) -> np.ndarray:
        if isinstance(self.clients, PooledClients):
            return self.clients.sizes("test")
        return np.array([c.n_test for c in self.clients], dtype=np.int64)

    def label_counts(self) -> np.ndarray:
        """(n_clients, n_classes) counts of each class in each client's train split."""
        if self.n_classes < 1:
            raise ValueError("label_counts needs class labels; this dataset has real-valued targets (n_classes=0)")
        if isinstance(self.clients, PooledClients):
            _, y, offsets = self.clients.split("train")
            owner = np.repeat(np.arange(len(self.clients), dtype=np.int64), np.diff(offsets))
            labels = y.numpy().astype(np.int64)
            width = max(self.n_classes, int(labels.max()) + 1 if len(labels) else 0)
            return np.bincount(owner * width + labels, minlength=len(self.clients) * width).reshape(
                len(self.clients), width).astype(np.int64)
        return np.stack(
            [np.bincount(c.y_train.numpy(), minlength=self.n_classes) for c in self.clients]
        ).astype(np.int64)

    def with_feature_dtype(self, dtype: torch.dtype) -> FederatedDataset:
        """This dataset with floating-point features in `dtype` (a float64 network reads float64 records; a float32
        record converts exactly); itself if they already are, or if the features are not floating point."""
        xs = [self.x_test, *((self.clients.split(name)[0] for name in SPLITS) if isinstance(self.clients, PooledClients)
                             else (t for c in self.clients for t in (c.x_train, c.x_test, c.x_val)))]
        if not dtype.is_floating_point or all(t is None or not t.is_floating_point() or t.dtype == dtype for t in xs):
            return self
        cast = lambda t: t.to(dtype) if t is not None and t.is_floating_point() else t  # noqa: E731
        if isinstance(self.clients, PooledClients):
            return FederatedDataset(self.clients.map_features(cast), cast(self.x_test), self.y_test, self.n_classes,
                                    self.input_shape, dict(self.info))
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
        parts: list[np.ndarray] | tuple[np.ndarray, np.ndarray]
        if partition == "iid":
            parts = iid_flat(len(pool), n_clients, rng, sizes=sizes)
        elif partition == "iid_equal":
            parts = iid_equal(len(pool), n_clients, rng, samples_per_client)
        elif partition == "shards":
            parts = label_shards(labels, n_clients, shards_per_client, rng)
        elif partition == "dirichlet_quota":
            quota = len(pool) // n_clients if samples_per_client is None else samples_per_client
            parts = dirichlet_quota(labels, n_clients, alpha, quota, rng)
        else:
            parts = dirichlet(labels, n_clients, alpha, rng)
        if isinstance(parts, tuple) and client_test_fraction == 0 and client_val_fraction == 0:
            # iid's flat form (indices, counts) and nothing held out: no Python per client
            flat, counts = parts
            none = (np.zeros(0, dtype=np.int64), np.zeros(len(counts) + 1, dtype=np.int64))
            flat_of = {"train": (pool[flat], _offsets(counts)), "test": none, "val": none}
        else:
            if isinstance(parts, tuple):
                flat, counts = parts
                parts = np.split(flat, np.cumsum(counts)[:-1])
            flat_of = _local_splits(parts, pool, labels, client_test_fraction, client_val_fraction, seed)
        # One gather per split for all clients, kept pooled: a client's ClientData is made of views on access.
        clients = PooledClients.gather(ds.x_train, ds.y_train, flat_of)
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

"""A federated dataset from one file or folder per client: `federated_files`, the config's ``data.silos``.

Built on the provided-data path (`dpfl.federated_data`): each silo is one client, as given; nothing re-splits them
among clients. A client may keep a stratified share of its own records for local testing or validation (the same
seeded streams as a partitioned dataset's `client_test_fraction` and `client_val_fraction`); the global model is
evaluated on a shared test file, or on the union of those local test splits.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpfl.data.errors import DataError
from dpfl.data.federated import ClientData, FederatedDataset
from dpfl.data.provided import federated_data
from dpfl.data.schema import Scaling, SiloSchema, as_scaling
from dpfl.data.silo_files import read_records
from dpfl.data.splits import stratified_split
from dpfl.seeding import Purpose, numpy_generator

__all__ = ["FILES", "federated_files", "silo_client"]

FILES = "files"  # the dataset name of data read from the user's silo files (data.silos in a config)


def federated_files(silos: Sequence[str | Path], schema: SiloSchema, *, test: str | Path | None = None,
                    client_test_fraction: float = 0.0, client_val_fraction: float = 0.0, seed: int = 0,
                    scaling: Scaling | Any = None, names: Sequence[str] | None = None) -> FederatedDataset:
    """One client per silo path, in order, each checked against `schema` (`silo_client`, on `load_silo`'s reading).

    `test` is a shared test file in any silo format; without it, ``client_test_fraction`` > 0 holds out a share of
    every silo and the global test set is their union. `scaling` (public statistics: a `Scaling` or ``{"mean": [...],
    "std": [...]}``; "fit" and the like are refused) applies to every file alike.
    Raises `DataError`, one line naming the file and the row or column.
    """
    if isinstance(silos, (str, Path)) or not len(silos):
        raise DataError("silos: give a list with one file or folder per client")
    _check_fractions(client_test_fraction, client_val_fraction)
    if test is None and client_test_fraction == 0:
        raise DataError("give a shared test file (test) or hold out a share of each silo (client_test_fraction > 0): "
                        "dpfl evaluates the global model on it")
    scaling = as_scaling(scaling)
    where = [os.path.abspath(s) for s in silos]
    for i, p in enumerate(where):
        if p in where[:i]:
            raise DataError(f"{silos[i]}: listed as silo {where.index(p)} and {i}; every client has its own silo")
    if test is not None and os.path.abspath(test) in where:
        raise DataError(f"{test}: the test file is also silo {where.index(os.path.abspath(test))}: the global model "
                        "would be evaluated on records it trained on")
    names = [Path(s).stem or Path(s).name for s in silos] if names is None else list(names)
    clients = []
    for i, source in enumerate(silos):
        c = silo_client(source, schema, client=i, seed=seed, client_test_fraction=client_test_fraction,
                        client_val_fraction=client_val_fraction, scaling=scaling)
        clients.append({"train": (c.x_train, c.y_train), "test": (c.x_test, c.y_test), "val": (c.x_val, c.y_val)})
    shared = read_records(test, schema, scaling) if test is not None else None
    data = federated_data(clients, test=shared, n_classes=schema.n_classes, name=FILES)
    data.info.update(silos=[str(n) for n in names], test=str(test) if test is not None else "client_test_fraction",
                     client_test_fraction=client_test_fraction, seed=int(seed))
    if client_val_fraction:
        data.info["client_val_fraction"] = client_val_fraction
    return data


def silo_client(source: str | Path, schema: SiloSchema, *, client: int, seed: int = 0,
                client_test_fraction: float = 0.0, client_val_fraction: float = 0.0,
                scaling: Scaling | Any = None) -> ClientData:
    """Client `client`'s data from its own silo alone, with the local test/validation shares `federated_files` gives
    it (the same seeded streams): what one node of a deployment loads, without reading the other silos."""
    _check_fractions(client_test_fraction, client_val_fraction)
    x, y = read_records(source, schema, scaling)
    train, held, val = _split(y, client_test_fraction, client_val_fraction, seed, client)
    if not len(train):
        raise DataError(f"{source}: its {len(y)} records leave none for training after client_test_fraction "
                        f"{client_test_fraction} and client_val_fraction {client_val_fraction}")
    t = {k: (torch.from_numpy(np.ascontiguousarray(x[i])), torch.from_numpy(np.ascontiguousarray(y[i])))
         for k, i in (("train", train), ("test", held), ("val", val))}
    return ClientData(*t["train"], *t["test"], *t["val"])


def _check_fractions(test_fraction: float, val_fraction: float) -> None:
    if not 0.0 <= test_fraction < 1.0 or not 0.0 <= val_fraction < 1.0 or test_fraction + val_fraction >= 1.0:
        raise DataError(f"client_test_fraction ({test_fraction}) and client_val_fraction ({val_fraction}) must be in "
                        "[0, 1) and leave training records")


def _split(y: np.ndarray, test_fraction: float, val_fraction: float, seed: int,
           client: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, test, val) positions of one silo: the streams of `FederatedDataset.from_arrays`'s local splits."""
    train = np.arange(len(y), dtype=np.int64)
    test = val = np.empty(0, dtype=np.int64)
    if test_fraction > 0:
        train, test = stratified_split(y, test_fraction, numpy_generator(seed, Purpose.PARTITION, 1, client))
    if val_fraction > 0 and len(train):
        keep, held = stratified_split(y[train], val_fraction / (1.0 - test_fraction),
                                      numpy_generator(seed, Purpose.PARTITION, 2, client))
        train, val = train[keep], train[held]
    return train, test, val

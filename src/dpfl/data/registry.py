"""Dataset names -> loaders, with option checking, and the one-call federated dataset.

Each loader takes keyword options; an unknown option is an error naming the allowed ones, so a
typo in a config (``normalise=``) fails instead of being silently ignored. ``register_dataset`` adds a
user's own loader under a name, so configs (and ``dpfl.run``) can use it like a built-in dataset.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path

from dpfl.data.arrays import ArrayDataset
from dpfl.data.builtin import load_digits, make_classification
from dpfl.data.federated import FederatedDataset
from dpfl.data.image_files import load_cifar10, load_cifar100, load_emnist, load_mnist_like

_LOADERS: dict[str, Callable[..., ArrayDataset]] = {
    "digits": load_digits,
    "fashion_mnist": functools.partial(load_mnist_like, "fashion_mnist"),
    "mnist": functools.partial(load_mnist_like, "mnist"),
    "emnist": load_emnist,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "synthetic": make_classification,
}

DATASETS: tuple[str, ...] = tuple(_LOADERS)  # the built-in datasets; `dataset_names()` adds registered ones
PROVIDED = "provided"  # a dataset passed as an object to dpfl.run(data=...): no loader, never a registered name


def register_dataset(name: str, loader: Callable[..., ArrayDataset], *, replace: bool = False) -> None:
    """Make `loader` available as dataset `name` (in configs: ``data: {dataset: name, options: {...}}``).

    ``loader(**options)`` returns an `ArrayDataset` (train/test tensors; the train split is partitioned among
    clients, the test split is the global test set). Its keyword-only parameters are the dataset's options;
    a parameter named ``seed`` receives the run seed, one named ``root`` the config's ``data.root``.
    Built-in names cannot be replaced; a registered name only with ``replace=True``.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a dataset name must be an identifier (letters, digits, _), got {name!r}")
    if name in DATASETS or name == PROVIDED:
        raise ValueError(f"{name!r} is a built-in dataset name; choose another name")
    if name in _LOADERS and not replace:
        raise ValueError(f"dataset {name!r} is already registered; pass replace=True to replace it")
    if not callable(loader):
        raise ValueError(f"loader must be callable, got {type(loader).__name__}")
    _LOADERS[name] = loader


def dataset_names() -> tuple[str, ...]:
    """Every dataset name a config may use: the built-in ones, then the registered ones."""
    return tuple(_LOADERS)

# FederatedDataset.from_arrays arguments that federated_dataset routes away from the loader.
_SPLIT_OPTIONS = ("partition", "alpha", "shards_per_client", "sizes", "client_test_fraction", "max_train_samples",
                  "client_val_fraction", "samples_per_client")


def dataset_options(name: str) -> tuple[str, ...]:
    """The keyword options ``load_dataset(name, ...)`` accepts (besides ``root``)."""
    loader = _loader(name)
    params = inspect.signature(loader).parameters
    return tuple(p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY and p != "root")


def load_dataset(name: str, root: str | Path | None = None, **options) -> ArrayDataset:
    """Load ``name`` (one of DATASETS) as tensors; ``root`` is a directory to look in first.

    Options per dataset: ``normalize=(mean, std)`` for images, ``download`` for file-backed sets,
    ``split`` for emnist, ``labels`` for cifar100, ``n_samples, n_features, n_classes, class_sep,
    test_fraction, seed`` for synthetic.
    """
    loader = _loader(name)
    allowed = dataset_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for dataset {name!r}; allowed: {', '.join(allowed) or 'none'}"
        )
    takes_root = "root" in inspect.signature(loader).parameters
    if root is not None and not takes_root:
        raise ValueError(f"dataset {name!r} reads no files, so root must be None, got {root!r}")
    ds = loader(root=root, **options) if takes_root else loader(**options)
    if not isinstance(ds, ArrayDataset):
        raise ValueError(f"the loader of dataset {name!r} must return a dpfl.data.ArrayDataset, "
                         f"got {type(ds).__name__}")
    return ds


def federated_dataset(
    name: str, n_clients: int, root: str | Path | None = None, seed: int = 0, **kw
) -> FederatedDataset:
    """Load ``name`` and split it among ``n_clients`` in one call.

    Keywords of ``FederatedDataset.from_arrays`` (partition, alpha, shards_per_client, sizes,
    client_test_fraction, client_val_fraction, max_train_samples) go to the split; the rest are dataset options.
    ``seed`` drives the split and, for ``synthetic``, the data too (one run seed, separate streams).
    """
    split_kw = {k: kw.pop(k) for k in _SPLIT_OPTIONS if k in kw}
    if "seed" in dataset_options(name):
        kw["seed"] = seed
    ds = load_dataset(name, root, **kw)
    return FederatedDataset.from_arrays(ds, n_clients, seed=seed, **split_kw)


def _loader(name: str) -> Callable[..., ArrayDataset]:
    if name == PROVIDED:
        raise ValueError(f"dataset {PROVIDED!r} is data passed as an object to dpfl.run(data=...); it has no loader")
    if name not in _LOADERS:
        raise ValueError(f"dataset must be one of {', '.join(_LOADERS)}, got {name!r}")
    return _LOADERS[name]

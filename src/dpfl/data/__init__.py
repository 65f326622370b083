"""Datasets for dpfl: sources (local, system, download), loaders, partitioners, federated splits, convex generators."""

from dpfl.data.arrays import ArrayDataset
from dpfl.data.errors import ChecksumError, DatasetNotFoundError
from dpfl.data.federated import ClientData, FederatedDataset
from dpfl.data.idx import IdxFormatError, read_idx, write_idx
from dpfl.data.partition import dirichlet, iid, label_shards
from dpfl.data.registry import DATASETS, dataset_options, federated_dataset, load_dataset
from dpfl.data.sources import Location, available, fetch, locate
from dpfl.data.synthetic import ConvexProblem, heterogeneity, make_least_squares, make_logistic

__all__ = [
    "DATASETS",
    "ArrayDataset",
    "ChecksumError",
    "ClientData",
    "ConvexProblem",
    "DatasetNotFoundError",
    "FederatedDataset",
    "IdxFormatError",
    "Location",
    "available",
    "dataset_options",
    "dirichlet",
    "federated_dataset",
    "fetch",
    "heterogeneity",
    "iid",
    "label_shards",
    "load_dataset",
    "locate",
    "make_least_squares",
    "make_logistic",
    "read_idx",
    "write_idx",
]

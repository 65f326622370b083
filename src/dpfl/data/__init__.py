"""Datasets for dpfl: sources (local, system, download), loaders, partitioners, federated splits, convex generators,
and the user's own silo files (`load_silo` for one client, `federated_files` for all)."""

from dpfl.data.arrays import ArrayDataset
from dpfl.data.errors import ChecksumError, DataError, DatasetNotFoundError
from dpfl.data.federated import ClientData, FederatedDataset
from dpfl.data.idx import IdxFormatError, read_idx, write_idx
from dpfl.data.partition import dirichlet, iid, label_shards
from dpfl.data.registry import DATASETS, dataset_options, federated_dataset, load_dataset
from dpfl.data.schema import Scaling, SiloSchema
from dpfl.data.silo_files import load_silo
from dpfl.data.silos import federated_files, silo_client
from dpfl.data.sources import Location, available, fetch, locate
from dpfl.data.synthetic import ConvexProblem, heterogeneity, make_least_squares, make_logistic

__all__ = [
    "DATASETS",
    "ArrayDataset",
    "ChecksumError",
    "ClientData",
    "ConvexProblem",
    "DataError",
    "DatasetNotFoundError",
    "FederatedDataset",
    "IdxFormatError",
    "Location",
    "Scaling",
    "SiloSchema",
    "available",
    "dataset_options",
    "dirichlet",
    "federated_dataset",
    "federated_files",
    "fetch",
    "heterogeneity",
    "iid",
    "label_shards",
    "load_dataset",
    "load_silo",
    "locate",
    "make_least_squares",
    "make_logistic",
    "read_idx",
    "silo_client",
    "write_idx",
]

"""Errors raised by the data layer, so callers can tell a missing dataset from a corrupt one, and a data problem
from a config problem (`dpfl.ConfigError`)."""

from __future__ import annotations


class DatasetNotFoundError(FileNotFoundError):
    """No location holds the dataset's files; the message lists every place tried and how to get it."""


class ChecksumError(ValueError):
    """Downloaded or local bytes do not match the published checksum, so they are not used."""


class DataError(ValueError):
    """The user's data does not fit what was declared: a silo file that is missing, unreadable or breaks the
    schema (columns, dtypes, labels outside the classes, NaN/inf, no records), or data objects that cannot form a
    federated dataset. One line that names the file (or client) and the row or column; a ValueError, so code that
    caught ValueError before keeps working."""

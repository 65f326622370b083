"""Errors raised by the data layer, so callers can tell a missing dataset from a corrupt one."""

from __future__ import annotations


class DatasetNotFoundError(FileNotFoundError):
    """No location holds the dataset's files; the message lists every place tried and how to get it."""


class ChecksumError(ValueError):
    """Downloaded or local bytes do not match the published checksum, so they are not used."""

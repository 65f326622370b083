"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config):
    """Under pytest-xdist (`-n auto` in pyproject.toml), give each worker its share of the cores: every
    worker's torch would otherwise start one thread per core, and 2 workers x 2 threads on 2 cores spend
    their time switching. OMP_NUM_THREADS passes the same count to the runs tests start in subprocesses (a
    killed-and-resumed subprocess run must match the in-process one, thread count included). Tests that need
    more threads set them themselves."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        threads = max(1, torch.get_num_threads() // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


@pytest.fixture
def clean_registries():
    """Tests that register datasets, models, losses, stages or algorithms leave the registries as they were."""
    import dpfl.algorithms.registry as stages
    import dpfl.data.registry as datasets
    import dpfl.engine.losses as losses
    import dpfl.models.registry as models

    stages.algorithm_names()  # dpfl's own algorithms are loaded before the table is saved
    tables = [datasets._LOADERS, models._ENTRIES, models._BUILDERS, losses.LOSSES, stages.AGGREGATORS,
              stages.LOCAL_PROGRAMS, stages.ALGORITHMS]
    saved = [dict(t) for t in tables]
    yield
    for table, before in zip(tables, saved, strict=True):
        table.clear()
        table.update(before)

"""Fixtures shared by the whole suite."""

from __future__ import annotations

import pytest


@pytest.fixture
def clean_registries():
    """Tests that register datasets, models, losses or stages leave the process's registries as they were."""
    import dpfl.algorithms.registry as stages
    import dpfl.data.registry as datasets
    import dpfl.engine.losses as losses
    import dpfl.models.registry as models

    tables = [datasets._LOADERS, models._ENTRIES, models._BUILDERS, losses.LOSSES, stages.AGGREGATORS,
              stages.LOCAL_PROGRAMS]
    saved = [dict(t) for t in tables]
    yield
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)

"""Shared fixtures of the privacy tests."""

import logging

import pytest


@pytest.fixture(scope="module")
def quiet_absl():
    """dp_accounting used directly logs a warning per non-convergent fractional order; emitting them is slow."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)

"""Fixtures of the reproduction tests: offline, and real runs only when Fashion-MNIST is on this machine."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("DPFL_OFFLINE", "1")


@pytest.fixture(scope="session")
def fmnist() -> None:
    """Skip a test that runs jobs when Fashion-MNIST is not available locally."""
    from dpfl.data import available

    if not any(r["name"] == "fashion_mnist" and r.get("source") != "missing" for r in available()):
        pytest.skip("Fashion-MNIST is not on this machine")

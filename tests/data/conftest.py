"""Fixtures for the data tests: an isolated environment that can never reach the network."""

from __future__ import annotations

from pathlib import Path

import pytest
from threadpoolctl import threadpool_limits

from dpfl.data import catalog, download

FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST_FILES = [
    f"{part}-{kind}-ubyte.gz" for part in ("train", "t10k") for kind in ("images-idx3", "labels-idx1")
]
_REAL_OPEN_URL = download._open_url


@pytest.fixture(autouse=True)
def isolated_data_env(tmp_path, monkeypatch):
    """No $DPFL_DATA, a private cache, offline, and any URL opening fails the test."""
    monkeypatch.delenv("DPFL_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("DPFL_OFFLINE", "1")

    def no_network(url, timeout):
        raise AssertionError(f"a test tried to open {url}")

    monkeypatch.setattr(download, "_open_url", no_network)


@pytest.fixture(autouse=True)
def single_blas_thread():
    """One BLAS thread: these small products gain nothing from threads and stall on a busy machine."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture
def no_system_data(monkeypatch):
    """Pretend no OS package installed any dataset."""
    monkeypatch.setattr(catalog, "SYSTEM_LOCATIONS", {})


@pytest.fixture
def file_url_opener(monkeypatch):
    """Restore the real URL opener, for file:// URLs only."""

    def opener(url, timeout):
        assert url.startswith("file://"), f"only file:// URLs are allowed in tests, got {url}"
        return _REAL_OPEN_URL(url, timeout)

    monkeypatch.setattr(download, "_open_url", opener)


@pytest.fixture
def fmnist_dir() -> Path:
    """Debian's Fashion-MNIST directory; skips the test when the package is not installed."""
    if not all((FMNIST_DIR / f).is_file() for f in FMNIST_FILES):
        pytest.skip(f"Fashion-MNIST not installed in {FMNIST_DIR} (apt-get install dataset-fashion-mnist)")
    return FMNIST_DIR

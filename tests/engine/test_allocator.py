"""The glibc malloc settings: applied once on glibc, never where they do not apply, and easy to turn off."""

from __future__ import annotations

import ctypes
import platform

import pytest

from dpfl.engine import allocator


def test_disabled_by_the_environment(monkeypatch):
    monkeypatch.setenv("DPFL_MALLOC_TUNING", "0")
    assert allocator._apply() is False


def test_not_applied_outside_linux(monkeypatch):
    monkeypatch.delenv("DPFL_MALLOC_TUNING", raising=False)
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    assert allocator._apply() is False


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_applied_once_on_glibc(monkeypatch):
    calls = []
    real = ctypes.CDLL

    class Spy:
        def __init__(self, *args, **kwargs):
            self._lib = real(*args, **kwargs)

        def mallopt(self, param, value):
            calls.append((param, value))
            return self._lib.mallopt(param, value)

    monkeypatch.delenv("DPFL_MALLOC_TUNING", raising=False)
    monkeypatch.setattr(ctypes, "CDLL", Spy)
    monkeypatch.setattr(allocator, "_done", None)
    assert allocator.tune_malloc() is True and allocator.tune_malloc() is True
    assert calls == [(allocator.M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD_BYTES),
                     (allocator.M_TOP_PAD, allocator.TOP_PAD_BYTES)]  # once, not per call

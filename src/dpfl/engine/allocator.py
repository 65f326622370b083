"""glibc malloc settings that keep the DP-SGD step from page-faulting its large temporaries on every step.

A vectorised DP-SGD step allocates and frees per-sample gradients of hundreds of MiB. With glibc's defaults the
heap is grown and trimmed around each step, and the kernel zero-fills the pages again every time: on the FedCEO
MLP round (10 clients x 64 samples x 50,816 parameters) half the wall time was system time. Keeping 1 GiB of
padding at the top of the heap and a fixed 32 MiB mmap threshold halves the round time there (benchmarks/README.md),
with identical results (the arithmetic does not change, only where the memory comes from).

The cost is up to 1 GiB of freed memory kept by the process. Set DPFL_MALLOC_TUNING=0 to leave malloc alone;
nothing happens outside glibc (macOS, Windows, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

__all__ = ["TOP_PAD_BYTES", "MMAP_THRESHOLD_BYTES", "tune_malloc"]

M_TOP_PAD = -2  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
TOP_PAD_BYTES = 1 << 30
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's maximum on 64-bit systems
_done: bool | None = None


def tune_malloc() -> bool:
    """Apply the settings once per process; True when they are in effect (glibc, not disabled)."""
    global _done
    if _done is None:
        _done = _apply()
    return _done


def _apply() -> bool:
    if os.environ.get("DPFL_MALLOC_TUNING", "1") == "0" or platform.system() != "Linux":
        return False
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return (bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
                and bool(libc.mallopt(M_TOP_PAD, TOP_PAD_BYTES)))
    except (OSError, AttributeError):
        return False

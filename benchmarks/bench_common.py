"""Helpers shared by the benchmark scripts (run as `python benchmarks/NAME.py`, so this folder is on sys.path)."""

from __future__ import annotations

import os
import sys


def loadavg() -> list[float] | None:
    """1/5/15-minute load averages: other processes on the machine distort the timings."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def log(msg: str) -> None:
    """Progress on stderr, so stdout stays one JSON object with --json."""
    print(msg, file=sys.stderr, flush=True)

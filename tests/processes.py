"""`descendants(pid)`: a process's children, grandchildren, ... from /proc; `alive(pid)`: still running (shared by
the tests that check that Flower's and Ray's processes are cleaned up, or what they listen on)."""

from __future__ import annotations

import os


def descendants(pid: int) -> list[int]:
    """All children, grandchildren, ... of `pid` (empty where /proc is missing)."""
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    out += [int(child), *descendants(int(child))]
    except OSError:
        pass
    return out


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

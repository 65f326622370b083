"""`descendants(pid)`: a process's children, grandchildren, ... from /proc; `alive(pid)`: still running (shared by
the tests that check that Flower's and Ray's processes are cleaned up, or what they listen on); `tree_env()`: the
environment of a process that must import this tree's dpfl."""

from __future__ import annotations

import os
from pathlib import Path


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


def tree_env(**changes: str | None) -> dict[str, str]:
    """os.environ with this tree's src/ first on PYTHONPATH (a subprocess imports the dpfl under test, not an
    installed one); `changes`: variables to set, or None to remove."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = {**os.environ, "PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out

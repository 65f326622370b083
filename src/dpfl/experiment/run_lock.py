"""One process at a time in a run directory: an advisory lock (`flock`) on OUT/.lock while a run writes there.

Why: two processes given the same directory (two `dpfl reproduce` invocations whose job lists overlap on one --out,
or a run started twice) would otherwise both train into it: metrics.jsonl gets the rows of both, interleaved, and
each overwrites the other's checkpoint; a grid process that finds the other's half-written directory "resumes" it.
The second process is refused instead (`RunDirectoryBusy`) and writes nothing. The kernel releases the lock when
its holder exits, however it exits, so a killed run leaves no stale lock behind; a run that ends (finished, or
failed cleanly) removes the file too, while it still holds the lock (a killed run leaves the file, unlocked: the next
run takes it). The file holds the holder's pid and host. Where `fcntl` does not exist (Windows) no lock is taken.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TypeVar

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCKS_AVAILABLE", "LOCK_FILE", "RunDirectoryBusy", "hold_run_directory", "lock_holder", "run_held"]

T = TypeVar("T")

LOCK_FILE = ".lock"
ATTEMPTS = 5  # takes of the lock file that another process removed meanwhile (it ended), before giving up
LOCKS_AVAILABLE = fcntl is not None  # False on Windows: two processes in one directory are then not refused


class RunDirectoryBusy(ValueError):
    """Another process holds the run directory (a user error: one line in the CLI)."""


@contextmanager
def hold_run_directory(out: Path) -> Iterator[None]:
    """Hold `out`'s lock for the duration of the block; `out` must be a directory. Raises RunDirectoryBusy at once
    (never waits) if another process holds it."""
    path = Path(out) / LOCK_FILE
    for _ in range(ATTEMPTS):
        with open(path, "a+", encoding="utf-8") as handle:
            if fcntl is not None:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise RunDirectoryBusy(
                        f"{out} is in use by another process ({_holder(handle)}): a run is writing there now; wait for "
                        "it to end, or choose another --out") from None
                if not _still_the_lock_file(handle, path):  # its holder removed it as it ended: take the new one
                    continue
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            handle.flush()
            try:
                yield
            finally:  # removed while still held, so no process can lock the removed file and think it holds `out`
                path.unlink(missing_ok=True)
                if fcntl is not None:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return
    raise RunDirectoryBusy(f"{out}: its lock file kept changing hands; try again")


def _still_the_lock_file(handle: IO[str], path: Path) -> bool:
    """Whether the file `handle` locked is still `path` (a holder unlinks it on release, after this process opened
    it and before it locked it)."""
    try:
        return os.fstat(handle.fileno()).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def run_held(out: Path, finished: Callable[[], T | None], run: Callable[[], T]) -> T:
    """`run()` in `out` (made if missing) under its lock, unless `finished()` says the work is done: it returns the
    result already there (None: not done; it may raise to refuse). `finished` is asked before the lock and again
    under it, since another process may have finished the work while this one waited to start; a process that
    finds the lock held gets RunDirectoryBusy and writes nothing."""
    done = finished()
    if done is not None:
        return done
    out.mkdir(parents=True, exist_ok=True)
    with hold_run_directory(out):
        done = finished()
        return done if done is not None else run()


def lock_holder(out: Path) -> str | None:
    """Who holds `out`'s lock now ("pid N on HOST"), None if nobody does; creates nothing (for listings). The probe
    takes a shared lock for an instant: a run starting in that instant is refused as busy (for --dry-run, harmless)."""
    path = Path(out) / LOCK_FILE
    if fcntl is None or not path.is_file():
        return None
    with open(path, encoding="utf-8") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(handle)
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return None


def _holder(handle: IO[str]) -> str:
    """What the lock file says of its holder (it writes its pid and host right after taking the lock)."""
    handle.seek(0)
    return handle.read().strip() or "a process that has not written its pid yet"

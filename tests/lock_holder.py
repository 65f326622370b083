"""Another process that holds a run directory's lock (`dpfl.experiment.run_lock`) until killed (shared by tests)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from dpfl.experiment.run_lock import hold_run_directory

_CODE = ("import sys, time; from pathlib import Path; from dpfl.experiment.run_lock import hold_run_directory\n"
         "with hold_run_directory(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(600)\n")


def hold_in_another_process(d: Path) -> subprocess.Popen:
    """Start the holder; returns once it holds d's lock."""
    proc = subprocess.Popen([sys.executable, "-c", _CODE, str(d)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL: no cleanup runs in the holder, as when a run is killed."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    if proc.stdout is not None:
        proc.stdout.close()


def hold_until_killed(root: Path, worker: int) -> None:
    """A worker's work in `in_workers` tests: hold root/<worker>'s lock for up to 600 s (or until killed)."""
    d = root / str(worker)
    d.mkdir(parents=True, exist_ok=True)
    with hold_run_directory(d):
        time.sleep(600)

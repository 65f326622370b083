"""Whether a Flower run finished, read from its run directory (`dpfl flower check`); no Flower import.

`flwr run` exits 0 once the run is submitted (with `--stream`, once its log ends), whether the ServerApp finished
or failed, and dpfl cannot change that. So the ServerApp leaves its verdict in the run directory `out`: a finished
run writes summary.json (as `dpfl run` does); a failed one writes FAILURE_NOTE, one line saying why (a missing
SuperNode, a refused config, a node's error), unless `out` already held another run, which it never touches.
"""

from __future__ import annotations

import time
from pathlib import Path

FAILURE_NOTE = "flower-failure.txt"
SUMMARY = "summary.json"


def write_failure(out: Path, reason: str) -> None:
    """Write the one-line reason a run failed into `out` (created if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / FAILURE_NOTE).write_text(" ".join(reason.split()) + "\n")


def clear_failure(out: Path) -> None:
    """Remove the note of an earlier failed attempt in `out`, so that the directory can be used again."""
    (out / FAILURE_NOTE).unlink(missing_ok=True)


def only_failed_attempts(out: Path) -> bool:
    """Whether `out` holds nothing but what failed attempts leave (the failure note, the run lock)."""
    from dpfl.experiment.run_lock import LOCK_FILE

    return out.is_dir() and {p.name for p in out.iterdir()} <= {FAILURE_NOTE, LOCK_FILE}


def verdict(out: Path, wait: float = 0.0, poll: float = 0.5) -> tuple[bool, str]:
    """(finished, why): True once `out/summary.json` exists; False with the ServerApp's reason when it wrote one,
    else with what is missing after waiting up to `wait` seconds for either."""
    deadline = time.monotonic() + wait
    while True:
        if (out / FAILURE_NOTE).is_file():
            return False, f"the Flower run failed: {(out / FAILURE_NOTE).read_text().strip()}"
        if (out / SUMMARY).is_file():
            return True, "finished"
        if time.monotonic() >= deadline:
            break
        time.sleep(poll)
    if not out.exists():
        return False, (f"the Flower run did not finish: {out} does not exist (the ServerApp never started the run: "
                       "see `flwr run --stream`'s log or the SuperLink's)")
    return False, (f"the Flower run did not finish: {out} has no {SUMMARY} (still running, stopped, or the ServerApp "
                   "crashed: see `flwr run --stream`'s log or the SuperLink's)")

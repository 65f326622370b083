"""A line every few minutes about a long job's pace, for grids that run in the background into a log file.

Without a terminal the progress bar is off and a grid's log said nothing between a job's first round and its end:
hours, at the papers' scales. `RoundPace` sees every round's metrics row and, once `every` seconds (of the clock
it is given) have passed since its last line, returns one: the round reached, the mean wall time of the rounds
since the last line (each row's own `seconds`, so a pause between executions does not count), and the time the
remaining rounds would take at that pace, labelled as an estimate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["PACE_EVERY", "RoundPace", "duration"]

PACE_EVERY = 600.0  # seconds between two pace lines of one job


def duration(seconds: float) -> str:
    """A span as people read it: 45 s, 12 min, 2.3 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class RoundPace:
    """Decides when a job's pace is worth a line, and writes it (module docstring). One instance per job."""

    def __init__(self, rounds: int, every: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rounds, self.clock = rounds, clock
        self.every = PACE_EVERY if every is None else every  # read when the job starts (tests change it)
        self.last = clock()
        self.spent: list[float] = []  # the rows' seconds since the last line

    def line(self, row: Mapping[str, Any]) -> str | None:
        """The pace line due after this round's row, or None (not yet `every` seconds since the last one)."""
        seconds = row.get("seconds")
        if isinstance(seconds, (int, float)):
            self.spent.append(float(seconds))
        now = self.clock()
        if now - self.last < self.every or not self.spent:
            return None
        self.last = now
        mean = sum(self.spent) / len(self.spent)
        self.spent = []
        done = int(row["round"])
        left = max(self.rounds - done, 0)
        eta = f", about {duration(left * mean)} left at that pace (an estimate)" if left else ""
        return f"round {done} of {self.rounds}, {duration(mean)} per round{eta}"

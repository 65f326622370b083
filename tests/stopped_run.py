"""`stop_in_round(config, out, r)`: a run whose process dies in round r, as a kill leaves it (shared by the resume,
lock, environment, timing and corrupted-directory tests).

The round-r row is written to metrics.jsonl, then the exception stops the run before round r's checkpoint, so the
checkpoint holds the last multiple of `checkpoint.every` below r and a resume runs round r again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpfl.experiment.config import RunConfig
from dpfl.experiment.run_directory import execute


class Stopped(Exception):
    """What the run dies of (raised from its per-round callback)."""


def stop_in_round(config: RunConfig, out: Path, round_: int) -> Path:
    def stop(row: dict[str, Any]) -> None:
        if row["round"] == round_:
            raise Stopped

    with pytest.raises(Stopped):
        execute(config, out, on_round=stop)
    return out

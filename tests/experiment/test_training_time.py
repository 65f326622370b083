"""Each round's wall and CPU time, and summary.json's sums over every round, a resumed run's earlier execution included.

Wall time counts whatever else the machine was doing (and a paused run's pause); CPU time is this process's work, so
timings of runs that shared a machine stay comparable. summary.json's `seconds` is one execution's wall time, so a
resumed run needs `train_seconds` for the whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpfl.experiment.config import load_config
from dpfl.experiment.run_directory import execute
from dpfl.results.run_files import training_time
from stopped_run import stop_in_round

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
SETS = ["name=timed", "training.rounds=4", "evaluation.every=2", "checkpoint.every=2", "privacy.noise_multiplier=1.5",
        "privacy.budgets=30"]


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_every_round_records_its_cpu_time_and_the_summary_sums_both(tmp_path):
    summary = execute(load_config(DEMO, SETS), tmp_path / "run")
    rows = _rows(tmp_path / "run")
    assert len(rows) == 4 and all(r["cpu_seconds"] > 0 and r["seconds"] > 0 for r in rows)
    assert summary["train_seconds"] == sum(r["seconds"] for r in rows)
    assert summary["train_cpu_seconds"] == sum(r["cpu_seconds"] for r in rows)
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"{summary['train_cpu_seconds']:.1f} s CPU" in report and "evaluation excluded" in report


def test_a_resumed_run_sums_the_rounds_of_every_execution(tmp_path):
    out = stop_in_round(load_config(DEMO, SETS), tmp_path / "run", 3)
    first = _rows(out)[:2]  # the checkpoint holds rounds 1-2; round 3 is run again on resume
    summary = execute(load_config(DEMO, SETS), out, resume=True)
    rows = _rows(out)
    assert rows[:2] == first
    assert summary["train_seconds"] == sum(r["seconds"] for r in rows)  # not only rounds 3-4, the resumed ones
    assert summary["train_cpu_seconds"] == sum(r["cpu_seconds"] for r in rows)


def test_cpu_time_is_unknown_when_a_round_lacks_it():
    # a remote backend's rounds, or rounds recorded before dpfl measured CPU time: a partial sum would understate it
    assert training_time([{"seconds": 1.0, "cpu_seconds": 0.5}, {"seconds": 2.0}]) == {
        "train_seconds": 3.0, "train_cpu_seconds": None}
    assert training_time([{"seconds": 1.0, "cpu_seconds": 0.5}, {"seconds": 2.0, "cpu_seconds": 0.25}]) == {
        "train_seconds": 3.0, "train_cpu_seconds": 0.75}
    assert training_time([]) == {"train_seconds": 0.0, "train_cpu_seconds": None}

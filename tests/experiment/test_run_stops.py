"""How a run that ends before its last round reports itself, as a user meets it on the command line: a budget stop
between two evaluations still reports the accuracy of the model the run ends with, and a run whose model becomes
NaN or infinite stops, says so and exits non-zero."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_runner import cli
from kill_points import install
from untimed import untimed

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
# the example: the demo's budgets stop it after 3 of 30 rounds, long before its first evaluation (round 10)
EARLY_STOP = ("--set", "privacy.noise_multiplier=1.0", "--set", "training.rounds=30")


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_a_budget_stop_between_evaluations_reports_the_model_the_run_ends_with(tmp_path):
    code, out, err = cli("run", DEMO_CONFIG, *EARLY_STOP, "--set", "evaluation.every=10", "--out", tmp_path / "stop")
    assert code == 0, err
    summary, rows = _summary(tmp_path / "stop"), _rows(tmp_path / "stop")
    assert summary["stop_reason"] == "budget" and summary["rounds_done"] == len(rows) < 10
    last = rows[-1]
    assert "test_accuracy" in last["evaluated_at_stop"] and "evaluated_at_stop" not in rows[0]
    assert summary["final_accuracy"] == last["test_accuracy"] is not None
    assert "final accuracy -" not in out
    # the same run evaluated every round: its last row is the same model, so the same accuracy (evaluation draws
    # no randomness); a stale or wrong model would differ
    assert cli("run", DEMO_CONFIG, *EARLY_STOP, "--set", "evaluation.every=1", "--out", tmp_path / "every")[0] == 0
    reference = _rows(tmp_path / "every")
    assert len(reference) == len(rows) and reference[-1]["test_accuracy"] == last["test_accuracy"]
    assert reference[-1]["test_loss"] == last["test_loss"] and "evaluated_at_stop" not in reference[-1]


class _Killed(BaseException):
    """Stands for a SIGKILL: nothing after the injected point runs."""


def test_a_kill_after_the_stop_evaluation_resumes_to_the_same_run(tmp_path, monkeypatch):
    """Killed after metrics.jsonl got the evaluated last row and before the last checkpoint (which still ends one
    round earlier, without the evaluation): the two files disagree on that row only by the evaluation, so --resume
    accepts them and finishes as the uninterrupted run did."""
    args = ("run", DEMO_CONFIG, *EARLY_STOP, "--set", "evaluation.every=10")
    assert cli(*args, "--out", tmp_path / "reference")[0] == 0
    rounds = _summary(tmp_path / "reference")["rounds_done"]
    seen = {"checkpoints": 0}

    def kill_at_last_checkpoint(point: str, context: dict) -> None:
        if point == "rename:checkpoint.pt":
            seen["checkpoints"] += 1
            if seen["checkpoints"] == rounds + 1:  # one per round, then the final one
                raise _Killed

    install(kill_at_last_checkpoint, monkeypatch.setattr)
    with pytest.raises(_Killed):
        cli(*args, "--out", tmp_path / "victim")
    monkeypatch.undo()
    victim = tmp_path / "victim"
    assert not (victim / "summary.json").exists() and "evaluated_at_stop" in _rows(victim)[-1]
    code, _, err = cli(*args, "--out", victim, "--resume")
    assert code == 0, err
    assert untimed(_rows(victim)) == untimed(_rows(tmp_path / "reference"))
    assert untimed(_summary(victim)) == untimed(_summary(tmp_path / "reference"))


@pytest.mark.parametrize("setting", ["training.optimizer.lr=1e300", "privacy.clip=1e300"])
def test_a_run_whose_model_becomes_nan_or_infinite_stops_says_so_and_exits_1(tmp_path, setting):
    code, out, err = cli("run", DEMO_CONFIG, "--set", setting, "--out", tmp_path / "run")
    assert code == 1, err
    summary, rows = _summary(tmp_path / "run"), _rows(tmp_path / "run")
    assert summary["stop_reason"] == "diverged" and summary["rounds_done"] == len(rows) < 30
    assert rows[-1]["diverged"] is True and all("diverged" not in row for row in rows[:-1])
    assert "stop: diverged" in out and "NaN or infinite" in out
    assert (tmp_path / "run" / "report.md").is_file()  # the run directory is complete: it shows what happened

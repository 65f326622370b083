"""Pace lines for long jobs logged to a file (dpfl.reproduce.pace): when they come and what they say."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rich.console import Console

from dpfl.reproduce import pace
from dpfl.reproduce.pace import RoundPace, duration
from dpfl.reproduce.runner import OK, Outcome, RichProgress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_line_once_every_seconds_with_the_mean_of_the_rounds_since_the_last_one():
    clock = Clock()
    p = RoundPace(200, every=600, clock=clock)
    clock.now = 599.0
    assert p.line({"round": 1, "seconds": 50.0}) is None  # not yet 600 s
    clock.now = 700.0
    # mean of rounds 1-2 (50, 70) = 60 s; 198 rounds left at 60 s = 3.3 h
    assert p.line({"round": 2, "seconds": 70.0}) == (
        "round 2 of 200, 60 s per round, about 3.3 h left at that pace (an estimate)")
    clock.now = 1000.0
    assert p.line({"round": 3, "seconds": 20.0}) is None  # 300 s since the last line
    clock.now = 1400.0
    # only the rounds since the last line count (3 and 4: 20, 40), not a pause between executions
    assert p.line({"round": 4, "seconds": 40.0}) == (
        "round 4 of 200, 30 s per round, about 1.6 h left at that pace (an estimate)")
    clock.now = 2100.0
    assert p.line({"round": 200, "seconds": 30.0}) == "round 200 of 200, 30 s per round"  # nothing left
    clock.now = 3000.0
    assert p.line({"round": 201}) is None  # a row without its seconds gives no pace


def test_durations_read_like_people_say_them():
    assert [duration(s) for s in (0.4, 45, 89, 90, 3000, 5399, 5400, 9000)] == [
        "0 s", "45 s", "89 s", "2 min", "50 min", "90 min", "1.5 h", "2.5 h"]


def _job():
    return SimpleNamespace(setting="fmnist-Dist1", method="robust_hdp", seed=0)


def test_a_grid_logged_to_a_file_says_its_pace_and_a_terminal_bar_does_not(monkeypatch):
    monkeypatch.setattr(pace, "PACE_EVERY", 0.0)
    buf = io.StringIO()
    with RichProgress(Console(file=buf, width=200)) as progress:  # not a terminal: no bar
        progress.start(_job(), 1, 7, 200)
        progress.round(_job(), {"round": 1, "seconds": 48.0, "test_accuracy": 0.5})
        progress.end(Outcome(_job(), None, OK, "ran", seconds=48.0), 1, 7)
    assert buf.getvalue().splitlines()[0] == (
        "[1/7] fmnist-Dist1 robust_hdp seed0: round 1 of 200, 48 s per round, about 2.7 h left at that pace "
        "(an estimate), accuracy 0.500")
    buf = io.StringIO()
    with RichProgress(Console(file=buf, width=200, force_terminal=True)) as progress:
        progress.start(_job(), 1, 7, 200)
        progress.round(_job(), {"round": 1, "seconds": 48.0})
        assert progress.pace is None


def test_a_worker_says_its_pace_after_its_first_line(monkeypatch, capsys):
    from dpfl.reproduce.workers import _Lines

    monkeypatch.setattr(pace, "PACE_EVERY", 0.0)
    lines = _Lines(2)
    lines.start(_job(), 1, 7, 200)
    lines.round(_job(), {"round": 31, "seconds": 50.0})  # a resumed job: its first round of this execution
    lines.round(_job(), {"round": 32, "seconds": 40.0, "test_accuracy": 0.4123})
    lines.end(Outcome(_job(), None, OK, "finished before"), 1, 7)
    lines.round(_job(), {"round": 33, "seconds": 40.0})  # after the end: nothing
    assert capsys.readouterr().err.splitlines() == [
        "worker 2: [1/7] fmnist-Dist1 robust_hdp seed0: running (round 31 of 200 done)",
        "worker 2: [1/7] fmnist-Dist1 robust_hdp seed0: round 32 of 200, 40 s per round, about 1.9 h left at that "
        "pace (an estimate), accuracy 0.412"]


def test_dpfl_run_logged_to_a_file_says_its_pace(monkeypatch, tmp_path):
    from cli_runner import cli
    from test_cli import small_config

    monkeypatch.setattr(pace, "PACE_EVERY", 0.0)
    code, _, err = cli("run", small_config(tmp_path, rounds=3), "--out", tmp_path / "run")
    assert code == 0, err
    paced = [line for line in err.splitlines() if line.startswith("small: round ")]
    assert len(paced) == 3, err
    assert re.fullmatch(r"small: round 1 of 3, \d+ s per round, about \d+ s left at that pace \(an estimate\), "
                        r"accuracy 0\.\d{3}  eps max \d+\.\d{3}", paced[0]), paced[0]
    assert paced[-1].startswith("small: round 3 of 3, ") and "left" not in paced[-1]

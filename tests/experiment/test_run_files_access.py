"""A run directory a colleague can read: its files follow the user's umask like any file they write, and a run that
ends (finished, or failed cleanly) leaves no lock file behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cli_runner import cli

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


@pytest.fixture
def umask():
    def set_(mask: int) -> None:
        os.umask(mask)
    old = os.umask(0o022)
    os.umask(old)
    yield set_
    os.umask(old)


def _modes(out: Path) -> dict[str, int]:
    return {p.relative_to(out).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*") if p.is_file()}


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600)])
def test_run_files_follow_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    code, _, err = cli("run", DEMO_CONFIG, "--set", "training.rounds=2", "--out", tmp_path / "run")
    assert code == 0, err
    modes = _modes(tmp_path / "run")
    assert {"checkpoint.pt", "summary.json", "privacy.json", "metrics.jsonl", "report.md"} <= set(modes)
    assert set(modes.values()) == {expected}, modes


def test_a_finished_run_and_a_failed_run_leave_no_lock_file(tmp_path):
    assert cli("run", DEMO_CONFIG, "--set", "training.rounds=2", "--out", tmp_path / "done")[0] == 0
    code, _, _ = cli("run", DEMO_CONFIG, "--set", "training.optimizer.lr=1e300", "--out", tmp_path / "diverged")
    assert code == 1  # the run ran and failed (it diverged): a clean end all the same
    for out in (tmp_path / "done", tmp_path / "diverged"):
        assert (out / "summary.json").is_file() and not (out / ".lock").exists()
    # and the finished run is still refused as a new run's directory, and still resumes as finished
    assert cli("run", DEMO_CONFIG, "--set", "training.rounds=2", "--out", tmp_path / "done")[0] == 2
    assert cli("run", DEMO_CONFIG, "--set", "training.rounds=2", "--out", tmp_path / "done", "--resume")[0] == 0
    assert not (tmp_path / "done" / ".lock").exists()

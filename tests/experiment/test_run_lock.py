"""Two processes in one run directory: the second is refused before it reads or writes anything.

Found the hard way: two `dpfl reproduce` invocations on one --out whose job lists overlapped both trained the same
job; the second found the first's half-written directory, "resumed" it, and metrics.jsonl ended with 56 interleaved
rows of a 30-round run. The holder here is a real second process (flock is per open file, released by the kernel
when the holder dies), so a SIGKILLed holder must leave no stale lock.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from cli_runner import cli
from lock_holder import hold_in_another_process, kill
from dpfl.experiment.config import load_config
from dpfl.experiment.run_directory import execute
from dpfl.experiment.run_lock import LOCK_FILE, RunDirectoryBusy, hold_run_directory, lock_holder, run_held
from stopped_run import stop_in_round

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
SETS = ["name=locked", "training.rounds=3", "evaluation.every=1", "checkpoint.every=1", "privacy.noise_multiplier=1.5"]


def _files(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def _unfinished(out: Path) -> None:
    """The run stopped after round 2 (checkpoint at round 2), as a kill leaves it."""
    stop_in_round(load_config(DEMO, SETS), out, 2)


def test_the_lock_refuses_a_second_holder_in_this_process_and_is_free_after(tmp_path):
    with hold_run_directory(tmp_path):
        with pytest.raises(RunDirectoryBusy, match="in use by another process"):
            with hold_run_directory(tmp_path):
                pass
    with hold_run_directory(tmp_path):  # released on leaving the block
        pass


def test_resuming_a_directory_another_process_holds_is_refused_and_changes_nothing(tmp_path):
    out = tmp_path / "run"
    _unfinished(out)
    proc = hold_in_another_process(out)
    try:
        before = _files(out)
        with pytest.raises(RunDirectoryBusy, match=rf"in use by another process \(pid {proc.pid} on "):
            execute(load_config(DEMO, SETS), out, resume=True)
        code, _, err = cli("run", DEMO, "--out", out, *[a for s in SETS for a in ("--set", s)], "--resume")
        assert code == 2 and err.count("\n") == 1 and "in use by another process" in err, err
        assert _files(out) == before  # refused before anything was read, repaired or written
    finally:
        kill(proc)
    summary = execute(load_config(DEMO, SETS), out, resume=True)  # a killed holder leaves no stale lock
    assert summary["rounds_done"] == 3


def test_a_fresh_run_into_a_directory_another_process_holds_writes_nothing(tmp_path):
    """Two processes that start the same new job: the second to take the lock is refused, whatever it built."""
    out = tmp_path / "run"
    out.mkdir()
    proc = hold_in_another_process(out)
    try:
        with pytest.raises(RunDirectoryBusy):
            execute(load_config(DEMO, SETS), out)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]
    finally:
        kill(proc)
    summary = execute(load_config(DEMO, SETS), out)  # the lock file alone does not make the directory "not empty"
    assert summary["rounds_done"] == 3 and (out / "summary.json").is_file()


def test_lock_holder_names_the_holding_process_and_creates_nothing(tmp_path):
    assert lock_holder(tmp_path) is None and not (tmp_path / LOCK_FILE).exists()  # no lock file: nobody, none made
    proc = hold_in_another_process(tmp_path)
    try:
        assert lock_holder(tmp_path).startswith(f"pid {proc.pid} on ")
        with pytest.raises(RunDirectoryBusy):  # the probe did not take or break the holder's lock
            with hold_run_directory(tmp_path):
                pass
    finally:
        kill(proc)
    assert lock_holder(tmp_path) is None  # the file stays; its lock died with the holder


def test_run_held_asks_again_under_the_lock_and_runs_only_when_nothing_is_done(tmp_path):
    """The second `finished` answer (under the lock) is the one that counts: another process may finish the work
    between the first check and taking the lock; then `run` must not run again."""
    d = tmp_path / "job"
    answers = iter([None, "done by the other"])
    ran: list[str] = []
    assert run_held(d, lambda: next(answers), lambda: ran.append("run") or "ran") == "done by the other"
    assert ran == [] and d.is_dir()
    assert run_held(d, lambda: None, lambda: "ran") == "ran"
    assert run_held(tmp_path / "finished", lambda: "kept", lambda: "ran") == "kept"
    assert not (tmp_path / "finished").exists()  # nothing made where the work was done


def test_run_held_in_a_directory_another_process_holds_runs_nothing(tmp_path):
    proc = hold_in_another_process(tmp_path)
    try:
        with pytest.raises(RunDirectoryBusy):
            run_held(tmp_path, lambda: None, lambda: pytest.fail("ran beside the holder"))
    finally:
        kill(proc)

"""A grid that lists the same run under several settings runs it once and copies it (`copy_finished_run`).

PFA's non-private reference ignores the calibration (its config resets `privacy`), so the ci grid's `-rdp` and
`-heuristic` settings hold the same np_fedavg run under two names. The test checks the premise too: running the
copied job for real gives the copy's metrics, privacy block and final model.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from lock_holder import hold_in_another_process, kill
from untimed import untimed

from dpfl.experiment.config import config_to_yaml
from dpfl.experiment.run_directory import (FINGERPRINT, RunDirectoryError, copy_finished_run, execute,
                                           load_checkpoint, twin_key)
from dpfl.reproduce import pfa
from dpfl.experiment.run_lock import LOCK_FILE, RunDirectoryBusy
from dpfl.reproduce.runner import FAILED, OK, SKIPPED, describe_jobs, run_jobs
from dpfl.reproduce.tables import write_results


def _metrics(d: Path) -> list[dict[str, Any]]:
    return untimed([json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()])


def _json(d: Path, name: str) -> Any:
    return json.loads((d / name).read_text())


def _grid():
    return pfa.grid("ci", rounds=1, methods=["np_fedavg"], settings_pattern="fmnist-logr-*", calibration="both")


@pytest.fixture(scope="module")
def twins(tmp_path_factory, fmnist):
    out = tmp_path_factory.mktemp("twins")
    grid = _grid()
    ran = []

    def spy(cfg, path, **kw):
        ran.append(cfg.name)
        return execute(cfg, path, **kw)

    outcomes = run_jobs(grid.jobs, out, execute=spy)
    return grid, out, outcomes, ran


def test_the_run_is_executed_once_and_copied_under_the_other_name(twins):
    grid, out, outcomes, ran = twins
    first, second = grid.jobs
    assert first.setting.endswith("-rdp") and second.setting.endswith("-heuristic")
    assert first.config.name != second.config.name and twin_key(first.config) == twin_key(second.config)
    assert ran == [first.config.name]
    assert [(o.status, o.action) for o in outcomes] == [
        (OK, "ran"), (OK, f"copied from runs/{first.setting}/np_fedavg/seed0: the same config but for its name")]
    copy, src = outcomes[1].run_dir, outcomes[0].run_dir
    assert (copy / "config.yaml").read_text() == config_to_yaml(second.config)
    summary = _json(copy, "summary.json")
    assert summary["name"] == second.config.name and summary["same_run_as"] == os.path.relpath(src, copy)
    assert untimed({**summary, "name": None, "same_run_as": None}) == untimed(
        {**_json(src, "summary.json"), "name": None, "same_run_as": None})
    assert "**Copied from**" in (copy / "report.md").read_text()
    write_results(grid, outcomes, out, command="test")
    md = (out / "results.md").read_text()
    assert "- Written by: dpfl " in md
    assert "- Runs computed by: dpfl " in md and " (2 runs) (each run's" in md  # the copy carries its source's
    rows = (out / "results.csv").read_text().splitlines()[1:]
    assert len(rows) == 2 and all(",ok," in r for r in rows)


def test_running_the_copied_job_for_real_gives_the_copy(twins, tmp_path):
    grid, _, outcomes, _ = twins
    copy = outcomes[1].run_dir
    real = tmp_path / "real"
    execute(grid.jobs[1].config, real)
    assert _metrics(real) == _metrics(copy)
    assert _json(real, "privacy.json") == _json(copy, "privacy.json")
    got, want = load_checkpoint(copy / "checkpoint.pt"), load_checkpoint(real / "checkpoint.pt")
    assert all(torch.equal(got["params"][k], want["params"][k]) for k in want["params"])
    assert got[FINGERPRINT] == want[FINGERPRINT]  # re-stamped for the copy's own config.yaml


def test_the_copy_is_an_ordinary_run_directory(twins, tmp_path):
    grid, out, _, _ = twins
    assert [o.action for o in run_jobs(grid.jobs, out, execute=None)] == ["finished before"] * 2
    # its checkpoint belongs to it: without summary.json, --resume finishes it from the checkpoint, training nothing
    job = grid.jobs[1]
    d = Path(tmp_path / "copy")
    copy_finished_run(grid.jobs[0].run_dir(out), job.config, d)
    before = _metrics(d)
    (d / "summary.json").unlink()
    execute(job.config, d, resume=True)
    assert _metrics(d) == before and _json(d, "summary.json")["name"] == job.config.name


def test_the_dry_run_says_which_job_would_be_a_copy(twins, tmp_path):
    grid, out, _, _ = twins
    first, second = grid.jobs
    partial = tmp_path / "out"
    shutil.copytree(first.run_dir(out), first.run_dir(partial))
    lines = describe_jobs(grid, partial)
    assert any(first.setting in line and " finished " in line for line in lines)
    assert any(line.startswith(second.setting) and f"new: copies {first.setting}'s (same run)" in line
               for line in lines)


def test_copy_finished_run_refuses_what_is_not_the_same_finished_run(twins, tmp_path):
    grid, out, _, _ = twins
    src = grid.jobs[0].run_dir(out)
    other = grid.jobs[1].config.model_copy(update={"seed": 7})
    with pytest.raises(RunDirectoryError, match="another config"):
        copy_finished_run(src, other, tmp_path / "a")
    with pytest.raises(RunDirectoryError, match="already exists"):
        copy_finished_run(src, grid.jobs[1].config, grid.jobs[1].run_dir(out))
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text((src / "config.yaml").read_text())
    with pytest.raises(RunDirectoryError, match="not a finished run"):
        copy_finished_run(unfinished, grid.jobs[1].config, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_copy_that_fails_is_a_failed_job_and_the_next_invocation_runs_it(twins, tmp_path):
    grid, out, _, _ = twins
    first, second = grid.jobs
    shutil.copytree(first.run_dir(out), first.run_dir(tmp_path))
    (first.run_dir(tmp_path) / "checkpoint.pt").write_bytes(b"garbage")  # the source cannot be copied
    outcomes = run_jobs(grid.jobs, tmp_path, execute=None)
    assert [o.status for o in outcomes] == [OK, FAILED] and "checkpoint.pt" in outcomes[1].message
    assert (tmp_path / "logs").is_dir()
    # a half-made copy is an unfinished run of the job's own config: the next invocation resumes (runs) it
    again = run_jobs(grid.jobs, tmp_path)
    assert [(o.status, o.action) for o in again] == [(OK, "finished before"), (OK, "resumed")]
    assert _metrics(second.run_dir(tmp_path)) == _metrics(second.run_dir(out))


def test_a_copy_another_process_is_making_is_refused_and_skipped(twins, tmp_path):
    """Two workers on one --out reach the same NEW twin: the one that finds the directory's lock held writes nothing
    and skips the job (the holder's copy is the result)."""
    grid, out, _, _ = twins
    first, second = grid.jobs
    shutil.copytree(first.run_dir(out), first.run_dir(tmp_path))
    d = second.run_dir(tmp_path)
    d.mkdir(parents=True)
    proc = hold_in_another_process(d)
    try:
        with pytest.raises(RunDirectoryBusy, match="in use by another process"):
            copy_finished_run(first.run_dir(tmp_path), second.config, d)
        outcomes = run_jobs(grid.jobs, tmp_path, execute=None)
        assert [o.status for o in outcomes] == [OK, SKIPPED] and "in use by another process" in outcomes[1].message
        assert sorted(p.name for p in d.iterdir()) == [LOCK_FILE]
    finally:
        kill(proc)
    again = run_jobs(grid.jobs, tmp_path, execute=None)  # the holder died: the lock file alone is no obstacle
    assert [o.action for o in again] == ["finished before", f"copied from runs/{first.setting}/np_fedavg/seed0: "
                                         "the same config but for its name"]


def test_a_copy_another_process_finished_first_is_finished_not_failed(twins, tmp_path, monkeypatch):
    """Two workers reach the same NEW twin; one copies it while the other reads the source: the latecomer finds the
    directory full, and the job is finished (by the other), not failed."""
    from dpfl.experiment import run_directory

    grid, out, _, _ = twins
    first, second = grid.jobs
    shutil.copytree(first.run_dir(out), first.run_dir(tmp_path))
    real_copy = run_directory.copy_finished_run

    def the_other_copied_it_first(src, cfg, d):
        real_copy(src, cfg, d)  # the other process
        return real_copy(src, cfg, d)

    monkeypatch.setattr(run_directory, "copy_finished_run", the_other_copied_it_first)
    outcomes = run_jobs(grid.jobs, tmp_path, execute=None)
    assert [(o.status, o.action) for o in outcomes] == [(OK, "finished before"), (OK, "finished before")]
    assert "by another process" in outcomes[1].message and not (tmp_path / "logs").exists()

"""`dpfl reproduce ... --workers N`: worker processes share one grid; each job runs once, as it would alone.

The end-to-end test runs the PFA ci grid's logistic-regression settings (2 rounds, 3 methods, both calibrations: 6
jobs, the non-private reference listed twice) in 2 workers of one thread, and compares every run with the same job
run alone: the same metrics, privacy block and final model, one execution per directory.

The three tests that start worker processes (that grid, the CLI's grid, the killed parent) are in the integration
tier (`make test-integration`); the rest, in process, in the default tier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cli_runner import cli
from untimed import untimed

from dpfl.experiment.run_directory import execute, load_checkpoint
from dpfl.experiment.run_lock import RunDirectoryBusy
from dpfl.reproduce import pfa
from dpfl.reproduce.jobs import Job
from dpfl.reproduce.runner import FAILED, OK, SKIPPED, Outcome
from dpfl.reproduce.workers import merge_outcomes, run_jobs_in_workers


def _grid():
    return pfa.grid("ci", rounds=2, methods=["np_fedavg", "max_eps", "fedavg"], settings_pattern="fmnist-logr-*",
                    calibration="both")


def _metrics(d: Path) -> list[dict]:
    return untimed([json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()])


@pytest.mark.integration
def test_two_workers_run_every_job_once_with_the_results_of_one(tmp_path, fmnist, capsys):
    grid = _grid()
    assert len(grid.jobs) == 6
    out = tmp_path / "out"
    outcomes = run_jobs_in_workers(grid.jobs, out, 2, threads=1)
    assert [o.job.key for o in outcomes] == [j.key for j in grid.jobs]
    assert all(o.status == OK for o in outcomes), [(o.job.key, o.status, o.message) for o in outcomes]
    assert not (out / "logs").exists()  # no worker failed a job, not even one the other had taken meanwhile
    twin = next(o for o in outcomes if o.job.method == "np_fedavg" and o.job.setting.endswith("-heuristic"))
    assert twin.action.startswith("copied from") or twin.action == "finished before"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' thread count: a number reproduces bit for bit with the same
    try:
        for job in grid.jobs:
            d, alone = job.run_dir(out), tmp_path / "alone" / job.setting / job.method
            execute(job.config, alone)
            assert _metrics(d) == _metrics(alone), job.key  # one execution: no interleaved or repeated rows
            assert len((d / "environment.jsonl").read_text().splitlines()) == 1, job.key  # started once
            privacy = json.loads((d / "privacy.json").read_text())
            assert privacy == json.loads((alone / "privacy.json").read_text()), job.key
            got, want = (load_checkpoint(x / "checkpoint.pt")["params"] for x in (d, alone))
            assert all(torch.equal(got[k], want[k]) for k in want), job.key
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    again = run_jobs_in_workers(grid.jobs, out, 2, threads=1)  # a second invocation finds the grid done
    assert [o.action for o in again] == ["finished before"] * 6
    assert capsys.readouterr().err.splitlines() == ["all 6 jobs finished before"]


@pytest.mark.integration
def test_the_cli_runs_a_grid_in_workers_as_a_user_does(tmp_path, fmnist):
    """`dpfl reproduce pfa ... --workers 2`: every job once, the tables with one row per job, the summary line."""
    code, out, err = cli("reproduce", "pfa", "--scale", "ci", "--out", tmp_path, "--settings",
                         "fmnist-logr-iid-MixGauss1-M10-rdp", "--methods", "np_fedavg,fedavg", "--rounds", "2",
                         "--workers", "2")
    assert code == 0, err
    assert "pfa (ci (reduced: 2 rounds instead of 5)): 2 ok" in out
    rows = (tmp_path / "results.csv").read_text().splitlines()[1:]
    assert len(rows) == 2 and all(",ok," in r for r in rows)
    for method in ("np_fedavg", "fedavg"):
        d = tmp_path / "runs" / "fmnist-logr-iid-MixGauss1-M10-rdp" / method / "seed0"
        assert len((d / "environment.jsonl").read_text().splitlines()) == 1  # run once
        assert len(_metrics(d)) == json.loads((d / "summary.json").read_text())["rounds_done"] >= 1


def _outcome(status: str, action: str = "", message: str = "") -> Outcome:
    job = Job("s", "m", 0, config=None, label="")  # type: ignore[arg-type]
    return Outcome(job, Path("d"), status, action, message)


def test_the_merged_outcome_is_the_worker_that_acted():
    busy = _outcome(SKIPPED, message="in use by another process")
    ran, before = _outcome(OK, "ran"), _outcome(OK, "finished before")
    failed, resumed = _outcome(FAILED, "ran", "boom"), _outcome(OK, "resumed")
    copied = _outcome(OK, "copied from runs/x: the same config but for its name")
    assert merge_outcomes([[busy], [ran]]) == [ran]
    assert merge_outcomes([[ran], [before]]) == [ran] and merge_outcomes([[before], [copied]]) == [copied]
    assert merge_outcomes([[failed], [busy]]) == [failed] and merge_outcomes([[before], [failed]]) == [failed]
    assert merge_outcomes([[failed], [resumed]]) == [resumed]  # one worker failed it, the other resumed it to the end
    missing = [_outcome(SKIPPED, message="dataset x is not available"), _outcome(SKIPPED, message="other words")]
    assert merge_outcomes([[missing[0]], [missing[1]]]) == [missing[0]]  # equal rank: the first worker's
    assert merge_outcomes([[busy, ran], [ran, before]]) == [ran, ran]


@pytest.mark.parametrize("args, message", [
    (["--workers", "0"], "--workers must be at least 1, got 0"),
    (["--workers", "2", "--dry-run"], "--dry-run runs none"),
    (["--workers", "2", "--tables-only"], "--tables-only runs none"),
])
def test_bad_workers_are_one_line(tmp_path, args, message):
    code, _, err = cli("reproduce", "pfa", "--scale", "ci", "--out", tmp_path / "o", *args)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_workers_are_refused_where_they_do_not_apply(tmp_path):
    for args, message in ((["robust-hdp", "--noise-table"], "the noise table trains round 1 once"),
                          (["fedceo", "--search"], "not to --search or --dlg"),
                          (["rdpcfl", "--round1-analysis"], "not to --round1-analysis")):
        code, _, err = cli("reproduce", *args, "--scale", "ci", "--out", tmp_path / "o", "--workers", "2")
        assert code == 2 and message in err, (args, err)


def test_a_worker_says_what_it_runs_not_what_another_holds(capsys):
    from dpfl.reproduce.workers import _Lines

    lines = _Lines(2)
    job = _outcome(OK).job
    lines.start(job, 1, 6, 100)  # preparing; another worker may take the directory first
    lines.end(_outcome(SKIPPED, message="runs/s/m/seed0 is in use by another process (pid 7 on vm)"), 1, 6)
    lines.round(job, {"round": 1})  # a stray row after the skip says nothing
    lines.start(job, 2, 6, 100)
    lines.round(job, {"round": 1})
    lines.round(job, {"round": 2})
    lines.end(Outcome(job, Path("d"), OK, "ran", seconds=412.3), 2, 6)
    lines.end(_outcome(OK, "finished before"), 3, 6)  # counted once by the parent, not by every worker
    assert capsys.readouterr().err.splitlines() == ["worker 2: [2/6] s m seed0: running (round 1 of 100 done)",
                                                    "worker 2: [2/6] s m seed0: ok (ran, 412 s)"]


@pytest.mark.integration
def test_workers_stop_when_their_parent_is_killed(tmp_path):
    """A parent killed by SIGKILL (or SIGTERM) takes no worker with it: the workers notice within seconds, stop and
    let their run directories go, instead of running the rest of the grid as orphans. SIGINT is ignored here, as in
    a grid started with `&` from a script (its workers inherit that): the first version stopped the workers with
    SIGINT and passed this test run in a terminal, but not in CI."""
    import signal
    import subprocess
    import sys
    import time

    from dpfl.experiment.run_lock import lock_holder

    code = ("import signal, sys; from functools import partial; from pathlib import Path; from lock_holder import "
            "hold_until_killed; from dpfl.reproduce.workers import in_workers\n"
            "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # as for a grid started in the background (`&`)
            "in_workers(partial(hold_until_killed, Path(sys.argv[1])), 2, threads=1)\n")
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=Path(__file__).parents[1])
    dirs = [tmp_path / "1", tmp_path / "2"]
    try:
        deadline = time.monotonic() + 120
        while not all(d.is_dir() and lock_holder(d) for d in dirs):
            assert time.monotonic() < deadline and parent.poll() is None, "the workers never took their directories"
            time.sleep(0.2)
        holders = [lock_holder(d) for d in dirs]
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
    assert all(h and f"pid {parent.pid} " not in h for h in holders)  # held by the workers, not the parent
    deadline = time.monotonic() + 30
    while any(lock_holder(d) for d in dirs):
        assert time.monotonic() < deadline, f"orphaned workers still hold {[lock_holder(d) for d in dirs]}"
        time.sleep(0.2)


def test_a_worker_lists_the_rows_it_ran_not_those_finished_before(capsys):
    from dpfl.reproduce.workers import _rows

    def run_row(item: str, cache: dict) -> dict:
        if item == "held":
            raise RunDirectoryBusy("in use by another process")
        return {"status": "ok", "item": item}

    rows = _rows(run_row, ["old", "new", "held"], ["a", "b", "c"], [True, False, False], 1)
    assert rows == [{"status": "ok", "item": "old"}, {"status": "ok", "item": "new"}, None]
    assert capsys.readouterr().err.splitlines() == ["worker 1: [2/3] b: ok"]

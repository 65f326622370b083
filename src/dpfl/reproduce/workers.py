"""One grid, several worker processes: `dpfl reproduce ... --workers N`.

Why: a grid's runs are independent, and small models gain less from more torch threads than from more runs at once
(on 2 cores, `benchmarks/grid_workers.py`: logistic regression 1.58x one process using both cores, where the second
thread slows a run down; the PFA CNN, which uses the second thread well, 1.05x). Each worker is a
process that walks the same job list with `run_jobs`; the run-directory lock (`dpfl.experiment.run_lock`) makes a
worker skip the job another one is running, and each job's state is read again when its turn comes, so every job is
run once, into its own directory, whichever worker reaches it first. The same happens with N invocations by hand on
one --out; this module only starts them and merges what they did into one outcome per job.

Each worker uses `threads` torch threads (default: this process's thread count divided among the workers, at least
one). A number reproduces bit for bit with the same code and thread count, and every run's environment.jsonl records
its thread count, so a grid run with workers is as reproducible as one run without.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TypeVar

from dpfl.experiment.run_lock import LOCKS_AVAILABLE, RunDirectoryBusy
from dpfl.reproduce.jobs import Job
from dpfl.reproduce.pace import RoundPace
from dpfl.reproduce.runner import FAILED, FINISHED, OK, SKIPPED, Outcome, Progress, check_existing, run_jobs
from dpfl.results.formatting import accuracy_words, round_accuracy

__all__ = ["WorkerDied", "default_threads", "in_workers", "merge_outcomes", "rows_in_workers",
           "run_jobs_in_workers"]

T = TypeVar("T")


class WorkerDied(RuntimeError):
    """A worker process ended without returning (killed): the grid is resumable, nothing finished is lost."""


def default_threads(workers: int) -> int:
    """This process's torch thread count divided among `workers` processes (at least one thread each)."""
    import torch

    return max(1, torch.get_num_threads() // workers)


def run_jobs_in_workers(jobs: Sequence[Job], out: Path, workers: int, *, threads: int | None = None) -> list[Outcome]:
    """`run_jobs(jobs, out)` shared by `workers` processes; one Outcome per job, in order (`merge_outcomes`).

    Raises ConfigMismatchError before any process starts if a directory holds another config, and ValueError where
    run directories cannot be locked (no `fcntl`: the workers would train into one directory together)."""
    states = check_existing(jobs, out)  # a user error, said once, before any process starts
    done = sum(state == FINISHED for state in states.values())
    if done:  # said once here: the workers do not list them (each would, one line per job)
        _say(_finished_line(done, len(jobs), workers))
    return merge_outcomes(in_workers(partial(_run_jobs, list(jobs), Path(out)), workers, threads))


def in_workers(work: Callable[[int], T], workers: int, threads: int | None = None) -> list[T]:
    """`work(k)` in worker processes k = 1..workers at once, each with `threads` torch threads (default
    `default_threads`); their results in order. `work` must pickle (a module-level function or a partial of one).
    Raises WorkerDied if a worker is killed. workers = 1 still spawns one process (the studies run a single worker
    in their own process instead, without calling this)."""
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    if workers > 1 and not LOCKS_AVAILABLE:
        raise ValueError("--workers needs run-directory locks (fcntl), which this platform lacks; run one worker")
    threads = threads or default_threads(workers)
    # spawn, not fork: a forked child would inherit this process's torch thread pools and locks half-initialised
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_in_worker, work, k, threads) for k in range(1, workers + 1)]
        try:
            return [f.result() for f in futures]
        except BrokenProcessPool:
            raise WorkerDied("a worker process died (killed, or out of memory?); every finished run stays, and the "
                             "same command continues the grid") from None


def _in_worker(work: Callable[[int], T], worker: int, threads: int) -> T:
    import torch

    torch.set_num_threads(threads)
    _exit_when_orphaned(os.getppid())
    return work(worker)


def _exit_when_orphaned(parent: int, every: float = 1.0) -> None:
    """End this worker at once when its parent is gone. Why: a parent killed by SIGTERM or SIGKILL takes no worker
    with it, and a worker walks the whole job list, so an orphan would train the rest of the grid on its own. The exit
    is what SIGKILL would do (no signal: a worker started in the background ignores SIGINT), and a killed run is safe:
    its files are written atomically, the kernel frees its lock, and the next invocation resumes it from its last
    checkpoint."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)

    threading.Thread(target=watch, name="dpfl-orphan-watch", daemon=True).start()


def rows_in_workers(run_row: Callable[[Any, dict], dict[str, Any]], items: Sequence[Any], names: Sequence[str],
                    workers: int, finished: Sequence[bool] | None = None) -> list[dict[str, Any] | None]:
    """For the studies whose jobs each give a results row (mpdp, attacks): `run_row(item, cache)` for every item,
    shared by `workers` processes (`cache`: one dict per process, for what its jobs share). `run_row` raises
    RunDirectoryBusy for a job another process holds. A job's row is the one of the worker that ran it (an ok row
    over a failed one), None if none did; `names` label the progress lines, `finished` marks the items finished
    before (counted in one line, their rows read back without a line per worker)."""
    finished = list(finished) if finished is not None else [False] * len(items)
    if any(finished):
        _say(_finished_line(sum(finished), len(items), workers))
    per_worker = in_workers(partial(_rows, run_row, list(items), list(names), finished), workers)
    merged = []
    for same_job in zip(*per_worker, strict=True):
        found = [r for r in same_job if r is not None]
        merged.append(next((r for r in found if r.get("status") == "ok"), found[0] if found else None))
    return merged


def _rows(run_row: Callable[[Any, dict], dict[str, Any]], items: list[Any], names: list[str], finished: list[bool],
          worker: int) -> list[dict[str, Any] | None]:
    cache: dict[Any, Any] = {}
    rows: list[dict[str, Any] | None] = []
    for n, (item, name, done) in enumerate(zip(items, names, finished, strict=True), 1):
        try:
            rows.append(run_row(item, cache))
        except RunDirectoryBusy:  # another worker's job: that worker reports it
            rows.append(None)
            continue
        if not done:
            _say(f"worker {worker}: [{n}/{len(items)}] {name}: {rows[-1].get('status')}")
    return rows


def _finished_line(done: int, total: int, workers: int) -> str:
    return (f"all {done} jobs finished before" if done == total
            else f"{done} of {total} jobs finished before; {workers} workers run the others")


def merge_outcomes(per_worker: Sequence[Sequence[Outcome]]) -> list[Outcome]:
    """One outcome per job from every worker's: the worker that acted on it (ran, resumed or copied it, or failed)
    over one that found it finished, over one that skipped it (another worker held it, or its dataset is missing).
    A job one worker failed and another then resumed to the end is the success."""
    def rank(o: Outcome) -> int:
        if o.status == OK:
            return 1 if o.action in ("finished before", "collected") else 3
        return 2 if o.status == FAILED else 0

    merged = []
    for same_job in zip(*per_worker, strict=True):
        assert len({o.job.key for o in same_job}) == 1, "workers walk the same job list"
        merged.append(max(same_job, key=rank))  # max keeps the first of equal rank
    return merged


class _Lines(Progress):
    """One line when a worker's run has trained its first round and one when a job it acted on ends, prefixed with
    the worker's number (a bar per worker would fight over the terminal). Not at `start`: two workers may both
    prepare a job (data, calibration) before one of them takes its directory; the other then skips it."""

    def __init__(self, worker: int) -> None:
        self.prefix = f"worker {worker}:"
        self.started: tuple[int, int, int] | None = None  # (index, total, rounds) of the job being prepared
        self.pace: tuple[str, RoundPace] | None = None  # the running job's line prefix and pace
        self.accuracy: tuple[str, float] | None = None  # the running job's last round_accuracy

    def start(self, job: Job, index: int, total: int, rounds: int) -> None:
        self.started = (index, total, rounds)

    def round(self, job: Job, row: dict[str, Any]) -> None:
        self.accuracy = round_accuracy(row) or self.accuracy
        if self.started is not None:
            index, total, rounds = self.started
            self.started = None
            name = f"{self.prefix} [{index}/{total}] {job.setting} {job.method} seed{job.seed}:"
            self.pace = (name, RoundPace(rounds))
            _say(f"{name} running (round {row['round']} of {rounds} done)")
        elif self.pace is not None and (line := self.pace[1].line(row)):
            _say(f"{self.pace[0]} {line}, {accuracy_words(self.accuracy)}")

    def end(self, outcome: Outcome, index: int, total: int) -> None:
        job, self.started, self.pace, self.accuracy = outcome.job, None, None, None
        if outcome.status == SKIPPED and "another process" in outcome.message:
            return  # another worker's job: that worker reports it
        if outcome.status == OK and outcome.action == "finished before":
            return  # finished before the grid (counted once at its start) or by another worker, which said so
        detail = outcome.action
        if outcome.status == OK and outcome.action in ("ran", "resumed"):
            detail = f"{outcome.action}, {outcome.seconds:.0f} s"
        if outcome.message:
            detail = f"{detail}: {outcome.message}" if detail else outcome.message
        _say(f"{self.prefix} [{index}/{total}] {job.setting} {job.method} seed{job.seed}: {outcome.status}"
             + (f" ({detail})" if detail else ""))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run_jobs(jobs: list[Job], out: Path, worker: int) -> list[Outcome]:
    return run_jobs(jobs, out, progress=_Lines(worker))

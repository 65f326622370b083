"""Run a comparison's jobs one after the other, each into its own run directory, resumably.

Why it looks like this:
- Every job is an ordinary run directory (`dpfl.experiment.run_directory.execute`), so each can be
  inspected, reported (`dpfl report`) or resumed on its own.
- Re-running the same command continues where it stopped: a job whose directory holds summary.json is
  done and skipped; one with a config.yaml but no summary is resumed (from its checkpoint, or restarted
  in place). A directory whose saved config differs from the job's is refused up front, before
  anything runs: the same --out with other options would otherwise mix two experiments.
- One failing job must not cost the others: its exception is recorded (status "failed", the traceback
  in OUT/logs/) and the next job starts. A dataset that is not on this machine skips every job that
  needs it ("skipped").
- Jobs run sequentially in one process. Several processes may share an --out (two invocations split by --settings,
  or `--workers`, `dpfl.reproduce.workers`): each job's state (and its twins') is read again when its turn comes, a
  job another process is running or copying (its directory's lock held, `dpfl.experiment.run_lock`) is skipped,
  and one another process finished while this one prepared it is finished: never trained twice into one
  directory.
- A job whose config equals a finished job's but for its name (a non-private reference listed under every
  budget setting, say) is not run again: the finished run directory is copied (`copy_finished_run`; the copy's
  summary.json names its source in `same_run_as`).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpfl.experiment.config import ConfigError, config_to_yaml, load_config
from dpfl.reproduce.jobs import RUNS_DIR, Grid, Job
from dpfl.reproduce.pace import RoundPace
from dpfl.results.formatting import accuracy_words, round_accuracy
from dpfl.results.run_files import CONFIG_FILE, SUMMARY_FILE, read_metrics, write_text_atomic

__all__ = ["OK", "FAILED", "SKIPPED", "INCOMPLETE", "ConfigMismatchError", "Outcome", "Progress", "RichProgress",
           "check_existing", "collect_finished", "describe_jobs", "job_state", "run_jobs"]

OK, FAILED, SKIPPED, INCOMPLETE = "ok", "failed", "skipped", "incomplete"
LOGS_DIR = "logs"

# job directory states
NEW, FINISHED, PARTIAL, DIFFERS = "new", "finished", "partial", "config differs"


class ConfigMismatchError(ValueError):
    """An existing run directory holds a run of another config (a user error: other options, same --out)."""


@dataclass
class Outcome:
    """What happened to a job in this invocation. `action`: ran, resumed, finished before, collected, ""."""

    job: Job
    run_dir: Path
    status: str
    action: str = ""
    message: str = ""
    seconds: float = 0.0


def job_state(job: Job, out: Path) -> tuple[str, str]:
    """(state, reason) of a job's directory: new, finished, partial, or config differs (with why)."""
    d = job.run_dir(out)
    if not (d / CONFIG_FILE).is_file():
        return NEW, ""
    try:
        saved = config_to_yaml(load_config(d / CONFIG_FILE))
    except ConfigError as err:
        return DIFFERS, f"its config.yaml does not load ({err})"
    if saved != config_to_yaml(job.config):
        return DIFFERS, first_difference(saved, config_to_yaml(job.config))
    return (FINISHED if (d / SUMMARY_FILE).is_file() else PARTIAL), ""


def first_difference(saved: str, wanted: str) -> str:
    """The first line where two configs' YAML texts differ, for an error message."""
    for a, b in zip(saved.splitlines(), wanted.splitlines(), strict=False):
        if a != b:
            return f"saved '{a.strip()}', this job '{b.strip()}'"
    return "the configs differ"


def check_existing(jobs: Sequence[Job], out: Path) -> dict[tuple[str, str, int], str]:
    """Each job's directory state; raises ConfigMismatchError if any directory holds another config."""
    states = {}
    for job in jobs:
        state, why = job_state(job, out)
        if state == DIFFERS:
            raise ConfigMismatchError(
                f"{job.run_dir(out)} holds a run with a different config ({why}); use another --out, or the "
                "options that made it")
        states[job.key] = state
    return states


class Progress:
    """Callbacks of `run_jobs` (all optional): a job starts, a round ends, a job ends."""

    def start(self, job: Job, index: int, total: int, rounds: int) -> None: ...

    def round(self, job: Job, row: dict[str, Any]) -> None: ...

    def end(self, outcome: Outcome, index: int, total: int) -> None: ...


def run_jobs(jobs: Sequence[Job], out: Path, *, progress: Progress | None = None,
             execute: Callable[..., dict[str, Any]] | None = None) -> list[Outcome]:
    """Run every job not finished yet (see the module docstring); one Outcome per job, in order.

    `execute` defaults to `dpfl.experiment.run_directory.execute` (tests pass a stand-in). Raises
    ConfigMismatchError before running anything if a directory holds another config. KeyboardInterrupt
    propagates: the interrupted job resumes on the next invocation.
    """
    from dpfl.data.errors import DatasetNotFoundError
    from dpfl.experiment.run_directory import copy_finished_run, twin_key
    from dpfl.experiment.run_lock import RunDirectoryBusy

    if execute is None:
        from dpfl.experiment.run_directory import execute
    out = Path(out)
    progress = progress or Progress()
    states = check_existing(jobs, out)
    missing: dict[str, str] = {}  # dataset -> why it is skipped
    finished = _finished_twins(jobs, states)
    keys = {job.key: twin_key(job.config) for job in jobs}  # a config's YAML: computed once per job
    twins: dict[str, list[Job]] = {}  # twin_key -> the jobs of that config, in order
    for job in jobs:
        twins.setdefault(keys[job.key], []).append(job)
    outcomes = []
    for index, job in enumerate(jobs, start=1):
        d = job.run_dir(out)
        state = states[job.key]
        if state != FINISHED:  # another process sharing --out may have started or finished it since
            state = job_state(job, out)[0]
        dataset = job.config.data.dataset
        key = keys[job.key]
        if state == NEW and key not in finished:  # ... or finished a twin of it (the first, as _finished_twins)
            done = next((j for j in twins[key] if j is not job and job_state(j, out)[0] == FINISHED), None)
            if done is not None:
                finished[key] = done
        twin = finished[key].run_dir(out) if state == NEW and key in finished else None
        if state == FINISHED:
            outcome = Outcome(job, d, OK, "finished before")
        elif twin is not None:
            try:
                copy_finished_run(twin, job.config, d)
            except RunDirectoryBusy as err:  # another process is copying it now
                outcome = Outcome(job, d, SKIPPED, message=_one_line(err))
            except Exception as err:  # noqa: BLE001 - e.g. a damaged source: recorded like a failed job
                outcome = _failure(job, out, state, err, "copy")
            else:
                outcome = Outcome(job, d, OK, f"copied from {twin.relative_to(out)}: the same config but for its name")
        elif dataset in missing:
            outcome = Outcome(job, d, SKIPPED, message=missing[dataset])
        else:
            progress.start(job, index, len(jobs), job.config.training.rounds)
            started = time.perf_counter()
            try:
                execute(job.config, d, resume=state == PARTIAL, on_round=lambda row, j=job: progress.round(j, row))
            except DatasetNotFoundError as err:
                missing[dataset] = f"dataset {dataset} is not available on this machine ({_one_line(err)})"
                outcome = Outcome(job, d, SKIPPED, message=missing[dataset])
            except RunDirectoryBusy as err:  # another process is running this job: its result is that process's
                outcome = Outcome(job, d, SKIPPED, message=_one_line(err))
            except Exception as err:  # noqa: BLE001 - one failing job must not stop the comparison
                outcome = _failure(job, out, state, err, "resumed" if state == PARTIAL else "ran",
                                   time.perf_counter() - started)
            else:
                _log_path(out, job).unlink(missing_ok=True)
                outcome = Outcome(job, d, OK, "resumed" if state == PARTIAL else "ran",
                                  seconds=time.perf_counter() - started)
                if (d / SUMMARY_FILE).is_file():
                    finished.setdefault(key, job)
        outcomes.append(outcome)
        progress.end(outcome, index, len(jobs))
    return outcomes


def _failure(job: Job, out: Path, state: str, err: Exception, action: str, seconds: float = 0.0) -> Outcome:
    """A job's exception as its outcome: failed, with the traceback in OUT/logs/, unless another process filled the
    job's directory meanwhile (`_raced`)."""
    raced = _raced(job, out, state, err)
    if raced is not None:
        return raced
    log = _write_log(out, job, err)
    return Outcome(job, job.run_dir(out), FAILED, action,
                   f"{type(err).__name__}: {_one_line(err)} (traceback: {log.relative_to(out)})", seconds)


def _raced(job: Job, out: Path, state: str, err: Exception) -> Outcome | None:
    """The outcome of a new job whose directory another process filled while this one prepared the run (loaded the
    data, calibrated) or the copy: `execute` and `copy_finished_run` refuse a directory that is no longer empty.
    None for any other error."""
    from dpfl.experiment.run_directory import RunDirectoryOccupied

    if state != NEW or not isinstance(err, RunDirectoryOccupied):
        return None
    now = job_state(job, out)[0]
    if now == FINISHED:
        return Outcome(job, job.run_dir(out), OK, "finished before", "by another process, while this one prepared it")
    if now == PARTIAL:
        return Outcome(job, job.run_dir(out), SKIPPED, message="another process started it while this one prepared it")
    return None


def _finished_twins(jobs: Sequence[Job], states: dict[tuple[str, str, int], str]) -> dict[str, Job]:
    """twin_key -> the first job whose directory holds a finished run of that config (what a NEW twin copies)."""
    from dpfl.experiment.run_directory import twin_key

    finished: dict[str, Job] = {}
    for job in jobs:
        if states[job.key] == FINISHED:
            finished.setdefault(twin_key(job.config), job)
    return finished


def collect_finished(jobs: Sequence[Job], out: Path) -> list[Outcome]:
    """Outcomes of jobs (not run now) whose directory holds a finished run of exactly their config."""
    found = []
    for job in jobs:
        if job_state(job, Path(out))[0] == FINISHED:
            found.append(Outcome(job, job.run_dir(out), OK, "collected"))
    return found


def describe_jobs(grid: Grid, out: Path) -> list[str]:
    """The --dry-run listing: the scale, the notes, and one aligned line per job with its directory's state."""
    from dpfl.data import available
    from dpfl.experiment.run_directory import twin_key
    from dpfl.experiment.run_lock import lock_holder

    missing = {r["name"] for r in available() if r.get("source") == "missing" and not r.get("fetchable")}
    lines = [f"{grid.paper}, scale {grid.label}: {len(grid.jobs)} jobs -> {Path(out) / RUNS_DIR}"]
    lines += [f"note: {note}" for note in [*grid.selection, *grid.notes]]
    rows = [("setting", "method", "seed", "state", "label")]
    reasons = {job.key: job_state(job, out) for job in grid.jobs}
    finished = _finished_twins(grid.jobs, {k: state for k, (state, _) in reasons.items()})
    for job in grid.jobs:
        state, why = reasons[job.key]
        twin = finished.get(twin_key(job.config)) if state == NEW else None
        holder = lock_holder(job.run_dir(out)) if state in (NEW, PARTIAL) else None
        if holder is not None:
            state = f"running in another process ({holder}{_rounds_logged(job, out, ', ')})"
        elif state == PARTIAL:
            state = f"{state}{_rounds_logged(job, out, ': ')}"
        elif twin is not None:
            state = f"new: copies {twin.setting}'s (same run)"
        elif job.config.data.dataset in missing and state == NEW:
            state = f"dataset {job.config.data.dataset} not found locally: would be skipped"
        rows.append((job.setting, job.method, str(job.seed), f"{state}: {why}" if why else state, job.label))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return lines + ["  ".join([*(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)), r[4]]).rstrip() for r in rows]


def _rounds_logged(job: Job, out: Path, sep: str) -> str:
    """How far an unfinished job's directory got ("round 42 of 200 logged"), or "" when it cannot tell."""
    try:
        rows = read_metrics(job.run_dir(out))
    except (OSError, ValueError):
        return ""
    return f"{sep}round {rows[-1]['round']} of {job.config.training.rounds} logged" if rows else ""


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _log_path(out: Path, job: Job) -> Path:
    return out / LOGS_DIR / f"{job.setting}.{job.method}.seed{job.seed}.log"


def _write_log(out: Path, job: Job, err: BaseException) -> Path:
    path = _log_path(out, job)
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    write_text_atomic(path, f"job {job.setting} / {job.method} / seed {job.seed}\n\n{text}")
    return path


class RichProgress(Progress):
    """A progress bar of the current job's rounds and one line per finished job, on a rich Console
    (the `dpfl run` style); the bar shows only on a terminal or with DPFL_PROGRESS set. Without the bar (a log
    file), a line about the running job's pace every `pace.PACE_EVERY` seconds instead."""

    def __init__(self, console: Any) -> None:
        import os

        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        self.console = console
        self.bar = Bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=console,
                       disable=not console.is_terminal and "DPFL_PROGRESS" not in os.environ)
        self.task: Any = None
        self.accuracy: tuple[str, float] | None = None  # the running job's last round_accuracy
        self.pace: tuple[str, RoundPace] | None = None  # without the bar: the running job's name and pace

    def __enter__(self) -> RichProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def start(self, job: Job, index: int, total: int, rounds: int) -> None:
        self.accuracy = None
        name = f"[{index}/{total}] {job.setting} {job.method} seed{job.seed}"
        self.task = self.bar.add_task(name, total=rounds, status="preparing (data, calibration)")
        self.pace = (name, RoundPace(rounds)) if self.bar.disable else None

    def round(self, job: Job, row: dict[str, Any]) -> None:
        self.accuracy = round_accuracy(row) or self.accuracy
        acc = accuracy_words(self.accuracy)
        self.bar.update(self.task, completed=row["round"], status=acc)
        if self.pace is not None and (line := self.pace[1].line(row)):
            self.console.print(f"{self.pace[0]}: {line}, {acc}", markup=False, highlight=False)

    def end(self, outcome: Outcome, index: int, total: int) -> None:
        self.pace = None
        if self.task is not None:
            self.bar.remove_task(self.task)
            self.task = None
        job = outcome.job
        what = {OK: "ok", FAILED: "FAILED", SKIPPED: "skipped"}.get(outcome.status, outcome.status)
        detail = outcome.action
        if outcome.status == OK and outcome.action in ("ran", "resumed"):
            detail = f"{outcome.action}, final {accuracy_words(self.accuracy, 4)}, {outcome.seconds:.0f} s"
        if outcome.message:
            detail = f"{detail}: {outcome.message}" if detail else outcome.message
        self.console.print(f"[{index}/{total}] {job.setting} {job.method} seed{job.seed}: {what}"
                           + (f" ({detail})" if detail else ""), markup=False, highlight=False)

"""What produced a run: code, libraries, torch threads and CPU kernels of each execution of it (`environment.jsonl`).

Why: a dpfl run is bit-identical when the config, the code, the torch thread count and the kernels torch dispatches
on the CPU are the same, and only then. The thread count changes the order in which floats are summed (e.g. 0.7131
vs 0.7136 final accuracy for one reduced splitting CNN run on one and two threads); AVX2 and AVX-512 kernels round
differently (the f-DP stand-in's test loss after 3 rounds: 2.5275017 vs 2.5275022). torch's own kernels follow
`cpu_capability`; MKL and oneDNN pick theirs from the CPU (forcing any one of the three to AVX2 changed the losses),
hence the CPU model too. A resumed run may continue under other code, threads or machines. One line per execution
(the fresh start, then each resume that trains) records what ran from which round, so a number that does not
reproduce says why, or at least what changed.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from dpfl.results.run_files import (RunDirError, append_jsonl, complete_jsonl_rows, truncate_jsonl)

__all__ = ["ENVIRONMENT_FILE", "REPRODUCIBILITY_KEYS", "describe", "describe_job", "read_environment",
           "record_environment", "provenance", "computed_by", "computed_and_written",
           "job_executions", "run_environments", "changed_keys", "unrecorded_keys"]

ENVIRONMENT_FILE = "environment.jsonl"
# What changes a run's numbers (everything else in a line only describes the machine or the time).
REPRODUCIBILITY_KEYS = ("dpfl", "source_commit", "source_modified", "torch", "numpy", "torch_threads",
                        "cpu_capability", "cpu_model", "device")


@functools.lru_cache(maxsize=1)
def _source_revision() -> tuple[str | None, bool | None]:
    """(commit, modified) of the git checkout dpfl is imported from; (None, None) for an installed wheel or
    without git. Read once per process, when this module is imported (below): every command that records an
    environment imports it before its first run or point, so a commit made while a long job runs is not
    attributed to it (it was, when this was read at the first record, after the first point had finished)."""
    package = Path(__file__).resolve().parents[1]
    if not any((p / ".git").exists() for p in package.parents):
        return None, None
    try:
        commit = subprocess.run(["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(package), "status", "--porcelain", "--", "."],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit or None, bool(status.strip())


_source_revision()  # at import: the revision of the code this process started with


def describe(started_round: int, device: str = "cpu") -> dict[str, Any]:
    """This process's environment as one environment.jsonl line, for an execution that starts after
    `started_round` rounds (0: a fresh start) and trains on `device` (a CUDA device adds its GPU's name: CUDA
    kernels, and so the last digits, differ between GPU models as the CPU's do between CPUs)."""
    import numpy as np  # here, not at import: the study writers that only format a line stay light
    import torch

    from dpfl import __version__

    commit, modified = _source_revision()
    return {"started_round": started_round,
            "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "dpfl": __version__, "source_commit": commit, "source_modified": modified,
            "python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_model": _cpu_model(),
            "platform": platform.platform(), "processor": platform.machine(), "device": device,
            **({"gpu": torch.cuda.get_device_name(torch.device(device))} if device.startswith("cuda") else {})}


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str | None:
    """The CPU's model name (Linux: /proc/cpuinfo; may be generic on a virtual machine): MKL and oneDNN choose their
    kernels from the CPU, torch's own kernels are `cpu_capability` (e.g. "AVX512"; ATEN_CPU_CAPABILITY lowers it)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def read_environment(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The directory's executions, oldest first; [] when it has none (runs made before this file existed).
    A damaged complete line is a RunDirError naming the file (a partial last line is a kill's trace: skipped)."""
    path = Path(run_dir) / ENVIRONMENT_FILE
    try:
        return complete_jsonl_rows(path)
    except ValueError as e:
        raise RunDirError(run_dir, f"corrupt: {' '.join(str(e).split())}; nothing was changed; delete "
                                   f"{ENVIRONMENT_FILE} to go on (it only describes the executions; no result "
                                   "depends on it)", ENVIRONMENT_FILE) from None


def record_environment(run_dir: str | os.PathLike[str], started_round: int, device: str = "cpu") -> dict[str, Any]:
    """Append this execution's line (after dropping a partial last line a kill may have left) and return it."""
    path = Path(run_dir) / ENVIRONMENT_FILE
    rows = read_environment(run_dir)
    truncate_jsonl(path, len(rows))
    line = describe(started_round, device)
    append_jsonl(path, line)
    return line


def describe_job() -> dict[str, Any]:
    """The environment of a result this process computes whole (a study's per-job JSON, which does not resume)."""
    e = describe(0)
    del e["started_round"]
    return e


def job_executions(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A per-job JSON result's `environment` as `computed_by`'s executions ([] when saved before dpfl recorded it)."""
    return [dict(result["environment"])] if result.get("environment") else []


def _summary(e: Mapping[str, Any]) -> str:
    """The reproducibility keys of one environment line as text."""
    source = ("" if e.get("source_commit") is None else
              f", source {e['source_commit'][:10]}" + (" with uncommitted changes" if e.get("source_modified") else ""))
    threads = e.get("torch_threads")
    kernels = f", {e['cpu_capability']} kernels" if e.get("cpu_capability") else ""
    return (f"dpfl {e.get('dpfl')}{source}, torch {e.get('torch')}, numpy {e.get('numpy')}, {threads} torch "
            f"thread{'s' * (threads != 1)}{kernels}")


def provenance() -> str:
    """One line for a study's results.md: the code and threads of the process that wrote it (`computed_by` says
    which computed its results)."""
    return _summary(describe(0))


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}{'s' * (n != 1)}"


def computed_by(jobs: Iterable[Sequence[Mapping[str, Any]]], unit: str = "run") -> str:
    """One line for a study's results.md: the environments its results were computed in, with how many `unit`s each.

    `jobs`: per job, its executions (a run directory's environment.jsonl lines, or a per-job JSON's one
    environment; empty when none was recorded). A job resumed under another environment counts under each.
    """
    counts: dict[str, int] = {}
    unrecorded = partly = mixed = 0
    for executions in jobs:
        if not executions:
            unrecorded += 1
            continue
        partly += executions[0].get("started_round", 0) > 0
        mixed += bool(changed_keys(list(executions)))
        for text in dict.fromkeys(_summary(e) for e in executions):
            counts[text] = counts.get(text, 0) + 1
    parts = [f"{text} ({_count(n, unit)})" for text, n in counts.items()]
    if mixed:
        parts.append(f"{_count(mixed, unit)} resumed under another environment (counted under each)")
    if partly:
        parts.append(f"{_count(partly, unit)} begun before dpfl recorded environments (its first rounds unrecorded)")
    if unrecorded:
        parts.append(f"{_count(unrecorded, unit)} with no recorded environment (computed before dpfl recorded it, "
                     "or its record is damaged)")
    return "; ".join(parts) if parts else f"no {unit}s yet"


def computed_and_written(jobs: Iterable[Sequence[Mapping[str, Any]]], unit: str = "run") -> str:
    """A study's provenance sentence: the environments that computed its `unit`s (`computed_by`), then the process
    that wrote the file (`provenance`)."""
    return f"{unit[:1].upper()}{unit[1:]}s computed by: {computed_by(jobs, unit)}. Written by: {provenance()}."


def run_environments(run_dirs: Iterable[str | os.PathLike[str]]) -> list[list[dict[str, Any]]]:
    """Each existing run directory's executions for `computed_by`. A job that never started (skipped: its dataset
    is missing) has no directory and is not a run; a damaged environment.jsonl reads as none recorded (a study's
    tables must still be written; the run's own report.md says what is wrong)."""
    out = []
    for d in run_dirs:
        if not Path(d).is_dir():
            continue
        try:
            out.append(read_environment(d))
        except RunDirError:
            out.append([])
    return out


def changed_keys(executions: list[dict[str, Any]]) -> list[str]:
    """The REPRODUCIBILITY_KEYS whose value differs between the executions that recorded it (empty: one consistent
    environment). A key an older dpfl did not record is `unrecorded_keys`', not a change."""
    return [k for k in REPRODUCIBILITY_KEYS if len({repr(e[k]) for e in executions if k in e}) > 1]


def unrecorded_keys(executions: list[dict[str, Any]]) -> list[str]:
    """The REPRODUCIBILITY_KEYS some executions recorded and others (an older dpfl's) did not: unknown, not equal."""
    return [k for k in REPRODUCIBILITY_KEYS if 0 < sum(k in e for e in executions) < len(executions)]

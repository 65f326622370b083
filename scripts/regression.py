#!/usr/bin/env python
"""Regression comparison of two dpfl checkouts: every shipped config (shortened) and every paper reproduction at ci
scale, run with each checkout's dpfl, then compared field by field (docs/development.md, "Comparing two commits").

    python scripts/regression.py list [--tree DIR] [--only PATTERN ...]
    python scripts/regression.py run TREE OUT [--only PATTERN ...] [--workers N] [--timeout S]
    python scripts/regression.py diff OUT_A OUT_B [--rtol 0]
    python scripts/regression.py compare REV_A REV_B OUT [--only ...] [--workers N] [--rtol 0] [--keep]

The jobs (`jobs_of`): every YAML under TREE/configs/, its kind read from its content (`config_job`):
- an MP-DP config in the old flat schema (`scheme: mpdp`, trees before issue 64): `dpfl run CONFIG --set rounds=2`;
- a run config (data/model sections): `dpfl run CONFIG --set training.rounds=2`, unless its header shows it is meant
  for `dpfl attack invert` / `dpfl audit` (and not for `dpfl run`): then that command as the header writes it;
  a run refused for too few rounds, whose one-line error names its shortest setting (R-DPCFL: ">= 3"), runs again
  with that many (`Job.at_least_rounds`), on both sides alike;
- a convex setting of `dpfl reproduce splitting` (problem + methods): skipped when the ci scale runs it (the
  reproduce/splitting job does), else `dpfl reproduce splitting --scale full --settings NAME --seeds 1 --rounds 20`;
- a config whose dataset the tree's data catalog (`dpfl data list --json`) lists as missing: skipped, with the reason.
And every `dpfl reproduce <family> --scale ci` (the families from the tree's `dpfl reproduce --help`, `merge` aside),
plus the extra modes that have a ci scale (REPRODUCE_MODES), each a job of its own.

Each job runs as `python -c CLI ARGS... --out OUT/<job>` with PYTHONPATH=TREE/src, cwd TREE and the thread settings of
FIXED_ENV; OUT/jobs.json records each job's exit code, wall seconds and stderr tail (full logs in OUT/logs/).

Standalone on purpose: stdlib and PyYAML only, no dpfl import here (it drives two different checkouts of dpfl).
Exit codes: 0 fine / no difference, 1 a job failed / differences found, 2 usage error.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import fnmatch
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

REPO = Path(__file__).resolve().parents[1]
CLI = "import sys; from dpfl.cli import main; sys.exit(main(sys.argv[1:]))"  # dpfl.cli:main(argv) exits itself
RUN_ROUNDS = 2  # rounds of every shortened run config (MP-DP ones too)
# A config that refuses RUN_ROUNDS names its own shortest setting in its one-line error (R-DPCFL's two-stage plan:
# "rounds must be an integer >= 3, got 2"); the job then runs once more with that many rounds (`at_least_rounds`).
TOO_FEW_ROUNDS = re.compile(r"rounds must be an integer >= (\d+), got " + str(RUN_ROUNDS) + r"\b")
CONVEX_ROUNDS = 20  # rounds of a full-scale-only convex splitting setting (float64 least squares / logistic: cheap)
USAGE = 2

# The same for every job and both sides: one thread everywhere (torch reads OMP_NUM_THREADS; dpfl itself reads no
# thread variable, its reproduce --workers divide this process's torch threads), no download, no GPU, a fixed hash
# seed. DPFL_PROGRESS is removed (it only draws a bar); DPFL_DATA, DPFL_MALLOC_TUNING and the rest are inherited.
FIXED_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1",
             "VECLIB_MAXIMUM_THREADS": "1", "PYTHONHASHSEED": "0", "DPFL_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "",
             "COLUMNS": "120"}
REMOVED_ENV = ("DPFL_PROGRESS", "PYTHONSTARTUP")

KNOWN_FAMILIES = ("pfa", "robust-hdp", "fedceo", "fdp-accuracy", "rdpcfl", "splitting", "mpdp", "attacks",
                  "fdp-sensitivity")  # used when the tree's `dpfl reproduce --help` cannot be read
NOT_FAMILIES = ("merge",)  # `dpfl reproduce` commands that are not a reproduction
# Modes of a family that run something else than its comparison and have a ci scale: (job suffix, options).
REPRODUCE_MODES = {
    "robust-hdp": (("noise-table", ("--noise-table",)),),
    "fedceo": (("dlg", ("--dlg",)), ("search", ("--search",)), ("shards", ("--partition", "shards")),
               ("udp", ("--mechanism", "udp"))),
    "rdpcfl": (("round1-analysis", ("--round1-analysis",)),),
}

# Wall seconds per job measured on 7a6aa21 with `run --workers 1` on a shared 2-core machine (another run and test
# runs beside it: upper bounds; the R-DPCFL configs at their 3 rounds). `list` and `run` add them up; a job not
# measured counts as unknown.
MEASURED_SECONDS: dict[str, float] = {
    "config/attacks/ci_fmnist": 16, "config/attacks/digits_cnn": 14, "config/attacks/overfit_fmnist": 14,
    "config/demo": 11, "config/digits_udp": 11, "config/fdp/accuracy_ci_digits_logr": 11,
    "config/fdp/accuracy_reduced_fmnist_lenet5": 25, "config/fdp/digits_noisy_fedavg": 11,
    "config/fdp/sensitivity_ci": 10, "config/fedceo/ci_fmnist_mlp": 14, "config/fedceo/fmnist_mlp": 17,
    "config/fedceo/fmnist_mlp_sg1.5_ci": 13, "config/fedceo/reduced_fmnist_mlp": 13, "config/fmnist_central": 11,
    "config/fmnist_dpsgd": 17, "config/hdp/misreport_fmnist_ci": 11, "config/hdp/pfa/ci_fmnist_cnn_pfa": 13,
    "config/hdp/pfa/ci_fmnist_logr": 10, "config/hdp/pfa/fmnist_cnn_pfa": 14, "config/hdp/pfa/fmnist_logr": 10,
    "config/hdp/rhdp/ci_fmnist": 16, "config/hdp/rhdp/fmnist": 54, "config/hdp_fmnist_mixgauss1": 12,
    "config/mpdp/ci_digits_cnn": 11, "config/mpdp/ci_digits_k100": 12, "config/mpdp/ci_digits_mlp": 10,
    "config/mpdp/ci_digits_mlp_hardened": 10, "config/mpdp/ci_fmnist_mlp": 12, "config/mpdp/overfit_fmnist_mlp": 11,
    "config/rdpcfl/analysis_round1_batch": 510, "config/rdpcfl/ci_digits_rotation": 34,
    "config/rdpcfl/ci_fmnist_rotation": 75, "config/rdpcfl/fmnist_label_flip": 370,
    "config/rdpcfl/fmnist_label_shift": 321, "config/rdpcfl/fmnist_rotation": 365,
    "config/secure/digits_distributed": 13, "config/splitting/cnn_fmnist_iid": 32,
    "config/splitting/cnn_fmnist_shards2": 33, "config/splitting/cnn_fmnist_shards6": 31,
    "config/splitting/convex/lr_flip": 37, "config/splitting/convex/lr_heterogeneous": 31,
    "config/splitting/convex/ls_diminishing": 10, "config/splitting/convex/ls_dp": 11,
    "config/splitting/convex/ls_homogeneous": 12, "config/splitting/convex/ls_noise10": 12,
    "config/splitting/convex/ls_partial_p05": 15, "config/splitting/convex/ls_shift2": 13, "reproduce/attacks": 61,
    "reproduce/fdp-accuracy": 12, "reproduce/fdp-sensitivity": 16, "reproduce/fedceo": 63, "reproduce/fedceo-dlg": 51,
    "reproduce/fedceo-search": 170, "reproduce/fedceo-shards": 61, "reproduce/fedceo-udp": 40, "reproduce/mpdp": 267,
    "reproduce/pfa": 64, "reproduce/rdpcfl": 3370, "reproduce/rdpcfl-round1-analysis": 104,
    "reproduce/robust-hdp": 154, "reproduce/robust-hdp-noise-table": 50, "reproduce/splitting": 363,
}

# ---- what diff compares and ignores ------------------------------------------------------------------------------
COMPARED_SUFFIXES = (".json", ".jsonl", ".csv")  # plus config.yaml (the resolved config: a changed default shows)
COMPARED_NAMES = ("config.yaml",)
IGNORED_FILES = ("environment.jsonl",)  # every field of it describes the machine, the code or the time
# Keys (JSON, JSONL, YAML at any depth) and CSV columns that describe when, how long, on what or with which software
# a value was computed, never the value itself: fnmatch patterns, case-insensitive, matched against the key's name.
IGNORED_KEYS = (
    "*seconds*",  # seconds, cpu_seconds, train_seconds, prox_seconds, round/server/client_seconds, secagg_*_seconds
    "*wall*",  # wall, wall_seconds
    "cpu_*",  # cpu_seconds, cpu_model, cpu_capability
    "*time", "time_*", "*timestamp*", "*elapsed*", "*duration*",  # time, runtime, training_time, timestamp
    "when", "date", "*_date", "started", "started_*", "finished_at", "created_at", "written_at",  # dates
    "*rss*", "*memory*", "peak_mem*",  # memory
    "host", "hostname", "host_*", "*_host", "pid",  # the machine and process
    "environment", "environments", "platform", "processor", "python", "torch", "numpy", "torch_threads",
    "omp_num_threads",  # dpfl.results.environment's fields (describe_job blocks in per-job JSON files)
    "version", "*_version", "__version__", "versions", "*commit*", "source_modified", "git*",  # software versions
)
# String values: these roots are replaced by <OUT> / <TREE> before comparing (absolute paths, commands with --out).


def ignored_key(key: Any) -> bool:
    name = str(key).lower()
    return any(fnmatch.fnmatchcase(name, p) for p in IGNORED_KEYS)


# ---- the job list --------------------------------------------------------------------------------------------------
@dataclass
class Job:
    name: str  # also its directory under OUT
    args: list[str]  # dpfl's arguments, without --out
    source: str  # the config (relative to the tree) or the reproduce command it comes from
    dataset: Optional[str] = None  # checked against the data catalog at run time

    def command(self, out: Path) -> list[str]:
        return [*self.args, "--out", str(out)]

    def at_least_rounds(self, stderr: str) -> Optional["Job"]:
        """The same job with the config's own shortest setting, when its run refused RUN_ROUNDS rounds and said how
        many it needs; None otherwise (so a job is retried at most once, and the same way on both sides)."""
        found = TOO_FEW_ROUNDS.search(stderr)
        shortened = [i for i, a in enumerate(self.args) if re.fullmatch(rf"(training\.)?rounds={RUN_ROUNDS}", a)]
        if self.args[0] != "run" or found is None or len(shortened) != 1:
            return None
        args = list(self.args)
        args[shortened[0]] = args[shortened[0]].replace(f"={RUN_ROUNDS}", f"={int(found.group(1))}")
        return Job(self.name, args, self.source, self.dataset)

    @property
    def resumable(self) -> bool:
        """A reproduce job continues an unfinished directory (its grid skips finished runs); others start afresh."""
        return self.args[0] == "reproduce"


@dataclass
class Skip:
    name: str
    source: str
    reason: str


@dataclass
class TreeInfo:
    tree: Path
    dpfl_file: str
    missing_datasets: set[str]
    catalog: set[str]
    families: list[str]
    splitting_scales: Optional[dict[str, list[str]]]
    problems: list[str] = field(default_factory=list)


def job_env(tree: Path, out: Optional[Path] = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in REMOVED_ENV}
    env.update(FIXED_ENV)
    env["PYTHONPATH"] = str(tree / "src")
    if out is not None:  # caches outside the trees (the base checkout stays untouched) and per output
        env["PYTHONPYCACHEPREFIX"] = str(out / ".cache" / "pycache")
        env["MPLCONFIGDIR"] = str(out / ".cache" / "matplotlib")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _tree_python(tree: Path, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=tree, env=job_env(tree), capture_output=True, text=True,
                          timeout=timeout)


_PROBE = """
import json, dpfl
out = {"dpfl_file": dpfl.__file__}
try:
    from dpfl.reproduce import splitting
    out["splitting_scales"] = {k: list(v["settings"]) for k, v in splitting.SCALES.items()}
except Exception as e:
    out["splitting_error"] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"""


def parse_commands(help_text: str) -> list[str]:
    """The subcommands a click/typer help lists (rich boxes or plain click), in order."""
    names, inside = [], False
    for line in help_text.splitlines():
        if re.match(r"^\s*(?:╭─ )?Commands\b", line):
            inside = True
            continue
        if inside:
            if re.match(r"^\s*(?:╰|╭|[A-Z][a-z]+:)", line):
                inside = line.lstrip().startswith("│")
                if not inside:
                    break
            m = re.match(r"^(?:│ |  )([a-z][a-z0-9_-]*)(?:\s{2,}|\s*│?$)", line)
            if m:
                names.append(m.group(1))
    return list(dict.fromkeys(names))


def probe_tree(tree: Path) -> TreeInfo:
    """What the job list needs from TREE's dpfl (each asked in a subprocess that imports it)."""
    tree = tree.resolve()
    if not (tree / "src" / "dpfl").is_dir():
        raise SystemExit(usage_error(f"{tree} is not a dpfl checkout (no src/dpfl)"))
    problems = []
    done = _tree_python(tree, ["-c", _PROBE])
    if done.returncode != 0:
        raise SystemExit(usage_error(f"{tree}: importing its dpfl failed:\n{done.stderr[-2000:]}"))
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(probe["dpfl_file"]).resolve().is_relative_to(tree / "src"):
        raise SystemExit(usage_error(f"PYTHONPATH={tree / 'src'} imports dpfl from {probe['dpfl_file']}"))
    if "splitting_error" in probe:
        problems.append(f"the scales of dpfl reproduce splitting: {probe['splitting_error']}")
    data = _tree_python(tree, ["-c", CLI, "data", "list", "--json"])
    missing: set[str] = set()
    catalog: set[str] = set()
    try:
        for row in json.loads(data.stdout)["datasets"]:
            catalog.add(row["name"])
            if row.get("source") == "missing":
                missing.add(row["name"])
    except (ValueError, KeyError, TypeError):
        problems.append(f"dpfl data list --json gave no catalog (rc {data.returncode}): every dataset counts as here")
    helped = _tree_python(tree, ["-c", CLI, "reproduce", "--help"])
    families = [c for c in parse_commands(helped.stdout) if c not in NOT_FAMILIES]
    if not families:
        problems.append("dpfl reproduce --help lists no command: the known families are used")
        families = list(KNOWN_FAMILIES)
    return TreeInfo(tree, probe["dpfl_file"], missing, catalog, families, probe.get("splitting_scales"), problems)


def _header_commands(text: str) -> list[str]:
    """The `dpfl ...` command lines of a YAML's comments (a line continued with a backslash is left out)."""
    found = []
    for line in text.splitlines():
        if not line.lstrip().startswith("#"):
            continue
        for m in re.finditer(r"`?(dpfl\s+[^`]*)`?", line.lstrip()[1:]):
            cmd = m.group(1).strip()
            if not cmd.endswith("\\"):
                found.append(cmd)
    return found


def _attack_command(text: str, rel: str) -> Optional[list[str]]:
    """`dpfl attack invert REL ...` / `dpfl audit REL ...` from the header, when the header shows no `dpfl run REL`:
    the file is meant for the attack (its first such line, without --out)."""
    attack, runs = None, False
    for cmd in _header_commands(text):
        try:
            words = shlex.split(cmd)
        except ValueError:
            continue
        if words[1:3] == ["run", rel]:
            runs = True
        for verb in (["attack", "invert"], ["audit"]):
            n = len(verb)
            if attack is None and words[1:1 + n] == verb and words[1 + n:2 + n] == [rel]:
                rest, args = words[2 + n:], []
                while rest:
                    w = rest.pop(0)
                    if w == "--out":
                        rest = rest[1:]
                    elif not w.startswith("--out="):
                        args.append(w)
                attack = [*verb, rel, *args]
    return None if runs else attack


def config_job(tree: Path, path: Path, info: TreeInfo) -> Job | Skip:
    rel = path.relative_to(tree).as_posix()
    name = "config/" + rel.removeprefix("configs/").removesuffix(".yaml").removesuffix(".yml")
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return Skip(name, rel, f"not valid YAML ({str(e).splitlines()[0]})")
    if not isinstance(data, dict):
        return Skip(name, rel, "not a YAML mapping: no dpfl command reads it")
    if data.get("scheme") == "mpdp":
        return Job(name, ["run", rel, "--set", f"rounds={RUN_ROUNDS}"], rel, data.get("dataset"))
    if "problem" in data and "methods" in data:
        scales = info.splitting_scales
        if scales is None:
            return Skip(name, rel, "a convex setting of dpfl reproduce splitting; its scales could not be read")
        stem = path.stem
        if stem in scales.get("ci", ()):
            return Skip(name, rel, "a convex setting of `dpfl reproduce splitting --scale ci`: run by job "
                                   "reproduce/splitting")
        scale = next((s for s, names in scales.items() if stem in names), None)
        if scale is None:
            return Skip(name, rel, "a convex splitting setting that no scale of dpfl reproduce splitting uses")
        return Job(name, ["reproduce", "splitting", "--scale", scale, "--settings", str(data.get("name", stem)),
                          "--seeds", "1", "--rounds", str(CONVEX_ROUNDS)], rel)
    if isinstance(data.get("data"), dict) and "model" in data:
        dataset = data["data"].get("dataset")
        attack = _attack_command(text, rel)
        if attack is not None:
            return Job(name, attack, rel, dataset)
        return Job(name, ["run", rel, "--set", f"training.rounds={RUN_ROUNDS}"], rel, dataset)
    return Skip(name, rel, f"not a config any dpfl command reads (top-level keys: {', '.join(map(str, data))})")


def jobs_of(tree: Path, info: TreeInfo) -> list[Job | Skip]:
    """Every YAML under TREE/configs/ (one entry each, run or skipped), then the reproductions at ci scale."""
    entries: list[Job | Skip] = []
    for path in sorted((tree / "configs").rglob("*.y*ml")):
        entry = config_job(tree, path, info)
        if isinstance(entry, Job) and entry.dataset in info.missing_datasets:
            entry = Skip(entry.name, entry.source, f"dataset {entry.dataset} not available here")
        entries.append(entry)
    for family in info.families:
        base = ["reproduce", family, "--scale", "ci"]
        entries.append(Job(f"reproduce/{family}", base, " ".join(["dpfl", *base])))
        for suffix, options in REPRODUCE_MODES.get(family, ()):
            args = ["reproduce", family, *options, "--scale", "ci"]
            entries.append(Job(f"reproduce/{family}-{suffix}", args, " ".join(["dpfl", *args])))
    return entries


def select(entries: list[Job | Skip], patterns: Optional[list[str]]) -> list[Job | Skip]:
    """--only: a pattern (fnmatch) matches a job's whole name or its last part (`demo`, `pfa`, 'config/hdp/*')."""
    if not patterns:
        return entries
    return [e for e in entries if any(
        fnmatch.fnmatchcase(e.name, p) or fnmatch.fnmatchcase(e.name.rsplit("/", 1)[-1], p)
        for p in patterns)]


def duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def estimate(jobs: list[Job]) -> tuple[float, int]:
    known = [MEASURED_SECONDS[j.name] for j in jobs if j.name in MEASURED_SECONDS]
    return sum(known), len(jobs) - len(known)


def describe_estimate(jobs: list[Job], workers: int = 1) -> str:
    total, unknown = estimate(jobs)
    text = f"estimated {duration(total)} on one worker"
    if workers > 1:
        text += f" (about {duration(total / workers)} with {workers} workers)"
    if unknown:
        text += f", plus {unknown} job(s) not measured"
    return text + " (measured on the base checkout, shared 2-core machine: upper bounds)"


def print_list(entries: list[Job | Skip], workers: int = 1) -> None:
    jobs = [e for e in entries if isinstance(e, Job)]
    skips = [e for e in entries if isinstance(e, Skip)]
    width = max((len(e.name) for e in entries), default=10)
    print(f"jobs ({len(jobs)}; {describe_estimate(jobs, workers)}):")
    for j in jobs:
        print(f"  {j.name:<{width}}  {duration(MEASURED_SECONDS.get(j.name)):>7}  "
              f"dpfl {shlex.join(j.args)}")
    print(f"skipped ({len(skips)}):")
    for s in skips:
        print(f"  {s.name:<{width}}  {s.reason}")


# ---- run -----------------------------------------------------------------------------------------------------------
class Runner:
    """Runs jobs into OUT with TREE's dpfl; OUT/jobs.json is rewritten (atomically) after every job."""

    def __init__(self, tree: Path, out: Path, info: TreeInfo, timeout: Optional[float] = None):
        self.tree, self.out, self.info, self.timeout = tree.resolve(), out.resolve(), info, timeout
        self.lock = threading.Lock()
        self.procs: dict[int, subprocess.Popen] = {}
        self.stopping = False
        self.record = self._load()
        self.record.update({"tree": str(self.tree), "dpfl_file": info.dpfl_file, "python": sys.executable,
                            "env": {**FIXED_ENV, "PYTHONPATH": str(self.tree / "src")}})
        self.record.setdefault("jobs", {})

    def _load(self) -> dict[str, Any]:
        path = self.out / "jobs.json"
        if path.is_file():
            try:
                return json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                pass
        return {}

    def save(self) -> None:
        path = self.out / "jobs.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def finished(self, job: Job) -> bool:
        rec = self.record["jobs"].get(job.name, {})
        if rec.get("rc") == 0:
            return True
        return job.args[0] == "run" and (self.out / job.name / "summary.json").is_file()

    def run_one(self, job: Job, index: int, total: int) -> dict[str, Any]:
        if self.stopping:
            return {}
        d = self.out / job.name
        if d.exists() and not job.resumable:
            shutil.rmtree(d)  # a `dpfl run` / attack left unfinished: start it afresh
        d.parent.mkdir(parents=True, exist_ok=True)
        logs = self.out / "logs"
        logs.mkdir(exist_ok=True)
        stem = job.name.replace("/", "__")
        rc, seconds, err = self._execute(job, d, logs / f"{stem}.out", logs / f"{stem}.err")
        longer = job.at_least_rounds(err) if rc != 0 and not self.stopping else None
        if longer is not None:  # the config's own shortest setting
            shutil.rmtree(d, ignore_errors=True)
            job = longer
            rc, more, err = self._execute(job, d, logs / f"{stem}.out", logs / f"{stem}.err")
            seconds += more
        rec = {"status": "ok" if rc == 0 else "failed", "rc": rc, "seconds": round(seconds, 3),
               "command": ["dpfl", *job.args, "--out", f"OUT/{job.name}"], "source": job.source,
               "stderr_tail": err[-3000:]}
        with self.lock:
            if not self.stopping:
                self.record["jobs"][job.name] = rec
                self.save()
            print(f"[{index}/{total}] {job.name}: {rec['status']} (rc {rc}, {duration(seconds)})", flush=True)
        return rec

    def _execute(self, job: Job, d: Path, out_log: Path, err_log: Path) -> tuple[int, float, str]:
        """(exit code, wall seconds, stderr) of one job run into d with TREE's dpfl; killed after --timeout."""
        cmd = [sys.executable, "-c", CLI, *job.command(d)]
        start = time.monotonic()
        with open(out_log, "w", encoding="utf-8") as fout, open(err_log, "w", encoding="utf-8") as ferr:
            proc = subprocess.Popen(cmd, cwd=self.tree, env=job_env(self.tree, self.out), stdout=fout, stderr=ferr,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            with self.lock:
                self.procs[proc.pid] = proc
            try:
                rc = proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                _kill(proc)
                rc = proc.wait()
                ferr.write(f"\nregression.py: killed after {self.timeout} s\n")
            finally:
                with self.lock:
                    self.procs.pop(proc.pid, None)
        return rc, time.monotonic() - start, err_log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            procs = list(self.procs.values())
        for p in procs:
            _kill(p)


def _kill(proc: subprocess.Popen) -> None:
    """The job's own process group (it was started in a new session), by its id."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, PermissionError):
        return
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_tree(tree: Path, out: Path, only: Optional[list[str]], workers: int, timeout: Optional[float] = None) -> int:
    if workers < 1:
        return usage_error(f"--workers must be >= 1, got {workers}")
    tree = tree.resolve()
    info = probe_tree(tree)
    for p in info.problems:
        print(f"note: {p}", file=sys.stderr)
    entries = select(jobs_of(tree, info), only)
    if not entries:
        return usage_error(f"--only {' '.join(only or [])}: no job matches (see `list`)")
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(tree, out, info, timeout)
    for s in (e for e in entries if isinstance(e, Skip)):
        runner.record["jobs"][s.name] = {"status": "skipped", "rc": None, "reason": s.reason, "source": s.source}
    runner.save()
    jobs = [e for e in entries if isinstance(e, Job)]
    todo = [j for j in jobs if not runner.finished(j)]
    print(f"{tree}: dpfl from {info.dpfl_file}")
    print(f"{len(jobs)} jobs, {len(jobs) - len(todo)} finished before, {len(todo)} to run "
          f"({describe_estimate(todo, workers)}); {len(entries) - len(jobs)} skipped", flush=True)
    if workers > 1:  # the longest first, so that the last to finish is a short one
        todo.sort(key=lambda j: -MEASURED_SECONDS.get(j.name, 0.0))
    start = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(lambda a: runner.run_one(a[1], a[0] + 1, len(todo)), enumerate(todo)))
    except KeyboardInterrupt:
        runner.stop()
        print("interrupted: the running jobs were stopped; run the same command again to continue", file=sys.stderr)
        return 130
    failed = [j.name for j, r in zip(todo, results, strict=True) if r.get("rc") != 0]
    print(f"done in {duration(time.monotonic() - start)}: {len(todo) - len(failed)} ok, {len(failed)} failed"
          + (f" ({', '.join(failed)}; stderr in {out / 'logs'})" if failed else ""))
    return 1 if failed else 0


# ---- diff ----------------------------------------------------------------------------------------------------------
ABSENT = object()


class Side:
    """One output directory: its jobs.json (if any) and the roots its strings are normalised by."""

    def __init__(self, out: Path):
        self.out = out
        try:
            self.record = json.loads((out / "jobs.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.record = {}
        self.jobs: dict[str, dict[str, Any]] = self.record.get("jobs", {})
        roots = {str(out), str(out.resolve())}
        self.roots = sorted(((r, "<OUT>") for r in roots), key=lambda x: -len(x[0]))
        tree = self.record.get("tree")
        if tree:
            trees = {tree, str(Path(tree).resolve())}
            self.roots += sorted(((r, "<TREE>") for r in trees), key=lambda x: -len(x[0]))

    def norm(self, value: str) -> str:
        for root, tag in self.roots:
            value = value.replace(root, tag)
        return value


def fmt(value: Any) -> str:
    if value is ABSENT:
        return "<absent>"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = text.replace("\r", "\\r").replace("\n", "\\n")  # one difference, one line
    return text if len(text) <= 200 else text[:197] + "..."


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def same_scalar(a: Any, b: Any, rtol: float) -> bool:
    if _number(a) and _number(b):
        if a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
            return True
        return rtol > 0 and math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rtol * max(abs(a), abs(b))
    return type(a) is type(b) and a == b


class Differ:
    def __init__(self, a: Side, b: Side, rtol: float):
        self.a, self.b, self.rtol = a, b, rtol
        self.lines: list[str] = []

    def add(self, where: str, key: str, va: Any, vb: Any) -> None:
        self.lines.append(f"{where}: {key}: A={fmt(va)} B={fmt(vb)}")

    # values
    def values(self, where: str, path: str, va: Any, vb: Any) -> None:
        if isinstance(va, str):
            va = self.a.norm(va)
        if isinstance(vb, str):
            vb = self.b.norm(vb)
        if isinstance(va, dict) and isinstance(vb, dict):
            for k in dict.fromkeys([*va, *vb]):
                if ignored_key(k):
                    continue
                sub = f"{path}.{k}" if path else str(k)
                self.values(where, sub, va.get(k, ABSENT), vb.get(k, ABSENT))
        elif isinstance(va, list) and isinstance(vb, list):
            for i in range(max(len(va), len(vb))):
                self.values(where, f"{path}[{i}]", va[i] if i < len(va) else ABSENT, vb[i] if i < len(vb) else ABSENT)
        elif isinstance(va, str) and isinstance(vb, str) and va != vb and ("\n" in va or "\n" in vb):
            self.text_lines(where, path or "<value>", va, vb)
        elif va is ABSENT or vb is ABSENT or not same_scalar(va, vb, self.rtol):
            self.add(where, path or "<value>", va, vb)

    def text_lines(self, where: str, path: str, va: str, vb: str) -> None:
        """A multi-line string (a config embedded in a JSON file): only the lines that differ, aligned by difflib so
        that one inserted line is one difference, each named by its line numbers on the two sides."""
        la, lb = va.splitlines(), vb.splitlines()
        for op, a0, a1, b0, b1 in difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes():
            if op == "equal":
                continue
            for i in range(max(a1 - a0, b1 - b0)):
                ia, ib = a0 + i, b0 + i
                label = f"{path} line {ia + 1 if ia < a1 else '-'}/{ib + 1 if ib < b1 else '-'}"
                self.add(where, label, la[ia] if ia < a1 else ABSENT, lb[ib] if ib < b1 else ABSENT)

    # rows (JSONL lines, CSV rows): keyed when a key identifies every row on both sides, else by position
    def rows(self, where: str, ra: list[Any], rb: list[Any], key_of, label_of, compare) -> None:
        ka, kb = [key_of(r) for r in ra], [key_of(r) for r in rb]
        if None in ka or None in kb or len(set(ka)) < len(ka) or len(set(kb)) < len(kb):
            ka, kb = list(range(len(ra))), list(range(len(rb)))
            label_of = lambda k: f"row {k + 1}"  # noqa: E731
        da, db = dict(zip(ka, ra, strict=True)), dict(zip(kb, rb, strict=True))
        for k in dict.fromkeys([*ka, *kb]):
            if k not in db:
                self.add(where, label_of(k), da[k], ABSENT)
            elif k not in da:
                self.add(where, label_of(k), ABSENT, db[k])
            else:
                compare(label_of(k), da[k], db[k])

    def jsonl(self, where: str, ta: str, tb: str) -> None:
        def parse(text: str) -> list[Any]:
            out = []
            for line in text.splitlines():
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        out.append(f"<unparsed line> {line}")
            return out

        def key(r: Any) -> Any:
            return ("round", r["round"]) if isinstance(r, dict) and _number(r.get("round")) else None

        self.rows(where, parse(ta), parse(tb), key, lambda k: f"round={k[1]}",
                  lambda label, x, y: self.values(where, label, x, y))

    def json(self, where: str, ta: str, tb: str, loader=json.loads) -> None:
        try:
            va, vb = loader(ta), loader(tb)
        except Exception:  # noqa: BLE001 - an unreadable file is compared as text
            va, vb = ta, tb
        self.values(where, "", va, vb)

    def csv(self, where: str, ta: str, tb: str) -> None:
        def parse(text: str) -> tuple[list[str], list[dict[str, str]]]:
            lines = text.splitlines()
            while lines and lines[0].startswith("#"):  # provenance lines (commands, dates): not results
                lines.pop(0)
            reader = csv.DictReader(io.StringIO("\n".join(lines)))
            rows = list(reader)
            return list(reader.fieldnames or []), rows

        (ca, ra), (cb, rb) = parse(ta), parse(tb)
        for c in dict.fromkeys([*ca, *cb]):
            if not ignored_key(c) and (c not in ca or c not in cb):
                self.add(where, f"column {c}", "present" if c in ca else ABSENT, "present" if c in cb else ABSENT)
        shared = [c for c in ca if c in cb and not ignored_key(c)]
        keys = [c for c in ("setting", "method", "seed") if c in shared]

        def key(r: dict[str, str]) -> Any:
            return tuple(r.get(c) for c in keys) if keys else None

        def label(k: Any) -> str:
            return "row[" + ",".join(f"{c}={v}" for c, v in zip(keys, k, strict=True)) + "]"

        def cells(lab: str, x: dict[str, str], y: dict[str, str]) -> None:
            for c in shared:
                xa, yb = self.a.norm(x.get(c) or ""), self.b.norm(y.get(c) or "")
                if xa != yb and not (self.rtol > 0 and _close_text(xa, yb, self.rtol)):
                    self.add(where, f"{lab}.{c}", xa, yb)

        def whole(r: dict[str, str]) -> dict[str, str]:
            return {c: v for c, v in r.items() if c is not None and not ignored_key(c)}

        self.rows(where, [whole(r) for r in ra], [whole(r) for r in rb], key, label, cells)

    # files and directories
    def file(self, rel: str, pa: Path, pb: Path) -> None:
        ta = pa.read_text(encoding="utf-8", errors="replace")
        tb = pb.read_text(encoding="utf-8", errors="replace")
        if pa.suffix == ".jsonl":
            self.jsonl(rel, ta, tb)
        elif pa.suffix == ".csv":
            self.csv(rel, ta, tb)
        elif pa.suffix == ".json":
            self.json(rel, ta, tb)
        else:
            self.json(rel, ta, tb, loader=yaml.safe_load)

    def tree(self, rel: str, da: Path, db: Path, one_sided_jobs: set[str]) -> None:
        ea, eb = _entries(da, top=not rel), _entries(db, top=not rel)
        for name in sorted(set(ea) | set(eb)):
            sub = f"{rel}/{name}" if rel else name
            if any(sub == j or sub.startswith(j + "/") for j in one_sided_jobs):
                continue  # reported once, as the job
            a, b = ea.get(name), eb.get(name)
            if a is not None and b is not None and a.is_dir() == b.is_dir():
                if a.is_dir():
                    self.tree(sub, a, b, one_sided_jobs)
                else:
                    self.file(sub, a, b)
            elif a is None or b is None:
                kind = "<directory>" if (a or b).is_dir() else "<file>"
                self.add(sub, kind, "present" if a else ABSENT, "present" if b else ABSENT)
            else:
                self.add(sub, "<kind>", "directory" if a.is_dir() else "file", "directory" if b.is_dir() else "file")

    def jobs(self) -> set[str]:
        """Jobs on one side only and jobs whose exit code or status differs (from each side's jobs.json)."""
        one_sided = set()
        for name in sorted(set(self.a.jobs) | set(self.b.jobs)):
            ja, jb = self.a.jobs.get(name), self.b.jobs.get(name)
            if ja is None or jb is None:
                self.add(name, "<job>", ja["status"] if ja else ABSENT, jb["status"] if jb else ABSENT)
                one_sided.add(name)
            elif ja.get("status") != jb.get("status") or ja.get("rc") != jb.get("rc"):
                self.add(name, "<exit code>", _state(ja), _state(jb))
        return one_sided


def _state(rec: dict[str, Any]) -> str:
    if rec.get("status") == "skipped":
        return f"skipped ({rec.get('reason')})"
    return f"{rec.get('rc')} ({rec.get('status')})"


def _close_text(x: str, y: str, rtol: float) -> bool:
    try:
        return same_scalar(float(x), float(y), rtol)
    except ValueError:
        return False


def _entries(d: Path, top: bool) -> dict[str, Path]:
    """The compared files and the subdirectories of d (at OUT's top: not the runner's own logs, caches, trees)."""
    out = {}
    for p in d.iterdir():
        if top and p.name in ("jobs.json", "logs", ".cache", "trees"):
            continue
        if p.is_dir():
            out[p.name] = p
        elif p.name not in IGNORED_FILES and (p.suffix in COMPARED_SUFFIXES or p.name in COMPARED_NAMES):
            out[p.name] = p
    return out


def diff_outputs(out_a: Path, out_b: Path, rtol: float = 0.0) -> list[str]:
    """Every difference between two `run` outputs, one line each: `job/relative/path: key.path: A=... B=...`."""
    differ = Differ(Side(out_a), Side(out_b), rtol)
    one_sided = differ.jobs()
    differ.tree("", out_a, out_b, one_sided)
    return differ.lines


def diff_command(out_a: Path, out_b: Path, rtol: float) -> int:
    for d in (out_a, out_b):
        if not d.is_dir():
            return usage_error(f"{d} is not a directory")
    if rtol < 0:
        return usage_error(f"--rtol must be >= 0, got {rtol}")
    lines = diff_outputs(out_a, out_b, rtol)
    for line in lines:
        print(line)
    jobs = len(set(Side(out_a).jobs) | set(Side(out_b).jobs))
    tolerance = f" (rtol {rtol:g})" if rtol else ""
    print(f"{len(lines)} difference(s)" + (f" over {jobs} jobs" if jobs else "") + tolerance, file=sys.stderr)
    return 1 if lines else 0


# ---- compare -------------------------------------------------------------------------------------------------------
def _git(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def compare(rev_a: str, rev_b: str, out: Path, only: Optional[list[str]], workers: int, rtol: float,
            keep: bool, timeout: Optional[float] = None) -> int:
    top = _git("rev-parse", "--show-toplevel")
    if top.returncode != 0:
        return usage_error(f"{REPO} is not a git checkout")
    repo = Path(top.stdout.strip())
    out = out.resolve()
    created: list[Path] = []
    trees: list[Path] = []
    try:
        for side, rev in (("a", rev_a), ("b", rev_b)):
            if rev == "WORKTREE":
                trees.append(repo)
                continue
            commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}", cwd=repo)
            if commit.returncode != 0:
                return usage_error(f"{rev}: not a revision of {repo}")
            where = out / "trees" / side
            if where.exists():
                head = _git("rev-parse", "HEAD", cwd=where)
                if head.returncode != 0 or head.stdout.strip() != commit.stdout.strip():
                    return usage_error(f"{where} exists and is not a checkout of {rev}: remove it "
                                       "(git worktree remove) or choose another OUT")
            else:
                where.parent.mkdir(parents=True, exist_ok=True)
                added = _git("worktree", "add", "--detach", str(where), commit.stdout.strip(), cwd=repo)
                if added.returncode != 0:
                    return usage_error(f"git worktree add {where}: {added.stderr.strip()}")
            created.append(where)
            trees.append(where)
        codes = [run_tree(t, out / side, only, workers, timeout) for t, side in zip(trees, "ab", strict=True)]
        if 130 in codes:
            return 130
        print(f"diff {out / 'a'} {out / 'b'}:")
        return diff_command(out / "a", out / "b", rtol)
    finally:
        if not keep:
            for where in created:
                _git("worktree", "remove", "--force", str(where), cwd=repo)


# ---- command line --------------------------------------------------------------------------------------------------
def usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return USAGE


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="regression.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="the jobs, and the configs skipped with the reason")
    p.add_argument("--tree", type=Path, default=REPO, help="the dpfl checkout (default: this one)")
    p.add_argument("--only", nargs="+", metavar="PATTERN")
    p = sub.add_parser("run", help="run the jobs with TREE's dpfl into OUT")
    p.add_argument("tree", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--only", nargs="+", metavar="PATTERN", help="job names or their last part (fnmatch)")
    p.add_argument("--workers", type=int, default=1, help="jobs at once (each single-threaded)")
    p.add_argument("--timeout", type=float, default=None, help="seconds after which a job is killed (failed)")
    p = sub.add_parser("diff", help="compare two run outputs")
    p.add_argument("out_a", type=Path)
    p.add_argument("out_b", type=Path)
    p.add_argument("--rtol", type=float, default=0.0, help="relative tolerance of numbers (default 0: exact)")
    p = sub.add_parser("compare", help="run two revisions (or WORKTREE) and diff them")
    p.add_argument("rev_a")
    p.add_argument("rev_b")
    p.add_argument("out", type=Path)
    p.add_argument("--only", nargs="+", metavar="PATTERN")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--rtol", type=float, default=0.0)
    p.add_argument("--keep", action="store_true", help="keep the worktrees under OUT/trees/")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            info = probe_tree(args.tree)
            for problem in info.problems:
                print(f"note: {problem}", file=sys.stderr)
            entries = select(jobs_of(args.tree.resolve(), info), args.only)
            if not entries:
                return usage_error(f"--only {' '.join(args.only)}: no job matches")
            print_list(entries)
            return 0
        if args.command == "run":
            return run_tree(args.tree, args.out, args.only, args.workers, args.timeout)
        if args.command == "diff":
            return diff_command(args.out_a, args.out_b, args.rtol)
        return compare(args.rev_a, args.rev_b, args.out, args.only, args.workers, args.rtol, args.keep, args.timeout)
    except SystemExit as e:  # probe_tree's usage errors
        return int(e.code) if isinstance(e.code, int) else USAGE


if __name__ == "__main__":
    sys.exit(main())

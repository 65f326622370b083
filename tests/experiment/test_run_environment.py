"""environment.jsonl: one line per execution of a run (the fresh start, then each resume that trains), saying
which code, libraries and torch threads produced which rounds, and report.md's Environment section.

Why it matters: results are bit-identical only for the same code and thread count, so a resumed run must say
when either changed; and a damaged line is refused like any other damaged file, with nothing changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import dpfl
from cli_runner import cli
from dpfl.experiment.config import load_config
from dpfl.results import environment
from dpfl.results.environment import ENVIRONMENT_FILE, REPRODUCIBILITY_KEYS, changed_keys, unrecorded_keys
from stopped_run import stop_in_round

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
SETS = ["name=env", "training.rounds=4", "evaluation.every=2", "checkpoint.every=2", "privacy.noise_multiplier=1.5",
        "privacy.budgets=30"]


def _resume(out: Path) -> tuple[int, str, str]:
    return cli("run", DEMO, "--out", out, *[a for s in SETS for a in ("--set", s)], "--resume")


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / ENVIRONMENT_FILE).read_text().splitlines()]


def _hashes(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A run stopped in round 3 (its checkpoint holds round 2)."""
    return stop_in_round(load_config(DEMO, SETS), tmp_path_factory.mktemp("env") / "run", 3)


def test_a_fresh_run_records_what_ran_it(stopped):
    (line,) = _lines(stopped)
    assert line["started_round"] == 0
    assert line["dpfl"] == dpfl.__version__ and line["torch"] == torch.__version__
    assert line["torch_threads"] == torch.get_num_threads()
    # the kernels torch dispatches (AVX2 and AVX-512 round differently), and the CPU that MKL and oneDNN dispatch on
    assert line["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and "cpu_model" in line
    assert line["device"] == "cpu" and "gpu" not in line  # the run's device (CUDA adds its GPU's name)
    commit = line["source_commit"]  # the tests run from a git checkout (CI clones the repository)
    assert commit is None or (len(commit) == 40 and int(commit, 16) >= 0 and isinstance(line["source_modified"], bool))


def test_each_resume_that_trains_adds_a_line_from_its_checkpoint_round_and_a_finished_resume_adds_none(stopped,
                                                                                                    tmp_path):
    run = Path(shutil.copytree(stopped, tmp_path / "run"))
    assert _resume(run)[0] == 0
    lines = _lines(run)
    assert [line["started_round"] for line in lines] == [0, 2]
    assert changed_keys(lines) == []  # same process, same environment
    report = (run / "report.md").read_text()
    assert "## Environment" in report and "Resumed under another" not in report
    assert f"({torch.backends.cpu.get_cpu_capability()}) |" in report  # the CPU column: model (kernels)
    assert _resume(run)[0] == 0  # finished: only the report is rewritten
    assert len(_lines(run)) == 2


def test_a_resume_under_other_threads_is_flagged_in_the_report(stopped, tmp_path, monkeypatch):
    run = Path(shutil.copytree(stopped, tmp_path / "run"))
    real = environment.describe
    monkeypatch.setattr(environment, "describe", lambda r, device: {**real(r, device), "torch_threads": 99})
    assert _resume(run)[0] == 0
    assert [line["torch_threads"] for line in _lines(run)] == [torch.get_num_threads(), 99]
    assert "**Resumed under another torch_threads**" in (run / "report.md").read_text()


def test_changed_keys_names_only_what_changes_results():
    base = {k: "x" for k in REPRODUCIBILITY_KEYS} | {"when": "t0", "platform": "a", "started_round": 0}
    assert changed_keys([base, {**base, "when": "t1", "platform": "b", "started_round": 5}]) == []
    assert changed_keys([base, {**base, "torch": "y"}, {**base, "source_commit": "z"}]) == ["source_commit", "torch"]
    assert changed_keys([base, {**base, "cpu_capability": "AVX2"}, {**base, "cpu_model": "another"}]) == [
        "cpu_capability", "cpu_model"]
    older = {k: v for k, v in base.items() if k not in ("cpu_capability", "cpu_model")}  # before 2026-11-30
    assert changed_keys([older, base]) == [] and unrecorded_keys([older, base]) == ["cpu_capability", "cpu_model"]
    assert unrecorded_keys([base, base]) == [] and unrecorded_keys([older, older]) == []


def test_a_resume_of_a_run_begun_by_an_older_dpfl_says_what_it_did_not_record(stopped, tmp_path):
    run = Path(shutil.copytree(stopped, tmp_path / "run"))
    (line,) = _lines(run)
    (run / ENVIRONMENT_FILE).write_text(json.dumps({k: v for k, v in line.items() if not k.startswith("cpu_")}) + "\n")
    assert _resume(run)[0] == 0
    report = (run / "report.md").read_text()
    assert "Not recorded by every execution (an older dpfl): cpu_capability, cpu_model" in report
    assert "Resumed under another" not in report


def test_the_cpu_capability_is_the_one_torch_dispatches_and_lowering_it_is_recorded():
    code = "from dpfl.results.environment import describe; print(describe(0)['cpu_capability'])"
    lowered = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "ATEN_CPU_CAPABILITY": "default"}).stdout.strip()
    assert lowered == "DEFAULT"  # the generic kernels every x86-64 and ARM CPU has
    line = environment.provenance()
    assert line.endswith(f"{torch.backends.cpu.get_cpu_capability()} kernels")


def test_a_killed_append_is_repaired_silently(stopped, tmp_path):
    run = Path(shutil.copytree(stopped, tmp_path / "run"))
    with open(run / ENVIRONMENT_FILE, "ab") as f:
        f.write(b'{"started_round": 2, "dpf')  # the trace of a kill in the middle of the append
    assert _resume(run)[0] == 0
    assert [line["started_round"] for line in _lines(run)] == [0, 2]


def test_a_damaged_line_stops_resume_and_report_changes_nothing_and_the_hint_recovers(stopped, tmp_path):
    run = Path(shutil.copytree(stopped, tmp_path / "run"))
    path = run / ENVIRONMENT_FILE
    path.write_bytes(b"garbage\n" + path.read_bytes())
    before = _hashes(run)
    for args in (("run", DEMO, "--out", run, *[a for s in SETS for a in ("--set", s)], "--resume"), ("report", run)):
        code, _, err = cli(*args)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and ENVIRONMENT_FILE in lines[0], err
        assert f"delete {ENVIRONMENT_FILE}" in lines[0] and "Traceback" not in err
        assert _hashes(run) == before
    path.unlink()  # what the message says
    assert _resume(run)[0] == 0
    assert [line["started_round"] for line in _lines(run)] == [2]


def test_a_run_begun_before_environment_jsonl_existed_says_so_when_resumed(stopped, tmp_path):
    run = Path(shutil.copytree(stopped, tmp_path / "run"))
    (run / ENVIRONMENT_FILE).unlink()  # as a dpfl of before 2026-11-27 left it
    assert _resume(run)[0] == 0
    assert [line["started_round"] for line in _lines(run)] == [2]
    assert "Rounds 1-2 were run by a dpfl version that did not record its environment." in (
        run / "report.md").read_text()


def test_a_studys_provenance_line_names_the_code_and_threads():
    line = environment.provenance()
    assert line.startswith(f"dpfl {dpfl.__version__}") and f", {torch.get_num_threads()} torch thread" in line
    assert ("source " in line) == (environment.describe(0)["source_commit"] is not None)


def test_a_studys_computed_by_line_counts_the_jobs_of_each_environment(tmp_path):
    here = environment.describe_job()
    assert "started_round" not in here
    other = {**here, "torch_threads": here["torch_threads"] + 1}
    resumed = [environment.describe(0), {**environment.describe(5), "torch_threads": here["torch_threads"] + 1}]
    line = environment.computed_by([[here], [here], [other], resumed, []], "job")
    first, second, mixed, unrecorded = line.split("; ")
    assert first.startswith(f"dpfl {dpfl.__version__}") and first.endswith("(3 jobs)")  # two, and the resumed one
    assert second.endswith("(2 jobs)") and f"{here['torch_threads'] + 1} torch threads" in second
    assert mixed == "1 job resumed under another environment (counted under each)"
    assert unrecorded.startswith("1 job with no recorded environment")
    assert environment.computed_by([]) == "no runs yet"
    # a run directory begun before environment.jsonl existed, one without it, one damaged: none is an error here
    begun, missing, damaged = (tmp_path / name for name in ("begun", "missing", "damaged"))
    for d in (begun, missing, damaged):
        d.mkdir()
    (begun / ENVIRONMENT_FILE).write_text(json.dumps(environment.describe(4)) + "\n")
    (damaged / ENVIRONMENT_FILE).write_text("{not json\n")
    never_started = tmp_path / "skipped"  # a job whose dataset is missing creates no directory: not a run
    line = environment.computed_by(environment.run_environments([begun, missing, damaged, never_started]))
    assert line.endswith("(1 run); 1 run begun before dpfl recorded environments (its first rounds unrecorded); "
                         "2 runs with no recorded environment (computed before dpfl recorded it, or its record is "
                         "damaged)")


def test_source_revision_is_read_when_the_module_is_imported_not_at_the_first_record():
    # A commit made while a long job runs must not be attributed to it: the revision is read at import. The child
    # process breaks the module's `subprocess.run` after importing it, so reading the revision lazily (at describe)
    # would raise.
    import subprocess
    import sys

    code = ("import types\n"
            "from dpfl.results import environment as e\n"
            "def broken(*a, **k): raise RuntimeError('git was run after import')\n"
            "e.subprocess = types.SimpleNamespace(run=broken, SubprocessError=OSError)  # this module's only\n"
            "print(e.describe(0)['source_commit'])\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == str(environment._source_revision()[0])

"""scripts/gpu_check.sh's CPU dry run (GPU_CHECK_DEVICE=cpu) on this environment's python: a venv over it, the offline
install step, the versions, the gpu tests (or their absence), one tiny engine benchmark, and the one JSON with every
piece. What the script does on a GPU machine is the same code with other sizes; the wheels themselves come from
scripts/gpu_wheels.sh (a registry is needed), so here the install finds everything already present."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration  # a venv, pip and a benchmark in subprocesses: about a minute


def test_cpu_dry_run_writes_one_json(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_DEVICE": "cpu", "GPU_CHECK_PYTHON": sys.executable, "GPU_CHECK_COHORTS": "3",
           "GPU_CHECK_STEPS": "2", "GPU_CHECK_VENV": str(tmp_path / "venv"), "WHEELS": str(tmp_path / "wheels"),
           "OUT": str(out)}
    (tmp_path / "wheels").mkdir()
    built = [ROOT / "build", ROOT / "src" / "dpfl.egg-info"]
    before = [p.exists() for p in built]
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                          timeout=600)
    r = json.loads((out / "gpu_check.json").read_text())
    assert proc.returncode == 0 and r["ok"], proc.stdout + proc.stderr
    assert list(r["pieces"]) == ["install", "versions", "gpu_tests", "engine_3"]
    assert r["versions"]["torch"] and not r["versions"]["dpfl"].startswith("not importable")
    assert r["pieces"]["gpu_tests"]["found"] == (ROOT / "tests" / "gpu").is_dir()
    bench = r["pieces"]["engine_3"]["result"]
    assert (bench["device"], bench["clients"], bench["steps"], bench["data"]) == ("cpu", 3, 2, "synthetic")
    assert bench["dp_overhead_vs_vectorised_nonprivate"] > 0 and bench["errors"] is None
    assert r["engine_summary"]["3"]["dp_overhead_vs_vectorised_nonprivate"] == \
        bench["dp_overhead_vs_vectorised_nonprivate"]
    assert [p.exists() for p in built] == before  # dpfl was built from a copy, not in the tree

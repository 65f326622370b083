"""A local Ray start stays on the machine: every Ray process listens on 127.0.0.1 only, Ray's usage statistics are
off, it is a Ray of its own (whatever RAY_ADDRESS says), and `dpfl run` says which backend and how many actors it
used (issue 65, item 3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_runner import cli
from processes import tree_env

pytest.importorskip("ray")
# starts Ray (one instance per test, each in a process of its own): the integration tier
pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SETS = ["backend=ray", "ray.actors=2", "training.rounds=1"]


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A command in a process of its own: Ray starts there once (repeated starts in one process crash Ray)."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_local_ray_listens_on_loopback_only_with_usage_stats_off():
    # RAY_ADDRESS: Ray's own lookup would join it (and fail); dpfl starts its own
    done = _run(str(ROOT / "tests" / "engine" / "ray_local_probe.py"),
                env=tree_env(RAY_USAGE_STATS_ENABLED=None, RAY_ADDRESS="127.0.0.1:9"))
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    sockets = seen["sockets"]
    assert sockets, "no listening socket found for Ray's processes"
    assert {addr for _, addr in sockets} <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, sockets
    assert seen["usage_stats"] is False
    assert seen["describe"] == {"name": "ray", "actors": 2, "threads_per_actor": 1, "actor_restarts": 0,
                                "ray": "started", "address": None, "node_address": "127.0.0.1",
                                "usage_stats": False}
    assert seen["cluster_env_left"] is False  # restored after the start
    assert seen["enable_ray_cluster"] is True


def test_dpfl_run_says_which_backend_and_how_many_actors(tmp_path: Path):
    out = tmp_path / "run"
    done = _run("-m", "dpfl.cli", "run", "configs/demo.yaml", *[a for s in SETS for a in ("--set", s)], "--out",
                str(out), env=tree_env())
    code, stdout, stderr = done.returncode, done.stdout, done.stderr
    assert code == 0, stdout + stderr
    assert ("backend: ray, 2 actors x 1 thread on a Ray this run started on 127.0.0.1 (usage statistics off)"
            in stdout), stdout
    assert json.loads((out / "summary.json").read_text())["backend"]["actors"] == 2
    code, stdout, _ = cli("run", "configs/demo.yaml", "--set", "training.rounds=1", "--out", str(tmp_path / "local"))
    assert code == 0 and "backend: local (the whole cohort in this process)" in stdout

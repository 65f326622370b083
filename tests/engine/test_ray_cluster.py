"""`ray.address`: dpfl joins a running Ray cluster (here a head node started on localhost by the test) instead of
starting its own, and the run is still the in-process run bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from dpfl.experiment.build import build_run
from dpfl.experiment.config.loading import load_config
from processes import alive, descendants, tree_env

pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[2]
# a head node and a run: integration tier
pytestmark = pytest.mark.integration
SETS = ["training.rounds=2", "model.name=cnn_digits"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, head: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head node did not listen on {port} (exit {head.poll()})") from None
            time.sleep(0.3)


def _stop_tree(proc: subprocess.Popen) -> None:
    """SIGTERM to `ray start --block` (it stops the processes it started), then SIGKILL to whatever of its tree is
    left: only this head's processes, never another test's Ray (`ray stop` would stop every Ray on the machine)."""
    tree = descendants(proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    for pid in [*tree, *descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


@pytest.fixture
def head_node():
    """A Ray head on localhost with 2 CPUs (`ray start --block`, a child of this test), stopped with its workers
    when the test ends.

    Its temp dir is short (Ray's socket paths must fit 107 characters, which pytest's tmp_path can exceed)."""
    cli = str(Path(sys.executable).parent / "ray")
    port, temp = _free_port(), tempfile.mkdtemp(prefix="dpfl-ray-")
    start = [cli, "start", "--head", "--block", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
             "--disable-usage-stats", f"--temp-dir={temp}"]
    head = subprocess.Popen(start, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, head)
        yield f"127.0.0.1:{port}"
    finally:
        tree = descendants(head.pid)
        _stop_tree(head)
        shutil.rmtree(temp, ignore_errors=True)
        assert not [pid for pid in tree if alive(pid)], "the head node left processes"


def test_a_run_on_a_running_cluster_equals_the_local_run(head_node, tmp_path: Path):
    """`dpfl run` (a process of its own: Ray is joined once there) on the head node gives the in-process local run's
    model and ledger bit for bit, and says it joined the cluster."""
    from dpfl.experiment.run_directory import CHECKPOINT, load_checkpoint

    local = build_run(load_config("configs/demo.yaml", SETS)).run()
    out = tmp_path / "run"
    args = [a for s in ["backend=ray", f"ray.address={head_node}", *SETS] for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "dpfl.cli", "run", "configs/demo.yaml", *args, "--out", str(out)],
                          cwd=ROOT, env=tree_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    params = load_checkpoint(out / CHECKPOINT)["params"]
    for n in local.params:
        assert torch.equal(local.params[n], params[n]), n
    spent = {c["client"]: c["epsilon_spent"] for c in json.loads((out / "privacy.json").read_text())["clients"]}
    assert spent == local.spent()
    backend = json.loads((out / "summary.json").read_text())["backend"]
    assert backend["ray"] == "joined" and backend["address"] == head_node  # joined the cluster, did not start Ray

"""`ray.address`: dpfl joins a running Ray cluster (here a head node started on localhost by the test) instead of
starting its own, and the run is still the in-process run bit for bit."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from dpfl.experiment.build import build_run
from dpfl.experiment.config.loading import load_config

ray = pytest.importorskip("ray")
# the head node's teardown (`ray stop --force`) stops every Ray process on the machine: no other Ray test may run
# beside it, so all of them share one xdist worker (pyproject: --dist loadgroup); a head node and a run: integration
# tier
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.integration]
SETS = ["training.rounds=2", "model.name=cnn_digits"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def head_node():
    """A Ray head on localhost with 2 CPUs, stopped (with its workers) when the test ends.

    Its temp dir is short (Ray's socket paths must fit 107 characters, which pytest's tmp_path can exceed)."""
    if ray.is_initialized():
        pytest.skip("this process already runs Ray")
    cli = str(Path(sys.executable).parent / "ray")
    port, temp = _free_port(), tempfile.mkdtemp(prefix="dpfl-ray-")
    start = [cli, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
             "--disable-usage-stats", f"--temp-dir={temp}"]
    subprocess.run(start, check=True, capture_output=True, timeout=120)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        ray.shutdown()
        subprocess.run([cli, "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


def test_a_run_on_a_running_cluster_equals_the_local_run(head_node):
    local = build_run(load_config("configs/demo.yaml", SETS)).run()
    run = build_run(load_config("configs/demo.yaml", ["backend=ray", f"ray.address={head_node}", *SETS]))
    result = run.run()
    for n in local.params:
        assert torch.equal(local.params[n], result.params[n]), n
    assert local.spent() == result.spent()
    assert not run.backend._owned_ray  # joined the cluster, did not start Ray

"""`dpfl flower guide --nodes 2`, as printed: a SuperLink and two SuperNodes on 127.0.0.1, the run, the check.

Everything runs from a directory that is not the repository. First only one SuperNode is up: the run fails with the
missing partition-id and `dpfl flower check` exits 1 (while `flwr run` exits 0); then the second starts and the
same commands finish with the privacy report. Stopping each process with SIGTERM leaves none of the processes it
started (flower-superexec, ClientApps, the ServerApp) running.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from .federation import Federation, env, free_base_port, guide_steps, read_logs, wait_listening  # noqa: E402

pytestmark = pytest.mark.integration  # four processes over gRPC, minutes: the integration tier

NODE_TIMEOUT = 20  # the missing-node attempt only: the wait before the run fails (the guide leaves the default, 60 s)


def test_the_printed_commands_run_a_two_node_federation_to_its_privacy_report(tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    port = free_base_port(2)
    done = subprocess.run([sys.executable, "-m", "dpfl.cli", "flower", "guide", "--nodes", "2", "--port", str(port),
                           "--dir", "fed"], cwd=elsewhere, env=env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    steps = guide_steps(done.stdout)
    assert sorted(steps) == [1, 2, 3, 4, 5], done.stdout
    assert len(steps[3]) == 2 and "nodes=2" in steps[4][-1]
    assert "run_simulation" not in done.stdout
    fed = Federation(elsewhere, tmp_path / "logs")
    submit = "\n".join(steps[2] + steps[4] + steps[5])
    try:
        start = time.monotonic()
        fed.start("superlink", steps[1][0])
        wait_listening(port, start + 120, list(fed.procs.values()), fed.logs)
        fed.start("supernode0", steps[3][0])

        # one SuperNode missing: the run fails with the reason, the check exits 1, `flwr run` itself exited 0
        short = submit.replace('--run-config "nodes=2 ', f'--run-config "node-timeout={NODE_TIMEOUT} nodes=2 ')
        assert short != submit
        t0 = time.monotonic()
        failed = fed.shell(short, timeout=300)
        took = time.monotonic() - t0
        assert failed.returncode == 1, failed.stdout + failed.stderr + read_logs(fed.logs)
        assert "Successfully started run" in failed.stdout  # flwr run submitted it (and exited 0)
        assert "waiting for SuperNodes: 1 of 2 connected, missing partition-id 1" in failed.stdout  # streamed
        assert "the Flower run failed: 1 of 2 SuperNodes connected in 20 s: no SuperNode holds partition-id 1" \
            in failed.stderr, failed.stderr
        assert took < NODE_TIMEOUT + 90, took  # the ServerApp's start, the wait, the stream's end: no 120 s wait

        # the second SuperNode: the same commands finish, from any directory, with the privacy report
        fed.start("supernode1", steps[3][1])
        time.sleep(1.5)  # a new OUT (the guide names it by the second)
        finished = fed.shell(submit, timeout=420)
        output = finished.stdout + finished.stderr
        assert finished.returncode == 0, output + read_logs(fed.logs)
        assert "dpfl: all 2 SuperNodes connected" in finished.stdout  # the ServerApp's progress reaches --stream
        for r in (1, 2, 3):
            assert f"dpfl: round {r}/3" in finished.stdout, finished.stdout
        assert "guarantee: sample-level DP against the server" in finished.stdout  # dpfl flower check's report
        runs = sorted((elsewhere / "fed").glob("run-*"))
        assert len(runs) == 2 and (runs[0] / "flower-failure.txt").is_file()
        privacy = json.loads((runs[1] / "privacy.json").read_text())
        assert [c["client"] for c in privacy["clients"]] == [0, 1]  # nodes=2: the run's clients are the nodes
        assert privacy["flower"]["nodes"] == 2 and privacy["flower"]["shared_seed"] is False
        assert f"run directory: {runs[1]}" in finished.stdout

        # stop as the guide says: SIGTERM each SuperNode, then the SuperLink; nothing they started keeps running
        for name in ("supernode0", "supernode1", "superlink"):
            left = fed.stop_gracefully(name)
            assert not left, f"{name} left {left} running"
    finally:
        fed.kill_all()

"""`dpfl flower guide --secure DIR`, as printed: TLS between the SuperLink, its SuperNodes and `flwr`, and Flower's
SuperNode authentication, with the certificates and keys the printed `dpfl flower keys` step generates.

Two registered SuperNodes run the federation to its privacy report over TLS; a SuperNode whose key was not
registered (a key pair this test generates with `cryptography`) is refused by the SuperLink and exits.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from .federation import Federation, env, free_base_port, guide_steps, read_logs, wait_listening  # noqa: E402

pytestmark = pytest.mark.integration  # four processes over TLS, minutes: the integration tier


def test_tls_and_node_authentication_on_localhost(tmp_path: Path):
    import sys

    from dpfl.flower.keys import write_node_keys

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    port = free_base_port(3)
    keys = tmp_path / "keys"
    done = subprocess.run([sys.executable, "-m", "dpfl.cli", "flower", "guide", "--nodes", "2", "--port", str(port),
                           "--dir", "fed", "--secure", str(keys)], cwd=elsewhere, env=env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    steps = guide_steps(done.stdout)
    assert sorted(steps) == [0, 1, 2, 3, 4, 5], done.stdout
    assert "--insecure" not in "\n".join(line for lines in steps.values() for line in lines)
    fed = Federation(elsewhere, tmp_path / "logs")
    made = fed.shell("\n".join(steps[0]), timeout=120)  # dpfl flower keys: the CA, server certificate, node keys
    assert made.returncode == 0, made.stderr
    write_node_keys(keys, "intruder")  # a valid key pair the SuperLink was never told about
    register = [line for line in steps[2] if line.startswith("flwr supernode register")]
    connection = [line for line in steps[2] if not line.startswith("flwr supernode register")]
    assert len(register) == 2
    try:
        start = time.monotonic()
        fed.start("superlink", steps[1][0])
        wait_listening(port, start + 120, list(fed.procs.values()), fed.logs)
        registered = fed.shell("\n".join(steps[2]), timeout=120)  # over TLS: `flwr` checks the certificate
        assert registered.returncode == 0, registered.stdout + registered.stderr
        assert registered.stdout.count("registered successfully") == 2
        for i, command in enumerate(steps[3]):
            fed.start(f"supernode{i}", command)

        # the unregistered node: the SuperLink refuses it and it exits (Flower's exit code 305)
        intruder = fed.start("intruder", steps[3][0].replace(f"{keys}/node0", f"{keys}/intruder")
                             .replace(f"--port {port + 10}", f"--port {port + 12}"))
        code = intruder.wait(timeout=120)
        log = (fed.logs / "intruder.log").read_text()
        assert code != 0 and "Failed to activate SuperNode" in log, log

        finished = fed.shell("\n".join(connection + steps[4] + steps[5]), timeout=420)
        assert finished.returncode == 0, finished.stdout + finished.stderr + read_logs(fed.logs)
        assert "dpfl: all 2 SuperNodes connected" in finished.stdout and "dpfl: round 3/3" in finished.stdout
        assert "guarantee: sample-level DP against the server" in finished.stdout
        (run,) = sorted((elsewhere / "fed").glob("run-*"))
        privacy = json.loads((run / "privacy.json").read_text())
        assert [c["client"] for c in privacy["clients"]] == [0, 1]
        assert "https://127.0.0.1" in (fed.logs / "superlink.log").read_text()  # TLS on the SuperLink's port
        for name in ("supernode0", "supernode1", "superlink"):
            left = fed.stop_gracefully(name)
            assert not left, f"{name} left {left} running"
    finally:
        fed.kill_all()

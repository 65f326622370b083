"""Two hospitals on Flower, as `dpfl flower guide --config` prints it: a SuperLink and two SuperNodes on 127.0.0.1,
each node reading only its own CSV (node config `silo`), the server only the test CSV; the run finishes with its
privacy report and equals `dpfl run` of the same config (the run seed shared: testing only)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from .federation import Federation, env, free_base_port, guide_steps, read_logs, wait_listening  # noqa: E402
from .helpers import ROOT, TOL  # noqa: E402

pytestmark = pytest.mark.integration  # three processes over gRPC, minutes: the integration tier

HOSPITALS = ROOT / "configs" / "hospitals"


def _two_hospitals(tmp: Path) -> Path:
    """hospital_a.csv and hospital_b.csv each in a node's folder; the config and test.csv in the server's."""
    for i, name in enumerate("ab"):
        (tmp / f"node{i}").mkdir()
        shutil.copy(HOSPITALS / f"hospital_{name}.csv", tmp / f"node{i}")
    server = tmp / "server"
    server.mkdir()
    shutil.copy(HOSPITALS / "test.csv", server)
    text = (HOSPITALS / "hospitals.yaml").read_text()
    text = text.replace("    - hospital_a.csv\n    - hospital_b.csv\n    - hospital_c.csv\n",
                        "    - ../node0/hospital_a.csv\n    - ../node1/hospital_b.csv\n")
    text = text.replace("budgets: [1, 3, 8]", "budgets: [1, 3]").replace("rounds: 20", "rounds: 3")
    text = text.replace("every: 5", "every: 1")
    assert "node1" in text and "[1, 3]" in text and "rounds: 3" in text
    (server / "two.yaml").write_text(text)
    return server / "two.yaml"


def test_each_node_reads_its_own_csv_and_the_run_is_dpfl_runs(tmp_path: Path):
    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import load_config

    config = _two_hospitals(tmp_path)
    port = free_base_port(2)
    done = subprocess.run([sys.executable, "-m", "dpfl.cli", "flower", "guide", "--config", str(config), "--port",
                           str(port), "--dir", "fed"], cwd=tmp_path, env=env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    steps = guide_steps(done.stdout)
    assert [line.endswith(f"silo=\"{tmp_path / f'node{i}' / f'hospital_{n}.csv'}\"'")
            for i, (line, n) in enumerate(zip(steps[3], "ab", strict=True))] == [True, True], steps[3]
    submit = "\n".join(steps[2] + steps[4] + steps[5]).replace('--run-config "nodes=2 ',
                                                                 '--run-config "shared-seed=true nodes=2 ')
    assert "shared-seed=true" in submit
    fed = Federation(tmp_path, tmp_path / "logs")
    try:
        start = time.monotonic()
        fed.start("superlink", steps[1][0])
        wait_listening(port, start + 120, list(fed.procs.values()), fed.logs)
        for i in (0, 1):
            fed.start(f"supernode{i}", steps[3][i])
        finished = fed.shell(submit, timeout=420)
        assert finished.returncode == 0, finished.stdout + finished.stderr + read_logs(fed.logs)
        assert "client 0 = node" in finished.stdout and "records)" in finished.stdout  # the counts the nodes sent
        for name in ("supernode0", "supernode1", "superlink"):
            assert not fed.stop_gracefully(name), name
    finally:
        fed.kill_all()
    run_dir = next((tmp_path / "fed").glob("run-*"))
    privacy = json.loads((run_dir / "privacy.json").read_text())
    assert privacy["flower"]["server_data"].startswith("each node read only its own silo")
    want = build_run(load_config(config)).run()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["test_accuracy"] for r in rows] == pytest.approx([r["test_accuracy"] for r in want.history], abs=TOL)
    spent = {c["client"]: c["epsilon_spent"] for c in privacy["clients"]}
    assert spent == pytest.approx(want.spent(), abs=TOL)
    assert [c["epsilon_budget"] for c in privacy["clients"]] == [1.0, 3.0]

"""Flower's simulation engine runs the same dpfl run as `dpfl run`: a SuperLink started with `--simulation` (3
virtual SuperNodes on Ray, `flwr run --federation-config num-supernodes=3`), not the deprecated `run_simulation`."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

from .federation import BIN, Federation, env, free_base_port, read_logs, wait_listening  # noqa: E402
from .helpers import CONFIG, ROOT, assert_same_run, reference  # noqa: E402

# Flower's simulation runs on Ray; it starts Ray (~25 s a run): integration tier
pytestmark = pytest.mark.integration
PROJECT = ROOT / "examples" / "flower"
SIMULATION = "num-supernodes=3 client-resources-num-cpus=1 init-args-num-cpus=2"


@pytest.fixture(scope="module")
def simulation_link(tmp_path_factory):
    """A SuperLink in simulation mode on 127.0.0.1 and a `flwr` configuration naming it (stopped with SIGTERM)."""
    tmp = tmp_path_factory.mktemp("sim")
    port = free_base_port(0)
    home = tmp / "flwr"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = '
                                      f'"127.0.0.1:{port}"\ninsecure = true\n')
    fed = Federation(tmp, tmp / "logs")
    try:
        fed.start("superlink", f"{BIN / 'flower-superlink'} --insecure --simulation --port {port} "
                               "--disable-runtime-dependency-installation")
        wait_listening(port, time.monotonic() + 120, list(fed.procs.values()), fed.logs)
        yield home, fed
        assert not fed.stop_gracefully("superlink"), "the simulation SuperLink left processes running"
    finally:
        fed.kill_all()


def simulate(link, out: Path, run_config: str) -> None:
    """`flwr run` of examples/flower on the simulation SuperLink, then `dpfl flower check` (which must pass)."""
    home, fed = link
    submitted = subprocess.run(
        [str(BIN / "flwr"), "run", str(PROJECT), "sim", "--stream", "--federation-config", SIMULATION,
         "--run-config", f'config="{CONFIG}" out="{out}" node-timeout=120.0 {run_config}'],
        env={**env(), "FLWR_HOME": str(home)}, capture_output=True, text=True, timeout=400)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    checked = subprocess.run([str(BIN / "python"), "-m", "dpfl.cli", "flower", "check", str(out)], env=env(),
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr + submitted.stdout + read_logs(fed.logs)
    assert "dpfl: round 3/3" in submitted.stdout  # the ServerApp's progress reaches --stream


def test_simulation_matches_in_process(simulation_link, tmp_path: Path):
    out = tmp_path / "run"
    simulate(simulation_link, out, "shared-seed=true")
    assert_same_run(out, reference())


def test_secret_seeds_are_the_default_and_keep_the_noise_on_the_nodes(simulation_link, tmp_path: Path):
    """Without shared-seed each node draws its own noise: the model differs from the simulation's, the ledger (which
    depends on the noise multipliers, not on the draws) is the same, and no noise norm reaches the server."""
    import torch

    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import load_config
    from dpfl.experiment.run_directory import CHECKPOINT, load_checkpoint
    from dpfl.flower.protocol import SECRET_SEED_NOTE

    out = tmp_path / "run"
    simulate(simulation_link, out, "")
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["flower"]["shared_seed"] is False and privacy["flower"]["seeds"] == SECRET_SEED_NOTE
    local = build_run(load_config(CONFIG)).run()
    assert [c["epsilon_spent"] for c in privacy["clients"]] == [local.spent()[i] for i in range(3)]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("noise_stat_empirical" not in row and "noise_stat_analytic" in row for row in rows)
    assert all("noise_stat_empirical" in row for row in local.history)
    params = load_checkpoint(out / CHECKPOINT)["params"]
    assert params.keys() == local.params.keys()
    assert all(not torch.equal(params[n], local.params[n]) for n in params)  # other noise in every tensor

"""Flower's simulation engine (run_simulation, 3 virtual SuperNodes) runs the same dpfl run as `dpfl run`."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

from .helpers import CONFIG, assert_same_run, reference  # noqa: E402

# Flower's simulation runs on Ray: tests/engine/test_ray_cluster.py; it starts Ray (~25 s a test): integration tier
pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.integration]


def test_run_simulation_matches_in_process(tmp_path: Path):
    from flwr.simulation import run_simulation

    from dpfl.flower.client_app import client_app
    from dpfl.flower.server_app import server_app

    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(server_app(config=str(CONFIG), out=str(out), shared_seed=True, node_timeout=60.0),
                       client_app(shared_seed=True), num_supernodes=3,
                       backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}})
    assert (out / "summary.json").is_file(), "the ServerApp did not finish (see the log above)"
    assert_same_run(out, reference())


def test_secret_seeds_are_the_default_and_keep_the_noise_on_the_nodes(tmp_path: Path):
    """Without shared-seed each node draws its own noise: the model differs from the simulation's, the ledger (which
    depends on the noise multipliers, not on the draws) is the same, and no noise norm reaches the server."""
    import json

    import torch
    from flwr.simulation import run_simulation

    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import load_config
    from dpfl.experiment.run_directory import CHECKPOINT, load_checkpoint
    from dpfl.flower.client_app import client_app
    from dpfl.flower.protocol import SECRET_SEED_NOTE
    from dpfl.flower.server_app import server_app

    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_simulation(server_app(config=str(CONFIG), out=str(out), node_timeout=60.0), client_app(),
                       num_supernodes=3,
                       backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}})
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

"""`dpfl reproduce mechanisms`: the fixed-clip sweep, adaptive clipping and FedAdam on one central-DP setting.

Grid tests build and validate every job's config and build its algorithm (so each method runs the mechanism it is
named after); the end-to-end test runs two methods for 3 rounds with one seed on Fashion-MNIST (the `fmnist`
fixture skips it where the dataset is missing, as the other reproduce tests do).
"""

from __future__ import annotations

import csv

import pytest

from dpfl.experiment.build import build_run
from dpfl.reproduce import mechanisms
from dpfl.reproduce.jobs import GridError
from cli_runner import cli

METHODS = ["fixed_c0.03", "fixed_c0.1", "fixed_c0.3", "fixed_c1", "adaptive", "fixed_c0.1_fedadam",
           "fixed_c1_fedadam", "adaptive_fedadam", "fixed_c0.1_fedadam_lr0.03", "adaptive_fedadam_lr0.03",
           "fixed_c0.1_fedadam_lr0.01", "adaptive_fedadam_lr0.01"]


def _server_lr(method: str) -> float | None:
    """The FedAdam server lr a method is named for: `_lrX` or Flower's default 0.1; None without FedAdam."""
    if "_fedadam" not in method:
        return None
    return float(method.split("_lr")[1]) if "_lr" in method else 0.1


@pytest.mark.parametrize("scale, clients, rounds", [("ci", 500, 50), ("full", 3000, 200)])
def test_the_grid_is_twelve_methods_by_three_seeds_on_one_setting(scale, clients, rounds):
    grid = mechanisms.grid(scale)
    assert [s.name for s in grid.settings] == [f"fmnist-{clients}"] and grid.seeds == [0, 1, 2]
    assert [j.method for j in grid.jobs if j.seed == 0] == METHODS
    for job in grid.jobs:
        cfg = job.config
        assert cfg.data.clients == clients and cfg.training.rounds == rounds
        assert cfg.algorithm.name == "dp_fedavg_central" and cfg.privacy.mechanism == "central"
        assert cfg.privacy.budgets.epsilon == 4.0 and cfg.privacy.noise_multiplier is None  # calibrated from eps 4
        adaptive = job.method.startswith("adaptive")
        assert (cfg.privacy.adaptive_clipping is not None) == adaptive
        assert cfg.privacy.clip == (None if adaptive else float(job.method.split("_")[1][1:]))
        optimizer = cfg.algorithm.server_optimizer
        lr = _server_lr(job.method)
        assert (optimizer is not None and optimizer.name == "fedadam") == (lr is not None)
        assert optimizer is None or optimizer.lr == lr


def test_each_method_builds_the_mechanism_it_is_named_after():
    grid = mechanisms.grid("ci", seeds=1)
    for job in grid.jobs:
        step = build_run(job.config).algorithm.aggregator
        assert (step.adaptive_clipping is not None) == job.method.startswith("adaptive"), job.method
        assert (type(step).__name__ == "OptimizedServerStep") == (_server_lr(job.method) is not None), job.method


def test_only_fashion_mnist_and_the_two_scales():
    with pytest.raises(GridError, match="fashion_mnist only"):
        mechanisms.grid("ci", datasets=["mnist"])
    with pytest.raises(GridError, match="'ci' or 'full'"):
        mechanisms.grid("huge")


def test_two_methods_run_end_to_end_and_are_tabled(fmnist, tmp_path):
    out = tmp_path / "mech"
    code, stdout, err = cli("reproduce", "mechanisms", "--scale", "ci", "--out", str(out), "--seeds", "1",
                            "--rounds", "3", "--methods", "fixed_c1,adaptive_fedadam")
    assert code == 0, err
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [(r["method"], r["status"]) for r in rows] == [("fixed_c1", "ok"), ("adaptive_fedadam", "ok")]
    assert all(0.0 < float(r["final_accuracy"]) <= 1.0 for r in rows)
    assert "adaptive_fedadam" in (out / "results.md").read_text()

"""`dpfl reproduce rdpcfl`: the grid, real runs on a tiny setting, the results files; the shipped configs' budgets."""

import csv

import pytest

from cli_runner import cli
from dpfl.experiment.config import ConfigError, load_config, validate_config
from dpfl.privacy import two_stage
from dpfl.reproduce import rdpcfl
from dpfl.reproduce.jobs import config_dir
from dpfl.reproduce.runner import run_jobs


def test_the_grids():
    ci = rdpcfl.grid("ci")
    assert len(ci.jobs) == 7 * 2 and {j.setting for j in ci.jobs} == {"fmnist-rotation-eps5"}
    by = {j.method: j.config for j in ci.jobs if j.seed == 0}
    assert by["oracle"].algorithm.name == "clustered_oracle" and by["fedavg"].privacy.mechanism == "none"
    assert by["rdpcfl"].privacy.budgets == 5.0 and by["global"].algorithm.name == "dp_fedavg_local"
    assert all(c.data.partition == "clustered" and c.training.rounds == 20 for c in by.values())
    three = rdpcfl.grid("ci", epsilons="3,5,10")
    assert {j.setting for j in three.jobs} == {"fmnist-rotation-eps3", "fmnist-rotation-eps5", "fmnist-rotation-eps10"}
    assert {j.config.privacy.budgets for j in three.jobs if j.method == "rdpcfl"} == {3.0, 5.0, 10.0}
    code, _, err = cli("reproduce", "rdpcfl", "--scale", "ci", "--out", "unused", "--epsilons", "3,x", "--dry-run")
    assert code == 2 and "--epsilons" in err and len(err.strip().splitlines()) == 1
    full = rdpcfl.grid("full")
    assert len(full.jobs) == 4 * 5 * 7 * 4  # 3 Fashion-MNIST shifts + MNIST rotation, 5 epsilons, 7 methods, 4 seeds


@pytest.mark.parametrize("name", ["ci_digits_rotation", "ci_fmnist_rotation", "fmnist_rotation", "fmnist_label_flip",
                                  "analysis_round1_batch",
                                  "fmnist_label_shift", "mnist_rotation", "cifar10_rotation_resnet18"])
def test_every_shipped_config_plans_within_its_budget(name):
    """Spec §9.2: the whole-ledger epsilon (training + planned selections, composed in RDP) <= eps_total."""
    cfg = load_config(config_dir("rdpcfl") / f"{name}.yaml")
    c, t = cfg.data.clustered, cfg.training
    for eps in {cfg.privacy.budgets, *rdpcfl.EPSILONS["full"]}:
        plan = two_stage.plan(eps, cfg.privacy.delta, c.train_per_client, t.batch_size, int(t.local_epochs), t.rounds)
        assert plan.planned_epsilon <= eps


TINY = "ci_digits_rotation.yaml"


def test_a_tiny_study_runs_and_reports(tmp_path, monkeypatch):
    monkeypatch.setitem(rdpcfl.BASES, "ci", (("digits-rotation", TINY, "digits"),))
    grid = rdpcfl.grid("ci", datasets=("digits",), seeds=1, rounds=8, methods=["rdpcfl", "global", "oracle"])
    out = tmp_path / "out"
    outcomes = run_jobs(grid.jobs, out)
    csv_path, md_path = rdpcfl.write_results(grid, outcomes, out, command="test")
    with open(csv_path) as f:
        table = {r["method"]: r for r in csv.DictReader(f)}
    assert set(rdpcfl.COLUMNS) == set(next(iter(table.values())))
    assert all(r["status"] == "ok" and r["meets_budgets"] == "True" for r in table.values())
    assert float(table["oracle"]["ari"]) == 1.0 and table["oracle"]["recovered"] == "True"
    assert table["global"]["clusters_found"] == "1" and float(table["global"]["ari"]) == 0.0
    assert table["rdpcfl"]["round1_recovered"] in ("True", "False") and float(table["rdpcfl"]["mss"]) > 0
    assert 0 < float(table["rdpcfl"]["mean_acc"]) <= 1 and float(table["rdpcfl"]["max_epsilon_spent"]) <= 5.0
    text = md_path.read_text()
    assert "## digits-rotation-eps5" in text and "| oracle |" in text and "Runs computed by: dpfl " in text
    assert (out / "plots" / "accuracy_vs_eps_digits-rotation.png").stat().st_size > 0
    report = (out / table["rdpcfl"]["run_dir"] / "report.md").read_text()
    assert "Releases accounted" in report and "exponential mechanism" in report and "planned ε at most" in report


def base_config(**changes):
    cfg = load_config(config_dir("rdpcfl") / TINY).model_dump(mode="json")
    for path, value in changes.items():
        section, _, key = path.partition(".")
        if key:
            cfg[section][key] = value
        else:
            cfg[section] = value
    return cfg


@pytest.mark.parametrize("changes, match", [
    ({"data.clustered": None}, "data.clustered"),
    ({"training.selection": {"kind": "fixed", "k": 3}}, "training.selection"),
    ({"privacy.noise_multiplier": 1.0}, "privacy.noise_multiplier"),
    ({"privacy.budgets": 1.2, "training.rounds": 200}, "no training budget"),
    ({"algorithm": {"name": "rdpcfl", "params": {"round1_batch": 0}}}, "round1_batch"),
    ({"algorithm": {"name": "ifca_dp", "params": {}}}, "algorithm.params.clusters"),
])
def test_bad_clustered_configs_are_one_line(tmp_path, changes, match):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(base_config(**changes)))
    code, _, err = cli("run", path, "--out", tmp_path / "out")
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_build_algorithm_alone_refuses_a_clustered_algorithm():
    from dpfl.experiment.build import build_algorithm

    with pytest.raises(ConfigError, match="built with its data"):
        build_algorithm(validate_config(base_config()))

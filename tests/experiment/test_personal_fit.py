"""scripts/personal_fit.py: each client's model (the one the run's own evaluation uses) on its training records and
on its own test split, from a finished run directory, checked against what the run logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_module import load_script

from cli_runner import cli

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "rdpcfl" / "ci_digits_rotation.yaml"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 4-round R-DPCFL run (clients use their cluster's model) and the same data with DP-FedAvg (the global one)."""
    out = tmp_path_factory.mktemp("fit")
    common = ("--set", "training.rounds=4", "--set", "evaluation.every=2")
    assert cli("run", CONFIG, "--out", out / "rdpcfl", *common)[0] == 0
    assert cli("run", CONFIG, "--out", out / "global", *common,
               "--set", "algorithm={name: dp_fedavg_local, params: {weighting: uniform}}")[0] == 0
    return out


def _fit(run_dir: Path, capsys) -> dict:
    load_script("personal_fit").main([str(run_dir), "--json"])
    return json.loads(capsys.readouterr().out)[0]


def test_the_clients_models_recompute_the_logged_accuracy_and_add_the_training_one(runs, capsys):
    fit = _fit(runs / "rdpcfl", capsys)
    metrics = [json.loads(line) for line in (runs / "rdpcfl" / "metrics.jsonl").read_text().splitlines()]
    assert fit["model"] == "personal" and fit["clients"] == 11
    assert fit["test_acc"] == fit["logged_test_acc"] == metrics[-1]["acc_personal"]  # the same models, data, order
    assert fit["minority_test_acc"] == metrics[-1]["acc_personal_minority"]
    assert 0.0 < fit["train_acc"] <= 1.0 and fit["train_acc"] != fit["test_acc"]  # other records: another number
    assert fit["gap"] == pytest.approx(fit["train_acc"] - fit["test_acc"])


def test_a_global_model_run_is_scored_with_its_global_model(runs, capsys):
    fit = _fit(runs / "global", capsys)
    metrics = [json.loads(line) for line in (runs / "global" / "metrics.jsonl").read_text().splitlines()]
    assert fit["model"] == "global" and fit["clients"] == 11
    assert fit["test_acc"] == pytest.approx(metrics[-1]["test_acc_clients_mean"], abs=1e-12)  # a mean of the same


def test_an_unfinished_directory_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match="not a finished dpfl run directory"):
        load_script("personal_fit").main([str(tmp_path)])

"""`dpfl confidence`: the final model's test loss taken apart. Checked against the run's own evaluation, and against
a copy whose logits are exactly 50x larger (its head scaled): the same accuracy, a much larger loss, a temperature
50x larger and the same loss at that temperature."""

import json
import shutil

import pytest
import torch
from cli_runner import cli

from dpfl.experiment.config import validate_config
from dpfl.experiment.run_directory import execute
from dpfl.evaluate.confidence import confidence

BASE = {"name": "confidence", "seed": 0, "data": {"dataset": "digits", "clients": 5}, "model": {"name": "mlp2"},
        "algorithm": {"name": "fedavg"}, "evaluation": {"every": 4},
        "training": {"rounds": 4, "local_epochs": 2, "batch_size": 16, "optimizer": {"lr": 0.1}}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("confidence") / "run"
    execute(validate_config(BASE), d)
    return d


def test_accuracy_and_loss_are_the_runs_own_final_evaluation(run):
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    c = confidence(run)
    assert c["accuracy"] == pytest.approx(last["test_accuracy"], abs=1e-9)
    assert c["loss"] == pytest.approx(last["test_loss"], rel=1e-5)  # float32 in the run, float64 here
    assert 0 < c["loss_right"] < c["loss"] < c["loss_wrong"]
    assert c["param_norm"] != pytest.approx(c["param_norm_at_init"], rel=1e-3)  # trained: it moved from the start


def test_a_model_with_50x_logits_has_the_same_accuracy_and_the_same_loss_at_50x_the_temperature(run, tmp_path):
    scaled = tmp_path / "scaled"
    shutil.copytree(run, scaled)
    state = torch.load(scaled / "checkpoint.pt", weights_only=True)
    head = [name for name in state["params"] if name.startswith("fc2.")]  # mlp2's output layer: logits = fc2(...)
    assert "fc2.weight" in head  # (and fc2.bias where the model has one)
    for name in head:
        state["params"][name] = state["params"][name] * 50
    torch.save(state, scaled / "checkpoint.pt")
    a, b = confidence(run), confidence(scaled)
    assert b["accuracy"] == a["accuracy"] and b["median_margin"] == pytest.approx(50 * a["median_margin"], rel=1e-6)
    assert b["loss"] > 3 * a["loss"] and b["held_out_loss"] > 3 * a["held_out_loss"]  # measured: 4.0x
    assert b["temperature"] == pytest.approx(50 * a["temperature"], rel=1e-3)  # the fit's tolerance in log T: 1e-5
    assert b["held_out_loss_at_temperature"] == pytest.approx(a["held_out_loss_at_temperature"], rel=1e-4)
    assert a["held_out_loss_at_temperature"] <= a["held_out_loss"] + 0.05  # fitted on the other half: near, not below


def test_cli_prints_json_and_refuses_what_it_cannot_measure(run, tmp_path):
    code, stdout, err = cli("confidence", run, "--json")
    assert code == 0, err
    (row,) = json.loads(stdout)["runs"]
    assert row["name"] == "confidence" and row["n_test"] > 0
    code, stdout, err = cli("confidence", run)
    assert code == 0 and "temperature" in stdout and "(accuracy unchanged)" in stdout, err
    code, _, err = cli("confidence", tmp_path)
    assert code == 2 and "not a finished dpfl run directory" in err
    mse = tmp_path / "mse"
    execute(validate_config({**BASE, "model": {"name": "relu_mlp"}, "training": {**BASE["training"], "rounds": 1},
                             "evaluation": {"every": 1}}), mse)
    code, _, err = cli("confidence", mse)
    assert code == 2 and "'mse_onehot'" in err and "classifier" in err


def test_a_test_set_of_one_record_is_refused(run, monkeypatch):
    import dpfl.evaluate.confidence as module

    real = module.released_model

    def one_record(run_dir):
        released = real(run_dir)
        x, y = released.nonmembers()
        monkeypatch.setattr(released, "nonmembers", lambda: (x[:1], y[:1]))
        return released

    monkeypatch.setattr(module, "released_model", one_record)
    with pytest.raises(ValueError, match="has 1 record.*at least 2"):
        confidence(run)

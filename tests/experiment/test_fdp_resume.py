"""An f-DP accounted run (Noisy-FedAvg, GDP ledger) stopped mid-way resumes and ends as an uninterrupted run.

Found on 2026-11-30: the GDP accountant returned a NumPy float for some μ (its certified-bound correction step), the
metrics rows kept it, and the checkpoint then held a NumPy scalar that `torch.load(weights_only=True)` refuses, so
a killed Noisy-FedAvg run could not resume ("checkpoint.pt: corrupt") and `dpfl confidence` could not read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpfl.experiment.config import load_config
from dpfl.experiment.federated_run import plain_row
from dpfl.experiment.run_directory import execute
from dpfl.privacy import accountant
from stopped_run import stop_in_round
from untimed import untimed

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "fdp" / "accuracy_ci_digits_logr.yaml"
# σ = 1 puts each round's μ near 1-2, where the GDP conversion's correction step used to return a NumPy float
SETS = ["training.rounds=4", "checkpoint.every=1", "algorithm.params.std=1.0"]


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("numpy_epsilons", [False, True], ids=["as-shipped", "accountant-returns-numpy"])
def test_a_stopped_noisy_fedavg_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, numpy_epsilons):
    if numpy_epsilons:  # the rows must stay checkpoint-safe whatever a stage puts in them
        real = accountant._gdp_epsilon
        monkeypatch.setattr(accountant, "_gdp_epsilon", lambda mu, delta: np.float64(real(mu, delta)))
    execute(load_config(CONFIG, SETS), tmp_path / "whole")
    stop_in_round(load_config(CONFIG, SETS), tmp_path / "stopped", 3)
    state = torch.load(tmp_path / "stopped" / "checkpoint.pt", weights_only=True)  # what resume reads
    assert state["round"] == 2  # saved after round 2; round 3 stopped before its checkpoint
    execute(load_config(CONFIG, SETS), tmp_path / "stopped", resume=True)
    assert untimed(_rows(tmp_path / "stopped")) == untimed(_rows(tmp_path / "whole"))
    for name in ("summary.json", "privacy.json"):
        assert untimed(json.loads((tmp_path / "stopped" / name).read_text())) == untimed(
            json.loads((tmp_path / "whole" / name).read_text()))


def test_a_metrics_row_holds_only_plain_python_values():
    row = plain_row({"epsilon": [np.float64(1.5), 2.0], "epsilon_max": np.float64(2.0), "k": np.int64(3),
                     "ok": np.bool_(True), "nested": {"x": (np.float32(0.5),)}, "name": "a", "none": None})
    assert row == {"epsilon": [1.5, 2.0], "epsilon_max": 2.0, "k": 3, "ok": True, "nested": {"x": (0.5,)},
                   "name": "a", "none": None}
    kinds = {type(v) for v in (*row["epsilon"], row["epsilon_max"], row["k"], row["ok"], row["nested"]["x"][0])}
    assert kinds == {float, int, bool}


def test_a_checkpoint_written_with_numpy_floats_by_an_older_dpfl_still_resumes(tmp_path):
    execute(load_config(CONFIG, SETS), tmp_path / "whole")
    stop_in_round(load_config(CONFIG, SETS), tmp_path / "old", 3)
    path = tmp_path / "old" / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    for row in state["history"]:  # as dpfl left it before 2026-11-30
        row["epsilon"] = [np.float64(e) for e in row["epsilon"]]
        row["epsilon_max"] = np.float64(row["epsilon_max"])
    torch.save(state, path)
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(path, weights_only=True)  # the plain safe loader refuses it
    execute(load_config(CONFIG, SETS), tmp_path / "old", resume=True)
    assert untimed(_rows(tmp_path / "old")) == untimed(_rows(tmp_path / "whole"))
    final = torch.load(path, weights_only=True)  # the finished run's checkpoint: plain floats again
    assert all(type(e) is float for r in final["history"] for e in r["epsilon"])

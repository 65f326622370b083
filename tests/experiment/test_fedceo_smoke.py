"""FedCEO spec test D4: every compared method runs end to end from a config, on data that needs no files,
with finite metrics; non-private FedAvg learns (above chance)."""

from __future__ import annotations

import math

import pytest

from dpfl.experiment.build import build_run
from dpfl.experiment.config import load_config

BASE = [
    "data={dataset: synthetic, clients: 6, options: {n_samples: 1200, n_features: 784, n_classes: 10, class_sep: 0.3}}",
    "data.client_test_fraction=0.2", "model={name: mlp2}", "training.rounds=4", "training.local_epochs=1",
    "training.batch_size=16", "training.optimizer={lr: 0.1, momentum: 0.5}", "training.selection={kind: fixed, k: 3}",
    "privacy.noise_multiplier=1.0", "privacy.budgets=.inf", "privacy.calibration=accountant",
]
METHODS = {
    "fedavg": ["algorithm={name: fedavg}", "privacy={}"],
    "udp_fedavg": ["algorithm={name: dp_fedavg_local}"],
    "ppsgd": ["algorithm={name: ppsgd, params: {alpha: 1.0}}"],
    "centaur": ["algorithm={name: centaur, params: {head_epochs: 1}}"],
    "fedceo_theta1": ["algorithm={name: fedceo, params: {lam: 0.5, theta: 1.0, interval: 2}}"],
    "fedceo": ["algorithm={name: fedceo, params: {lam: 0.5, theta: 1.04, interval: 2}}"],
}


@pytest.mark.parametrize("method", list(METHODS))
def test_d4_every_method_runs_end_to_end_with_finite_metrics(method):
    cfg = load_config("configs/demo.yaml", [*BASE, *METHODS[method]])
    result = build_run(cfg).run()
    assert result.stop_reason == "rounds" and len(result.history) == 4
    for row in result.history:
        for key in ("test_accuracy", "test_loss", "acc_personal", "epsilon_max"):
            if row.get(key) is not None:
                assert math.isfinite(row[key]), (method, key, row[key])
    if method == "fedavg":
        assert result.final_accuracy > 0.3  # chance is 0.1 on 10 balanced classes
    else:
        assert result.privacy.unit == "sample" and all(math.isfinite(e) for e in result.spent().values())
    if method in ("ppsgd", "centaur", "fedceo", "fedceo_theta1"):
        assert any("acc_personal" in row for row in result.history)

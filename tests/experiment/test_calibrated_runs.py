"""Runs whose noise is calibrated from the budgets (dpfl.privacy.run_calibration), end to end on digits:
every mechanism spends at most each client's budget, and worst-case participation never stops early."""

from __future__ import annotations

import numpy as np
import pytest

from dpfl.experiment.build import build_run
from config_variants import variant

BASE = {
    "name": "calibrated", "seed": 1,
    "data": {"dataset": "digits", "clients": 10, "partition": "iid", "max_train_samples": 600},
    "model": {"name": "logr"},
    "algorithm": {"name": "dp_fedavg_local"},
    "training": {"rounds": 12, "local_steps": 2, "batch_size": 16, "optimizer": {"lr": 0.5},
                 "selection": {"kind": "fixed", "k": 3}},
    "privacy": {"clip": 1.0, "budgets": 1.0},
    "evaluation": {"every": 12},
}


def config(**changes):
    return variant(BASE, **changes)


def participations(history, n):
    counts = np.zeros(n, int)
    for row in history:
        counts[row["selected"]] += 1
    return counts


def test_expected_participation_retires_lucky_clients_and_worst_case_never_stops_early():
    expected = build_run(config()).run()
    counts = participations(expected.history, 10)
    assert expected.privacy.noise_calibration["participation"] == "expected"
    # planned for 12 x 3/10 = 3.6 rounds: a client drawn more often than its noise allows is retired,
    # and the run stops when fewer than k = 3 remain eligible
    assert expected.stop_reason == "budget" and len(expected.history) < 12
    assert expected.privacy.meets_budgets and max(expected.spent().values()) <= 1.0 * (1 + 1e-9)
    assert counts.max() <= 4

    worst_run = build_run(config(privacy__participation="worst_case"))
    worst = worst_run.run()
    assert worst.stop_reason == "rounds" and len(worst.history) == 12
    assert worst.privacy.noise_calibration["participation"] == "worst_case"
    assert (worst_run.noise > expected.noise_multipliers).all()  # planned for 12 participations instead of 3.6
    assert max(worst.spent().values()) < 1.0  # nobody came near its budget: no retirement was possible
    assert worst.privacy.meets_budgets


def test_noisy_fedavg_sigma_is_calibrated_to_the_smallest_budget_and_spends_it_exactly():
    cfg = config(algorithm={"name": "noisy_fedavg", "params": {"schedule": "stagewise"}},
                 training__selection={"kind": "all"}, training__rounds=4,
                 privacy={"clip": 1.0, "budgets": [2.0] * 5 + [4.0] * 5})
    assert cfg.algorithm.params["std"] is None and cfg.privacy.accountant == "gdp"
    run = build_run(cfg)
    sigma = run.algorithm.upload.std
    result = run.run()
    assert result.stop_reason == "rounds"
    spent = result.spent()
    # everyone takes every round: the common sigma spends exactly the smallest budget (exact GDP ledger)
    assert all(v == pytest.approx(2.0, rel=1e-5) and v <= 2.0 for v in spent.values())
    assert result.privacy.extra["fdp"]["params"]["sigma"] == sigma
    assert result.privacy.noise_calibration["mechanism"] == "param_noise"
    assert [c.epsilon_guarantee for c in result.privacy.clients] == pytest.approx([2.0] * 10, rel=1e-5)


def test_udp_noise_is_calibrated_per_participation():
    cfg = config(algorithm={"name": "udp_fedavg"}, training__selection={"kind": "poisson", "rate": 0.5},
                 privacy={"clip": 1.0, "budgets": 3.0})
    run = build_run(cfg)
    assert run.algorithm.upload.noise_multiplier > 0 and run.calibrated.mechanism == "udp"
    result = run.run()
    assert result.privacy.meets_budgets and max(result.spent().values()) <= 3.0 * (1 + 1e-9)
    assert result.privacy.noise_calibration["planned_participations_max"] == pytest.approx(6.0)

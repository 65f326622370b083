"""Noisy-FedAvg/FedProx runs end to end: what the server receives, what the ledger and privacy.json say (spec T13)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from dp_accounting import ComposedDpEvent, GaussianDpEvent
from torch import nn

import dpfl.experiment.build as build_module
from dpfl.algorithms.client.upload import upload_noise
from dpfl.engine import params as P
from dpfl.engine.local_training import run_local
from dpfl.experiment.build import build_run, noisy_accounting
from config_variants import variant
from dpfl.experiment.config import ConfigError, validate_config
from dpfl.privacy.accountant import epsilon
from dpfl.privacy.fdp import COMPOSITION, SHIFTED, fdp_report
from dpfl.privacy.fdp_sensitivity import step_sizes

BASE = {
    "name": "noisy", "seed": 3,
    "data": {"dataset": "digits", "clients": 4, "partition": "iid", "max_train_samples": 400},
    "model": {"name": "logr"},
    "algorithm": {"name": "noisy_fedavg", "params": {"std": 0.5, "schedule": "stagewise"}},
    "training": {"rounds": 3, "local_steps": 2, "batch_size": 16, "optimizer": {"lr": 0.1}},
    "privacy": {"clip": 1.0},
    "evaluation": {"every": 3},
}


def config(**changes):
    return variant(BASE, **changes)


@pytest.mark.parametrize("accountant", ["gdp", "rdp"])
def test_privacy_json_composition_equals_the_accountant_on_the_realised_schedule(accountant):
    """Spec T13: a 3-round run's μ_comp is the accountant's on the same schedule; the ledger composes the same
    Gaussians: exactly the same ε with the default (exact GDP) ledger, never below it with RDP. Either way the
    run's one guarantee is the f-DP headline, and a ledger that differs is listed with the reason."""
    cfg = config(privacy={"clip": 1.0, "accountant": accountant}) if accountant == "rdp" else config()
    assert cfg.privacy.accountant == accountant  # gdp is the default for noisy runs
    result = build_run(cfg).run()
    fdp = result.privacy.extra["fdp"]
    ref = fdp_report(algo="fedavg", schedule="stagewise", eta=0.1, K=2, V=1.0, sigma=0.5, m=4, rounds=[3])
    assert fdp["view"] == "upload" and fdp["headline"] == COMPOSITION
    for c in fdp["clients"]:
        assert c["rounds_participated"] == 3
        assert c["mu"] == pytest.approx(ref.curve(COMPOSITION).mu[-1], rel=1e-12)
        assert c["epsilon"]["1e-05"] == pytest.approx(ref.curve(COMPOSITION).eps[1e-5][-1], rel=1e-9)
    shifts = 2 * 1.0 * step_sizes("stagewise", 0.1, 3, 2).sum(axis=1)  # one client's shift per round
    ledger = epsilon(ComposedDpEvent([GaussianDpEvent(0.5 / s) for s in shifts]), 1e-5, accountant)
    assert result.spent()[0] == pytest.approx(ledger, rel=1e-9)
    exact = fdp["epsilon_max"]["1e-05"]
    guarantee = result.privacy.guarantee
    assert guarantee.epsilon_max == exact and "composition" in guarantee.source
    assert ([c.epsilon_guarantee for c in result.privacy.clients]
            == [c["epsilon"]["1e-05"] for c in fdp["clients"]])
    if accountant == "gdp":
        assert ledger == pytest.approx(exact, rel=1e-9) and guarantee.other_epsilons == []
    else:
        assert ledger > exact
        (other,) = guarantee.other_epsilons
        assert other["field"] == "clients[].epsilon_spent" and "not exact" in other["why_it_differs"]
    assert fdp["paper_claimed"] is None  # no L: the paper's formulas cannot be evaluated


def test_the_server_receives_the_clipped_local_models_plus_sigma_noise_averaged():
    cfg = config(training__rounds=1)
    run = build_run(cfg)
    w0 = P.model_params(run.model)
    result = run.run()
    alg = run.algorithm
    plans = [alg.local.plan(i, int(run.n_records[i]), int(run.batch_sizes[i]), 0.0, 0) for i in range(4)]
    local = run_local(run.model, alg.local.spec, plans, run.pooled, w0, seed=cfg.seed, round_=0)
    flat_end = P.flatten(local.params)
    noise = 0.5 * upload_noise(flat_end.shape[1], list(range(4)), cfg.seed, 0)
    expected = P.unflatten(((flat_end + noise).mean(0, keepdim=True)), {n: t.unsqueeze(0) for n, t in w0.items()})
    for n in w0:
        torch.testing.assert_close(result.params[n], expected[n][0], rtol=1e-5, atol=1e-6)
    assert plans[0].step_lrs == pytest.approx((0.1, 0.1))  # stagewise: η/(t+1) at t = 0
    assert alg.local.spec.clip == 1.0 and not alg.local.private


def test_noisy_fedprox_takes_alpha_after_clipping_and_the_aggregate_final_view_gets_the_shifted_bound():
    cfg = config(algorithm={"name": "noisy_fedprox", "params": {"std": 0.5, "schedule": "stagewise", "alpha": 2.0}},
                 privacy={"clip": 1.0, "secure_aggregation": True, "release": "final", "smoothness_L": 1.0})
    assert cfg.privacy.observer == "aggregate"
    run = build_run(cfg)
    assert run.algorithm.local.spec.prox_mu == 2.0 and "averaged models" in run.algorithm.observer
    fdp = run.run().privacy.extra["fdp"]
    acc = noisy_accounting(cfg)
    ref = fdp_report(algo="fedprox", schedule="custom", eta=0.1, K=2, V=1.0, sigma=0.5, m=4, rounds=[3], L=1.0,
                     alpha=2.0, view="aggregate", release="final", eta_array=acc.step_sizes)
    client = fdp["clients"][0]
    assert fdp["headline"] == SHIFTED and client["headline"] == SHIFTED
    assert client["bounds"][SHIFTED]["mu"] == pytest.approx(ref.curve(SHIFTED).mu[-1], rel=1e-12)
    assert client["bounds"][COMPOSITION]["mu"] == pytest.approx(ref.curve(COMPOSITION).mu[-1], rel=1e-12)
    assert fdp["paper_claimed"]["is_guarantee"] is False and "NOT a guarantee" in fdp["paper_claimed"]["label"]


def test_budgets_stop_the_run_and_cohorts_charge_only_participants():
    per_round = 2 * 1.0 * 0.1 * 2 / 0.5  # constant steps: every round is G_μ1 with μ1 = 2VKη/σ (upload view)
    eps = [epsilon(ComposedDpEvent([GaussianDpEvent(1 / per_round)] * k), 1e-5, "gdp") for k in (2, 3)]
    cfg = config(algorithm__params={"std": 0.5}, training__rounds=5, privacy={"clip": 1.0, "budgets": sum(eps) / 2})
    result = build_run(cfg).run()
    assert result.stop_reason == "budget" and len(result.history) == 2 and result.privacy.meets_budgets
    assert result.privacy.extra["fdp"]["mu_max"] == pytest.approx(math.sqrt(2) * per_round)

    fixed = build_run(config(algorithm__params={"std": 0.5}, training__rounds=6,
                             training__selection={"kind": "fixed", "k": 2})).run()
    counts = np.zeros(4, int)
    for row in fixed.history:
        counts[row["selected"]] += 1
    for c in fixed.privacy.extra["fdp"]["clients"]:
        assert c["rounds_participated"] == counts[c["client"]]
        assert c["mu"] == pytest.approx(math.sqrt(counts[c["client"]]) * per_round, rel=1e-12)


def test_aggregate_view_retirement_rechecks_the_smaller_cohort():
    """Everyone takes part: when a client retires, the average of the others hides in less noise, so their
    events get stronger; every recorded event must still fit its budget."""
    mu_at = lambda m: 2 * 1.0 * 0.1 * 2 / (0.5 * math.sqrt(m))  # noqa: E731 - aggregate view, constant steps
    two = epsilon(ComposedDpEvent([GaussianDpEvent(1 / mu_at(4))] * 2), 1e-5, "gdp") * 1.001  # 2 rounds of 4 fit
    # 3 of 4, not 2 of 4 + 1 of 3
    three = epsilon(ComposedDpEvent([GaussianDpEvent(1 / mu_at(4))] * 3), 1e-5, "gdp") * 1.001
    budgets = [two, three, 50.0, 50.0]
    cfg = config(algorithm__params={"std": 0.5}, training__rounds=4,
                 privacy={"clip": 1.0, "secure_aggregation": True, "budgets": budgets})
    result = build_run(cfg).run()
    # round 3: client 0 retires; with 3 left, client 1's event no longer fits, so it retires too
    assert [len(r["selected"]) for r in result.history] == [4, 4, 2, 2]
    assert result.privacy.extra["fdp"]["uploads_averaged"] == [4, 4, 2, 2]
    assert result.privacy.meets_budgets
    others = result.privacy.extra["fdp"]["clients"][2]
    assert others["mu"] == pytest.approx(math.sqrt(2 * mu_at(4) ** 2 + 2 * mu_at(2) ** 2), rel=1e-12)


@pytest.mark.parametrize("changes, message", [
    ({"training__selection": {"kind": "poisson", "rate": 0.5}}, "full participation or fixed-size cohorts"),
    ({"training__local_steps": None, "training__local_epochs": 1}, "fixed number K of local steps"),
    ({"training__optimizer": {"lr": 0.1, "momentum": 0.5}}, "no momentum"),
    ({"algorithm__params": {"std": 0.5, "schedule": "custom"}}, "exactly when schedule is 'custom'"),
    ({"algorithm__params": {"std": 0.5, "schedule": "custom", "step_sizes": [[0.1, 0.1]] * 2}},
     r"\[3\]\[2\]"),
    ({"algorithm__params": {"std": 0.0}}, "std"),
    ({"privacy": {"clip": 1.0, "honest_clients": 5}}, "more than the 4 clients"),
    ({"privacy": {}}, "privacy.clip: required"),
    ({"algorithm": {"name": "noisy_fedprox", "params": {"std": 0.5}}}, "alpha"),
])
def test_invalid_noisy_configs_fail_with_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        config(**changes)


def test_fdp_fields_belong_to_parameter_noise_and_buffers_are_refused(monkeypatch):
    bad = copy.deepcopy(BASE)
    bad["algorithm"] = {"name": "fedavg"}
    bad["privacy"] = {"release": "final"}
    with pytest.raises(ConfigError, match="privacy.release: only used by the f-DP accounting"):
        validate_config(bad)
    with pytest.raises(ConfigError, match="samples_per_client: only used by partitions 'dirichlet_quota' and "):
        config(data__samples_per_client=50)
    custom = config(algorithm__params={"std": 0.5, "schedule": "custom", "step_sizes": [[0.1, 0.05]] * 3})
    np.testing.assert_array_equal(noisy_accounting(custom).step_sizes, [[0.1, 0.05]] * 3)

    def with_batchnorm(*args, **kwargs):
        return nn.Sequential(nn.Flatten(), nn.BatchNorm1d(64), nn.Linear(64, 10))

    monkeypatch.setattr(build_module, "build_model", with_batchnorm)
    with pytest.raises(ConfigError, match="buffers"):
        build_run(config())


def test_full_batch_size_is_each_clients_training_set():
    run = build_run(config(training__batch_size="full", algorithm__params={"std": 0.5, "batch_sampling": "fixed"}))
    assert list(run.batch_sizes) == list(run.n_records)

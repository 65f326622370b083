"""The client-level audit (canary clients, one run, Steinke et al.'s bound) as a regression guard of the privacy core:
honest mechanisms never audit above their reported epsilon, planted bugs (no noise, no clipping) and non-private
runs audit far above it. One test per client-level mechanism: central DP-FedAvg and udp uploads.

The honest checks hold for every seed except with probability 5% each (the bound's confidence); the seeds below
are fixed, so a failure means the mechanism changed, not bad luck. Measured: honest runs audit to 0.0-0.18
against a reported 1.0 (central) and 0.0 against 1.37 (udp); without noise 3.09 (central) and 2.26 (udp), without
clipping 2.14 (central). Not caught here: udp uploads without clipping (0.01): each upload's noise (8 C) hides a
10 C canary seen ~3 times among ~400 noisy uploads, so this attack is too weak for that bug at this scale."""

import json
from dataclasses import replace

import pytest
from cli_runner import cli

from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.evaluate.audit import audit_client_level
from dpfl.experiment.config import config_to_yaml
from dpfl.experiment.config.loading import validate_config

MODEL = {"name": "mlp2", "options": {"hidden": 128, "dropout": 0.0}}  # 9,600 parameters: canaries stay orthogonal


def _central(seed=0, **privacy):
    return validate_config({
        "name": "audit_central", "seed": seed, "data": {"dataset": "digits", "clients": 20}, "model": MODEL,
        "algorithm": {"name": "dp_fedavg_central"},
        "training": {"rounds": 10, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.5},
                     "selection": {"kind": "poisson", "rate": 0.5}},
        "privacy": {"mechanism": "central", "clip": 1.0, "budgets": 1.0, "delta": 1e-5, **privacy},
        "evaluation": {"every": 10}})


def _udp(seed=0):
    # 40 of the ~167 clients per round for 10 rounds, each upload N(0, (8 C)^2) (sigma of the sum 8 sqrt(40)); a
    # client is charged one Gaussian per upload, so the most-drawn canary reports eps ~1.5 at delta 1e-5
    return validate_config({
        "name": "audit_udp", "seed": seed, "data": {"dataset": "digits", "clients": 60}, "model": MODEL,
        "algorithm": {"name": "udp_fedavg"},
        "training": {"rounds": 10, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.5},
                     "selection": {"kind": "fixed", "k": 40}},
        "privacy": {"mechanism": "udp", "clip": 1.0, "noise_multiplier": 8.0 * 40 ** 0.5, "budgets": 50.0,
                    "delta": 1e-5},
        "evaluation": {"every": 10}})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_honest_central_dp_fedavg_never_audits_above_its_epsilon(seed):
    out = audit_client_level(_central(seed), canaries=200)
    assert out["epsilon_reported"] == pytest.approx(1.0, abs=1e-3)
    assert out["epsilon_lower_bound"] <= out["epsilon_reported"] and not out["refuted"]
    assert out["unit"] == "client" and out["confidence"] == 0.95 and out["canaries"] == 200


@pytest.mark.parametrize("bug", ["no_noise", "no_clipping"])
def test_the_audit_catches_a_central_server_that_drops_noise_or_clipping(monkeypatch, bug):
    real = CentralDPFedAvg.aggregate

    def broken(self, *args, **kwargs):  # the accountant still charges the calibrated noise: only the mechanism breaks
        bad = replace(self, noise_multiplier=0.0) if bug == "no_noise" else \
            replace(self, clip=1e9, noise_multiplier=self.noise_multiplier / 1e9)  # same noise std, no clipping
        return real(bad, *args, **kwargs)

    monkeypatch.setattr(CentralDPFedAvg, "aggregate", broken)
    out = audit_client_level(_central(), canaries=200)
    assert out["refuted"] and out["epsilon_lower_bound"] > 2.0 > out["epsilon_reported"]


@pytest.mark.parametrize("seed", [0, 1])
def test_honest_udp_uploads_never_audit_above_their_epsilon(seed):
    out = audit_client_level(_udp(seed), canaries=200)
    assert out["epsilon_lower_bound"] <= out["epsilon_reported"] < 3


def test_the_audit_catches_udp_uploads_without_noise(monkeypatch):
    real = ClippedNoisyUpdate.apply
    monkeypatch.setattr(ClippedNoisyUpdate, "apply", lambda self, *a, **k: real(replace(self, noise_multiplier=0.0),
                                                                                  *a, **k))
    out = audit_client_level(_udp(), canaries=200)
    assert out["refuted"] and out["epsilon_lower_bound"] > out["epsilon_reported"]


def test_a_non_private_run_audits_to_a_large_bound():
    cfg = validate_config({
        "name": "audit_fedavg", "seed": 0, "data": {"dataset": "digits", "clients": 20}, "model": MODEL,
        "algorithm": {"name": "fedavg"},
        "training": {"rounds": 3, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.5}},
        "evaluation": {"every": 3}})
    out = audit_client_level(cfg, canaries=200)
    assert out["epsilon_reported"] is None and out["epsilon_lower_bound"] > 3 and not out["refuted"]


def test_sample_level_runs_and_per_client_budget_lists_are_refused():
    with pytest.raises(ValueError, match="sample-level"):
        audit_client_level(validate_config({
            "name": "s", "data": {"dataset": "digits", "clients": 4}, "model": {"name": "logr"},
            "algorithm": {"name": "dp_fedavg_local"},
            "training": {"rounds": 1, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.1}},
            "privacy": {"unit": "sample", "clip": 1.0, "budgets": 1.0, "delta": 1e-5}}), canaries=10)
    with pytest.raises(ValueError, match="not a list per client"):
        audit_client_level(_central(budgets=[1.0] * 20), canaries=10)


def test_cli_prints_one_json_object_and_writes_audit_json(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(config_to_yaml(_central()))
    code, stdout, err = cli("audit", path, "--canaries", 50, "--json", "--out", tmp_path / "out")
    assert code == 0, err
    out = json.loads(stdout)
    assert {"epsilon_lower_bound", "epsilon_reported", "unit", "canaries", "confidence"} <= set(out)
    assert json.loads((tmp_path / "out" / "audit.json").read_text()) == out
    code, _, err = cli("audit", path, "--canaries", 1)
    assert code == 2 and "--canaries must be >= 2" in err

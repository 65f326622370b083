"""Secure aggregation inside federated runs: FedAvg from the secure sum, distributed noise, config checks."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from dp_accounting import GaussianDpEvent, SelfComposedDpEvent

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.client.program import sgd
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.secure.aggregator import DistributedDPFedAvg, SecureAggregation, SecureFedAvg
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs
from dpfl.experiment.config import ConfigError, validate_config
from dpfl.experiment.federated_run import FederatedRun
from dpfl.privacy.accountant import epsilon
from dpfl.privacy.budgets import ClientBudget

from tests.experiment.test_federated_run import linear_model, toy_federation


def _uploads(k=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(k, 5, 4, generator=g) * 0.3, "b": torch.randn(k, 4, generator=g) * 0.3}


def _global():
    return {"w": torch.zeros(5, 4), "b": torch.ones(4)}


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_secure_fedavg_equals_fedavg(weighting):
    uploads, view = _uploads(), ServerView.simple([10, 20, 30, 40, 50, 60, 70, 80])
    plain = FedAvg(weighting, 0.5).aggregate(_global(), uploads, view, 0, 0)
    secure = SecureFedAvg(SecureAggregation(), weighting, 0.5).aggregate(_global(), uploads, view, 0, 0)
    for name in plain:
        assert torch.allclose(plain[name], secure[name], atol=1e-6)


def test_secure_fedavg_with_dropouts_averages_the_survivors():
    uploads, view = _uploads(), ServerView.simple([1] * 8)
    agg = SecureFedAvg(SecureAggregation(dropout=0.25))
    out, _, metrics = agg.update(None, _global(), uploads, RoundInputs(view, seed=3, round_=2))
    gone = agg.protocol.dropped(list(range(8)), 3, 2)
    assert len(gone) == 2 and metrics["secagg_included"] == 6
    keep = [k for k in range(8) if k not in gone]
    assert torch.allclose(out["w"], uploads["w"][keep].mean(0), atol=1e-6)
    assert torch.allclose(out["b"], 1 + uploads["b"][keep].mean(0), atol=1e-6)


def test_distributed_noise_without_noise_is_central_dp_fedavg():
    uploads, view = _uploads(), ServerView.simple([1] * 8, expected_clients=8.0)
    central = CentralDPFedAvg(0.5, 0.0).aggregate(_global(), uploads, view, 0, 0)
    distributed = DistributedDPFedAvg(0.5, 0.0).aggregate(_global(), uploads, view, 0, 0)
    for name in central:
        assert torch.allclose(central[name], distributed[name], atol=1e-6)


def test_distributed_noise_sums_to_at_least_the_central_noise():
    # d = 40 000 coordinates: the sample variance has relative std sqrt(2/d) = 0.7%, so +-3% is > 4 std.
    k, d, z, clip = 10, 40_000, 2.0, 1.0
    uploads = {"w": torch.zeros(k, d)}
    view = ServerView.simple([1] * k, expected_clients=float(k))
    for dropout, survivors in ((0.0, 10), (0.4, 6)):
        agg = DistributedDPFedAvg(clip, z, protocol=SecureAggregation(dropout=dropout))
        out = agg.aggregate({"w": torch.zeros(d)}, uploads, view, seed=1, round_=0)
        total = out["w"].double() * k  # the revealed sum of the noise shares
        t = 6  # floor(10/2) + 1
        assert agg.share_std(k) == pytest.approx(z * clip / math.sqrt(t))
        assert float(total.mean()) == pytest.approx(0.0, abs=4 * z * math.sqrt(survivors / t) / math.sqrt(d))
        assert float(total.var()) == pytest.approx(survivors / t * z**2 * clip**2, rel=0.03)
        assert survivors / t >= 1  # never less than the central noise


def test_distributed_run_with_everyone_spends_exactly_what_central_spends_and_says_who_it_protects_against():
    data = toy_federation(n_clients=6)
    sel = Selection("all")
    results = []
    for aggregator in (CentralDPFedAvg(0.5, 1.5),
                       DistributedDPFedAvg(0.5, 1.5, protocol=SecureAggregation(dropout=0.25))):
        alg = Algorithm("dp_fedavg_central", sgd(0.1, steps=3), sel, FullUpdate(), aggregator)
        results.append(FederatedRun(data, linear_model(), alg, rounds=3, batch_sizes=10,
                                    budgets=ClientBudget(100.0, 1e-5)).run())
    central, distributed = results
    expected = epsilon(SelfComposedDpEvent(sel.client_level_event(1.5, 6), 3), 1e-5)  # plain Gaussian, no sampling
    assert distributed.spent() == pytest.approx(central.spent())
    assert list(central.spent().values()) == pytest.approx([expected] * 6, rel=1e-9)
    assert "server included" in distributed.privacy.observer and "trusted" in central.privacy.observer
    assert "UNACCOUNTED" in distributed.privacy.extra["secure_aggregation"]["discretisation"]
    assert all(row["secagg_included"] == 5 and row["secagg_dropped"] == 1 for row in distributed.history)


def test_udp_with_secure_aggregation_charges_each_participation_the_gaussian_of_the_sum():
    from dpfl.algorithms.client.udp import ClippedNoisyUpdate

    data = toy_federation(n_clients=6)
    sel = Selection("fixed", k=4)
    t, sigma = 3, 1.2
    alg = Algorithm("udp_fedavg", sgd(0.1, steps=3), sel, ClippedNoisyUpdate(0.5, sigma, cohort=t, secure_sum=True),
                    SecureFedAvg(SecureAggregation(threshold=t)))
    result = FederatedRun(data, linear_model(), alg, rounds=4, batch_sizes=10, budgets=ClientBudget(100.0, 1e-5)).run()
    parts = {c: sum(c in row["selected"] for row in result.history) for c in range(6)}
    for c, p in parts.items():  # one Gaussian at sigma per participation: no amplification against the server
        want = epsilon(SelfComposedDpEvent(GaussianDpEvent(sigma), p), 1e-5) if p else 0.0
        assert result.spent()[c] == pytest.approx(want, rel=1e-9)
    assert "knows who took part" in result.privacy.observer
    assert alg.upload.upload_multiplier == pytest.approx(sigma / math.sqrt(t))  # each share; >= t shares per sum


def _cfg(**over):
    cfg = {"data": {"dataset": "digits", "clients": 10}, "model": {"name": "logr"},
           "algorithm": {"name": "dp_fedavg_central"},
           "training": {"rounds": 2, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.1},
                        "selection": {"kind": "all"}},
           "privacy": {"clip": 1.0, "budgets": 4.0},
           "secure_aggregation": {}}
    for path, value in over.items():
        node = cfg
        *head, last = path.split(".")
        for key in head:
            node = node[key]
        node[last] = value
    return cfg


@pytest.mark.parametrize("over,where", [
    ({"training.selection": {"kind": "poisson", "rate": 0.5}}, "training.selection.kind"),
    ({"training.selection": {"kind": "fixed", "k": 6}}, "training.selection.kind"),  # central: amplification
    ({"secure_aggregation.threshold": 5}, "secure_aggregation.threshold"),
    ({"secure_aggregation.threshold": 11}, "secure_aggregation.threshold"),
    ({"secure_aggregation.dropout": 0.5}, "secure_aggregation.dropout"),
    ({"algorithm": {"name": "pfa"}, "privacy": {"budgets": 4.0, "clip": 1.0}}, "secure_aggregation"),
    ({"algorithm": {"name": "udp_fedavg"}, "training.selection": {"kind": "fixed", "k": 1}}, "training.selection.k"),
    ({"algorithm": {"name": "udp_fedavg"}, "training.selection": {"kind": "poisson", "rate": 0.5}},
     "training.selection.kind"),
    ({"algorithm": {"name": "udp_fedavg"}, "training.selection": {"kind": "poisson", "rate": 0.5},
      "privacy.per_upload_amplification": True}, "privacy.per_upload_amplification"),
])
def test_secure_aggregation_config_errors_name_the_field(over, where):
    with pytest.raises(ConfigError) as err:
        validate_config(_cfg(**over))
    assert where in str(err.value)


def test_secure_fedavg_config_builds_and_runs_like_fedavg(tmp_path):
    from dpfl.experiment.build import build_run

    base = _cfg(**{"algorithm": {"name": "fedavg"}, "privacy": {}})
    plain = dict(base)
    plain.pop("secure_aggregation")
    runs = [build_run(validate_config(c)).run() for c in (base, plain)]
    secure, fedavg = runs
    assert secure.final_accuracy == pytest.approx(fedavg.final_accuracy, abs=1e-9)
    assert "secure_aggregation" in secure.privacy.key_order


NOISY = Path(__file__).resolve().parents[3] / "configs" / "fdp" / "digits_noisy_fedavg.yaml"


def test_noisy_fedavg_with_real_secure_aggregation_matches_the_simulated_aggregate_view():
    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import load_config

    real = load_config(NOISY, ["training.rounds=3", "secure_aggregation={}"])
    assumed = load_config(NOISY, ["training.rounds=3",
                                                                    "privacy.secure_aggregation=true"])
    assert real.privacy.secure_aggregation and real.privacy.observer == "aggregate"
    a, b = build_run(real).run(), build_run(assumed).run()
    assert a.final_accuracy == pytest.approx(b.final_accuracy, abs=1e-9)
    assert a.privacy.extra["fdp"]["mu_max"] == pytest.approx(b.privacy.extra["fdp"]["mu_max"])
    assert "secure_aggregation" in a.privacy.key_order and "secure_aggregation" not in b.privacy.key_order
    with pytest.raises(ConfigError, match="privacy.secure_aggregation"):
        load_config(NOISY, ["secure_aggregation={}",
                                                            "privacy.secure_aggregation=false"])
    with pytest.raises(ConfigError, match="secure_aggregation.dropout"):
        load_config(NOISY, ["secure_aggregation={dropout: 0.2}"])


def test_the_threshold_is_fixed_for_the_run_and_the_noise_share_uses_it():
    from dpfl.experiment.build import build_algorithm

    cfg = validate_config(_cfg(**{"algorithm": {"name": "udp_fedavg"}, "privacy": {"clip": 1.0, "budgets": 4.0,
                                                                                    "noise_multiplier": 2.0}}))
    alg = build_algorithm(cfg)
    assert alg.aggregator.protocol.threshold == 6 and alg.upload.cohort == 6 and alg.upload.secure_sum
    assert alg.upload.upload_multiplier == pytest.approx(2.0 / math.sqrt(6))

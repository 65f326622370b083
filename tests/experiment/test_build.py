"""From config to FederatedRun: the bundles each algorithm/mechanism builds, seeded draws, calibration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from dp_accounting import SelfComposedDpEvent

from dpfl.algorithms.client.param_noise import ParameterNoise
from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.data import DatasetNotFoundError, load_dataset
from dpfl.experiment.build import (
    BATCH_SIZES_STREAM,
    BUDGETS_STREAM,
    build_algorithm,
    build_data,
    build_demo_config,
    build_run,
    resolve_batch_sizes,
    resolve_budgets,
)
from dpfl.experiment.config import ConfigError, apply_overrides, config_to_dict, load_config, validate_config
from dpfl.models import build_model
from dpfl.privacy.accountant import epsilon
from dpfl.privacy.budget_distributions import RHDP_BATCH20, RHDP_EPS20
from dpfl.privacy.budgets import draw_budgets
from dpfl.seeding import numpy_generator

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def variant(*overrides: str, base=None):
    return validate_config(apply_overrides(config_to_dict(base or build_demo_config()), overrides))


@pytest.fixture(scope="module")
def demo_run():
    return build_run(build_demo_config())


def test_demo_yaml_is_build_demo_config():
    assert load_config(CONFIGS / "demo.yaml") == build_demo_config()


def test_demo_builds_the_readme_run(demo_run):
    run = demo_run
    assert run.algorithm.name == "dp_fedavg_local" and run.algorithm.local.private
    assert run.algorithm.local.sampling == "poisson" and run.algorithm.local.spec.clip == 1.0
    assert run.algorithm.local.epochs == 1 and run.algorithm.local.spec.lr == 2.0
    assert run.algorithm.selection == Selection("all") and isinstance(run.algorithm.aggregator, FedAvg)
    assert run.rounds == 30 and run.eval_every == 5 and run.seed == 0 and run.n_clients == 10
    assert run.batch_sizes.tolist() == [32] * 10
    eps = [b.epsilon for b in run.budgets]
    assert set(eps) <= {1.0, 2.0, 4.0, 8.0} and len(set(eps)) > 1
    assert all(b.delta == 1e-5 for b in run.budgets)
    # calibrated per client: a smaller budget buys more noise (up to the clients' slightly different sizes)
    by_budget = {e: [z for z, f in zip(run.noise, eps, strict=True) if f == e] for e in sorted(set(eps))}
    lows, highs = [min(v) for v in by_budget.values()], [max(v) for v in by_budget.values()]
    assert all(lo > hi for lo, hi in zip(lows[:-1], highs[1:], strict=True)) and run.noise.min() > 0


def test_digits_udp_builds_and_runs_two_rounds():
    cfg = load_config(CONFIGS / "digits_udp.yaml", ["training.rounds=2"])
    run = build_run(cfg)
    assert isinstance(run.algorithm.upload, ClippedNoisyUpdate)
    up = run.algorithm.upload
    assert (up.clip, up.cohort) == (1.0, 20) and up.upload_multiplier == pytest.approx(1.0)
    assert run.algorithm.unit == "client" and not run.algorithm.local.private
    result = run.run(checkpoint_every=cfg.checkpoint.every)
    assert len(result.history) == 2 and result.privacy.unit == "client"
    assert all(0 < e <= 40.0 for e in result.spent().values())


def test_draws_are_seeded_and_use_their_own_streams():
    base = variant("training.batch_size={distribution: choice, values: [16, 32, 64, 128]}")
    again = [b.epsilon for b in resolve_budgets(base)], resolve_batch_sizes(base)
    assert again == ([b.epsilon for b in resolve_budgets(base)], resolve_batch_sizes(base))
    other_seed = variant("seed=1", base=base)
    assert [b.epsilon for b in resolve_budgets(other_seed)] != again[0]
    # changing the budget distribution does not move the batch sizes (separate streams)
    other_budgets = variant("privacy.budgets={distribution: uniform, low: 1, high: 10}", base=base)
    assert resolve_batch_sizes(other_budgets) == again[1]
    eps = [b.epsilon for b in resolve_budgets(other_budgets)]
    assert all(1 <= e <= 10 for e in eps) and len(set(eps)) == 10
    assert set(resolve_batch_sizes(base)) <= {16, 32, 64, 128}


def test_budget_forms():
    assert [b.epsilon for b in resolve_budgets(variant("privacy.budgets=3"))] == [3.0] * 10
    listed = variant("privacy.budgets=[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]")
    assert [b.epsilon for b in resolve_budgets(listed)] == [float(i) for i in range(1, 11)]
    fixed = variant("privacy.budgets={distribution: fixed, epsilon: 2.5}", "privacy.delta=1e-6")
    assert {(b.epsilon, b.delta) for b in resolve_budgets(fixed)} == {(2.5, 1e-6)}
    assert resolve_budgets(variant("algorithm.name=fedavg", "privacy={}")) is None


def test_named_budget_distributions_are_drawn_from_the_budget_stream():
    cfg = variant("privacy.budgets={distribution: mixgauss1}")
    eps = [b.epsilon for b in resolve_budgets(cfg)]
    assert max(eps) > 1.0 and min(eps) >= 0.01 and len(eps) == 10
    expected = draw_budgets("MixGauss1", 10, numpy_generator(0, *BUDGETS_STREAM))
    assert eps == expected.tolist() and eps == [b.epsilon for b in resolve_budgets(cfg)]
    assert eps != [b.epsilon for b in resolve_budgets(variant("seed=1", base=cfg))]
    dist = [b.epsilon for b in resolve_budgets(variant("privacy.budgets={distribution: Dist3}"))]
    assert all(0.2 <= e <= 5.0 for e in dist) and len(set(dist)) == 10
    capped = [b.epsilon for b in resolve_budgets(variant("privacy.budgets={distribution: Pareto, pareto_cap: 2}"))]
    assert all(0.5 <= e <= 2.0 for e in capped)
    hdp = load_config(CONFIGS / "hdp_fmnist_mixgauss1.yaml")  # budgets need no data
    assert len(resolve_budgets(hdp)) == 20 and max(b.epsilon for b in resolve_budgets(hdp)) > 1.0


def test_hetero_batch_sizes_are_the_choice_draw():
    hetero = resolve_batch_sizes(variant("training.batch_size=hetero"))
    assert set(hetero) <= {16, 32, 64, 128} and len(hetero) == 10 and len(set(hetero)) > 1
    choice = variant("training.batch_size={distribution: choice, values: [16, 32, 64, 128]}")
    assert hetero == resolve_batch_sizes(choice)
    assert hetero == numpy_generator(0, *BATCH_SIZES_STREAM).choice([16, 32, 64, 128], size=10).tolist()
    # budgets and batch sizes use separate streams
    assert hetero == resolve_batch_sizes(variant("training.batch_size=hetero", "privacy.budgets={distribution: Gauss}"))


def test_rhdp20_lists_build_on_digits():
    cfg = variant("data.clients=20", "privacy.budgets={distribution: rhdp20, dist: Dist5}",
                  "training.batch_size=rhdp20", "privacy.noise_multiplier=5.0")  # explicit (no calibration), affordable
    run = build_run(cfg)
    assert [b.epsilon for b in run.budgets] == list(RHDP_EPS20["Dist5"]) and run.budgets[0].epsilon == 0.95
    assert run.batch_sizes.tolist() == list(RHDP_BATCH20) and run.n_clients == 20


@pytest.mark.parametrize("selection, sampling", [
    ("{kind: all}", "full"), ("{kind: poisson, rate: 0.3}", "poisson"), ("{kind: fixed, k: 4}", "fixed"),
])
def test_central_noise_is_calibrated_for_the_selection_the_run_accounts(selection, sampling):
    cfg = variant("algorithm={name: dp_fedavg_central, params: {server_lr: 0.5}}",
                  "privacy={clip: 0.7, budgets: [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]}",
                  f"training.selection={selection}", "training.rounds=20")
    assert build_algorithm(cfg).aggregator.noise_multiplier is None  # calibrated when the run is built
    run = build_run(cfg)
    alg = run.algorithm
    agg = alg.aggregator
    assert isinstance(agg, CentralDPFedAvg) and (agg.clip, agg.server_lr) == (0.7, 0.5)
    assert run.calibrated is not None and run.calibrated.mechanism == "central" and run.calibrated.common
    assert not alg.local.private and alg.unit == "client" and "trusted" in alg.observer
    event = alg.selection.client_level_event(agg.noise_multiplier, 10)
    expected = {"full": "GaussianDpEvent", "poisson": "PoissonSampledDpEvent",
                "fixed": "SampledWithoutReplacementDpEvent"}[sampling]
    assert type(event).__name__ == expected
    spent = epsilon(SelfComposedDpEvent(event, 20), 1e-5)
    assert 0.99 * 2.0 <= spent <= 2.0  # the smallest budget, exactly spent over the planned rounds
    explicit = variant("privacy.noise_multiplier=3.0", base=cfg)
    assert build_algorithm(explicit).aggregator.noise_multiplier == 3.0


def test_other_bundles():
    noisy = variant("algorithm={name: noisy_fedavg, params: {std: 0.01, schedule: cyclic}}", "privacy={clip: 0.5}",
                    "training.local_steps=3", "training.local_epochs=null")
    alg = build_algorithm(noisy)
    assert isinstance(alg.upload, ParameterNoise) and alg.upload.std == 0.01 and alg.accounted
    assert alg.aggregator == FedAvg("uniform", 1.0) and not alg.local.private and alg.local.spec.clip == 0.5
    assert alg.local.step_sizes[4] == pytest.approx((2.0, 1.0, 2.0 / 3))  # cyclic η/(k+1) from lr 2.0
    assert all(b.epsilon == float("inf") for b in resolve_budgets(noisy))  # σ given: nothing to stop on

    prox = variant("algorithm={name: fedprox, params: {mu: 0.1}}", "training.optimizer.momentum=0.5")
    alg = build_algorithm(prox)
    assert alg.name == "fedprox" and alg.local.private and alg.local.spec.prox_mu == 0.1
    assert alg.local.spec.momentum == 0.5 and isinstance(alg.upload, FullUpdate)
    plain = build_algorithm(variant("algorithm={name: fedprox, params: {mu: 0.1}}", "privacy={}",
                                    "training.local_steps=3", "training.local_epochs=null"))
    assert not plain.local.private and plain.local.steps == 3 and plain.unit is None

    fixed = build_algorithm(variant("privacy.sampling=fixed", "training.selection={kind: fixed, k: 5}"))
    assert fixed.local.sampling == "fixed" and fixed.selection == Selection("fixed", k=5)


def test_build_problems_are_one_line_config_errors():
    with pytest.raises(ConfigError, match=r"^model: model 'cnn_pfa' cannot take input shape \(1, 8, 8\)") as info:
        build_run(variant("model.name=cnn_pfa"))
    assert len(str(info.value).splitlines()) == 1
    with pytest.raises(ConfigError, match=r"^data: .*root"):
        build_run(variant("data.root=/tmp"))


def _fmnist_available() -> bool:
    try:
        load_dataset("fashion_mnist", download=False)
    except DatasetNotFoundError:
        return False
    return True


@pytest.mark.needs_fmnist
@pytest.mark.parametrize("name", ["fmnist_dpsgd", "fmnist_central", "hdp_fmnist_mixgauss1"])
def test_fmnist_configs_data_and_model_fit(name, monkeypatch):
    """Data and model only: the full build calibrates 20 clients' noise (~30 s), too slow for the suite."""
    monkeypatch.setenv("DPFL_OFFLINE", "1")
    if not _fmnist_available():
        pytest.skip("Fashion-MNIST is not on this machine")
    cfg = load_config(CONFIGS / f"{name}.yaml", ["data.max_train_samples=2000"])
    data = build_data(cfg)
    assert data.n_clients == cfg.data.clients and tuple(data.input_shape) == (1, 28, 28)
    build_model(cfg.model.name, data.input_shape, data.n_classes, seed=cfg.seed, **cfg.model.options)


@pytest.mark.integration  # was `slow` (the demo's 30 rounds); ~2 s today
def test_demo_learns_within_budgets(demo_run):
    result = demo_run.run()
    assert result.final_accuracy > 0.6  # ~0.8 observed; chance is 0.1
    assert all(result.spent()[i] <= b.epsilon for i, b in enumerate(demo_run.budgets))


# ---- heterogeneous-budget baselines (spec heterogeneous_dp §4.1, §4.5, §6) -----------------------------
HDP = ("data.clients=4", "privacy.budgets=[1.0,2.0,4.0,8.0]", "training.rounds=2", "training.local_epochs=null",
       "training.local_steps=2")


@pytest.mark.parametrize("name, aggregator, target", [
    ("weiavg", "epsilon", "own"), ("min_eps", "uniform", "min"), ("oracle", None, "own"),
])
def test_hdp_baselines_build_with_their_aggregator_and_calibration_target(name, aggregator, target):
    run = build_run(variant(*HDP, f"algorithm.name={name}", "algorithm.params={}"))
    assert run.calibrate_to == target
    if aggregator is None:
        assert run.algorithm.aggregator.privileged
    else:
        assert run.algorithm.aggregator.weighting == aggregator


def test_max_eps_must_be_allowed_explicitly_and_is_tagged():
    with pytest.raises(ConfigError, match="privacy.allow_budget_violation"):
        variant(*HDP, "algorithm.name=max_eps", "algorithm.params={}")
    run = build_run(variant(*HDP, "algorithm.name=max_eps", "algorithm.params={epsilon: 10.0}",
                            "privacy.allow_budget_violation=true"))
    assert run.calibrate_to == 10.0
    assert not run.run().privacy.meets_budgets


def test_misreport_and_heuristic_options():
    run = build_run(variant(*HDP, "algorithm.name=weiavg", "algorithm.params={}",
                            "privacy.misreport={client: 1, factor: 10}", "privacy.calibration=pfa-heuristic"))
    assert list(run.eps_reported) == [1.0, 20.0, 4.0, 8.0]
    assert run.calibration == "pfa-heuristic"
    with pytest.raises(ConfigError, match="privacy.misreport.client"):
        variant(*HDP, "privacy.misreport={client: 4}")
    with pytest.raises(ConfigError, match="privacy.calibration"):
        variant(*HDP, "privacy.calibration=pfa-heuristic", "privacy.noise_multiplier=1.0")


def test_pfa_runs_from_a_config_with_its_split_fitted_over_the_population():
    cfg = variant(*HDP, "algorithm.name=pfa", "algorithm.params={public_fraction: 0.25, k: 1}")
    run = build_run(cfg)
    assert run.algorithm.aggregator.public_clients == (3,)  # the largest reported epsilon (8.0)
    result = run.run()
    assert result.stop_reason == "rounds" and len(result.history) == 2
    assert result.history[-1]["weights"] == pytest.approx([1 / 15, 2 / 15, 4 / 15, 8 / 15])
    # a liar reporting 10x becomes the public client
    liar = build_run(variant(*HDP, "algorithm.name=pfa", "algorithm.params={public_fraction: 0.25}",
                             "privacy.misreport={client: 0, factor: 10}"))
    assert liar.algorithm.aggregator.public_clients == (0,)


def test_pfa_rounds_are_redrawn_until_they_contain_a_public_client():
    cfg = variant(*HDP, "algorithm.name=pfa", "algorithm.params={split: explicit, public_clients: [3]}",
                  "training.selection={kind: fixed, k: 2}", "training.rounds=6")
    run = build_run(cfg)
    result = run.run()
    assert result.stop_reason == "rounds" and len(result.history) == 6
    assert all(3 in row["selected"] for row in result.history)
    first_draws = [run.algorithm.selection.select(np.arange(4), cfg.seed, r) for r in range(6)]
    assert any(3 not in d for d in first_draws)  # some round really was re-drawn
    for r, row in enumerate(result.history):  # and only the accepted draw was charged
        for c in range(4):
            charged = any(rr == r for rr, *_ in result.ledger.history(c))
            assert charged == (c in row["selected"])


def test_pfa_stops_with_no_public_when_the_public_clients_are_out_of_budget():
    cfg = variant(*HDP, "algorithm.name=pfa", "algorithm.params={split: explicit, public_clients: [0]}",
                  "privacy.budgets=[1.0,50.0,50.0,50.0]", "privacy.noise_multiplier=2.0", "training.rounds=20")
    result = build_run(cfg).run()
    assert result.stop_reason == "no_public"
    assert 1 <= len(result.history) < 20
    assert result.spent()[0] <= 1.0


def test_robust_hdp_runs_from_a_config_and_ignores_reported_budgets():
    honest = build_run(variant(*HDP, "algorithm.name=robust_hdp", "algorithm.params={}")).run()
    lying = build_run(variant(*HDP, "algorithm.name=robust_hdp", "algorithm.params={}",
                              "privacy.misreport={client: 0, factor: 10}")).run()
    assert honest.stop_reason == "rounds" and sum(honest.history[-1]["weights"]) == pytest.approx(1.0)
    assert all(torch.equal(honest.params[n], lying.params[n]) for n in honest.params)


def test_pfa_plus_runs_from_a_config_with_per_client_bytes():
    cfg = variant(*HDP, "algorithm.name=pfa_plus", "algorithm.params={k: 1}", "training.rounds=3",
                  "model.name=logr", "data.client_test_fraction=0.2")
    result = build_run(cfg).run()
    p = sum(t.numel() for t in result.params.values())  # logr on the demo digits: 2 tensors
    first, later = result.history[0], result.history[1:]
    assert first["traffic"]["warmup"] and first["bytes_up"] == [4 * p] * 4
    for row in later:
        assert not row["traffic"]["warmup"]
        # top_fraction of 4 clients: 1 public (the largest epsilon, client 3), 3 private sending 2 floats
        assert row["bytes_up"] == [8, 8, 8, 4 * p]
        assert row["bytes_down"] == [4 * p + 4 * (p + p)] * 3 + [4 * p]
        assert row["uplink_bytes"] == sum(row["bytes_up"]) and row["traffic"]["uplink_bytes_codes"] == 24
        assert "noise_stat_analytic" not in row  # the projection is not a weighted sum of noisy updates
    assert 0 <= result.history[-1]["test_acc_clients_mean"] <= 1
    assert len(result.history[-1]["test_acc_clients"]) == 4


def test_validation_accuracy_is_the_global_model_on_the_union_of_validation_splits(tmp_path):
    """data.client_val_fraction adds val_accuracy at evaluated rounds (what searches select on) and
    summary.json's final_val_accuracy; without it neither appears."""
    from dpfl.engine.evaluation import evaluate
    from dpfl.experiment.run_directory import execute
    from dpfl.results.run_files import read_summary

    cfg = variant("data.client_test_fraction=0.1", "data.client_val_fraction=0.2", "training.rounds=2",
                  "evaluation.every=1")
    run = build_run(cfg)
    result = run.run()
    x = torch.cat([c.x_val for c in run.data.clients])
    y = torch.cat([c.y_val for c in run.data.clients])
    assert len(x) == sum(c.n_val for c in run.data.clients) > 0
    run.model.eval()
    acc, loss = evaluate(run.model, result.params, x, y, run.algorithm.local.spec.loss)
    assert (result.history[-1]["val_accuracy"], result.history[-1]["val_loss"]) == (acc, loss)
    assert all("val_accuracy" in row for row in result.history)
    summary = execute(cfg, tmp_path / "run")
    assert summary["final_val_accuracy"] == acc == read_summary(tmp_path / "run")["final_val_accuracy"]
    plain = build_run(variant("training.rounds=1")).run()
    assert "val_accuracy" not in plain.history[-1]


def test_client_val_fraction_is_validated_with_the_test_fraction():
    with pytest.raises(ConfigError, match="client_val_fraction"):
        variant("data.client_test_fraction=0.5", "data.client_val_fraction=0.5")

"""The round loop end to end: per-client budgets, exact budget stops, ledgers, accuracy."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from dp_accounting import SelfComposedDpEvent
from torch import nn

from dpfl.algorithms.algorithm import Algorithm, central_dp_fedavg, fedavg
from dpfl.algorithms.client.param_noise import ParameterNoise
from dpfl.algorithms.client.program import dpsgd, sgd
from dpfl.algorithms.selection import Selection
from dpfl.data import federated_dataset, load_dataset
from dpfl.data.errors import DatasetNotFoundError
from dpfl.experiment.federated_run import FederatedRun
from dpfl.privacy.budgets import ClientBudget
from dpfl.models import build_model
from dpfl.privacy.accountant import epsilon
from dpfl.privacy.events import dpsgd_event


def toy_federation(n_clients=4, n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(16, 3, generator=g)
    clients = []
    for _ in range(n_clients):
        x = torch.randn(n, 16, generator=g)
        clients.append(SimpleNamespace(x_train=x, y_train=(x @ w_true).argmax(1)))
    xt = torch.randn(200, 16, generator=g)
    return SimpleNamespace(clients=clients, x_test=xt, y_test=(xt @ w_true).argmax(1))


def linear_model():
    torch.manual_seed(0)
    return nn.Linear(16, 3)


def test_run_stops_exactly_when_the_next_round_would_exceed_each_budget():
    """Client budgets chosen between the epsilon after k and after k+1 rounds: each client trains
    exactly k rounds, then is retired; the run ends when nobody is left."""
    data = toy_federation()
    program = dpsgd(0.1, 1.0, steps=5)
    z = 1.2
    per_round = dpsgd_event(z, 5, sampling="poisson", sample_rate=8 / 60)
    eps_after = [epsilon(SelfComposedDpEvent(per_round, k), 1e-5) for k in range(1, 8)]
    fits = [1, 3, 3, 5]  # rounds each client can afford
    budgets = [ClientBudget((eps_after[k - 1] + eps_after[k]) / 2, 1e-5) for k in fits]
    run = FederatedRun(data, linear_model(), fedavg(program), rounds=10, batch_sizes=8, budgets=budgets,
                       noise_multipliers=z)
    result = run.run()
    assert result.stop_reason == "budget"
    assert len(result.history) == max(fits)
    for c, k in enumerate(fits):
        rounds_in = [row["round"] for row in result.history if c in row["selected"]]
        assert rounds_in == list(range(1, k + 1))
        assert result.spent()[c] == pytest.approx(eps_after[k - 1], rel=1e-9)
        assert result.spent()[c] <= budgets[c].epsilon


def test_calibrated_full_participation_spends_each_budget_by_the_last_round():
    data = toy_federation()
    budgets = [ClientBudget(e, 1e-5) for e in (0.5, 1.0, 2.0, 8.0)]
    run = FederatedRun(data, linear_model(), fedavg(dpsgd(0.1, 1.0, steps=4)), rounds=6, batch_sizes=[8, 8, 12, 4],
                       budgets=budgets, seed=3)
    result = run.run()
    assert result.stop_reason == "rounds" and len(result.history) == 6
    spent = result.spent()
    for c, b in enumerate(budgets):
        assert (1 - 1e-2) * b.epsilon <= spent[c] <= b.epsilon
    assert len(set(np.round(run.noise, 6))) == 4  # each budget bought its own noise
    assert result.history[-1]["epsilon"] == [spent[c] for c in range(4)]
    assert all(row["epsilon_max"] <= 8.0 for row in result.history)


def test_central_dp_fedavg_charges_every_client_in_the_population_each_round():
    data = toy_federation(n_clients=6)
    sel = Selection("poisson", rate=0.5)
    alg = central_dp_fedavg(sgd(0.1, steps=3), clip=0.5, noise_multiplier=1.5, selection=sel)
    run = FederatedRun(data, linear_model(), alg, rounds=4, batch_sizes=10, budgets=ClientBudget(100.0, 1e-5))
    result = run.run()
    expected = epsilon(SelfComposedDpEvent(sel.client_level_event(1.5, 6), 4), 1e-5)
    for c in range(6):
        assert result.spent()[c] == pytest.approx(expected, rel=1e-9)
    assert result.privacy["unit"] == "client" and "trusted" in result.privacy["observer"]


def test_unaccounted_mechanism_reports_no_epsilon():
    data = toy_federation()
    alg = Algorithm("noisy_fedavg", sgd(0.1, steps=2), upload=ParameterNoise(0.01))
    result = FederatedRun(data, linear_model(), alg, rounds=2, batch_sizes=8, budgets=ClientBudget(1.0, 1e-5)).run()
    assert result.ledger is None and "epsilon" not in result.history[-1]
    assert "no guarantee" in result.privacy["warning"]


def test_private_run_without_budgets_is_refused():
    with pytest.raises(ValueError, match="give budgets"):
        FederatedRun(toy_federation(), linear_model(), fedavg(dpsgd(0.1, 1.0, steps=2)), rounds=2, batch_sizes=8)


def test_same_seed_same_run():
    def once():
        run = FederatedRun(toy_federation(), linear_model(), fedavg(dpsgd(0.1, 1.0, steps=3), Selection("fixed", k=2)),
                           rounds=3, batch_sizes=8, budgets=ClientBudget(4.0, 1e-5), seed=5)
        return run.run()

    a, b = once(), once()
    assert [r["selected"] for r in a.history] == [r["selected"] for r in b.history]
    for n in a.params:
        assert torch.equal(a.params[n], b.params[n])


def _fmnist_or_digits():
    try:
        load_dataset("fashion_mnist")
        return "fashion_mnist"
    except DatasetNotFoundError:
        return "digits"


def test_end_to_end_heterogeneous_budgets_reach_sensible_accuracy():
    """20 clients, budgets drawn per client, DP-SGD with per-client calibrated noise: the model learns
    (far above the 10% chance level) and no client spends more than its budget."""
    name = _fmnist_or_digits()
    opts = {"max_train_samples": 12000} if name == "fashion_mnist" else {}
    data = federated_dataset(name, n_clients=20, seed=0, **opts)
    rng = np.random.default_rng(0)
    budgets = [ClientBudget(float(e), 1e-5) for e in rng.choice([1.0, 2.0, 5.0], size=20)]
    model = build_model("logr", data.input_shape, data.n_classes, seed=0)
    run = FederatedRun(data, model, fedavg(dpsgd(lr=1.0, clip=1.0, steps=10)), rounds=6, batch_sizes=64,
                       budgets=budgets, seed=0, eval_every=3)
    result = run.run()
    spent = result.spent()
    assert all(spent[c] <= budgets[c].epsilon for c in range(20))
    assert all(spent[c] > 0.9 * budgets[c].epsilon for c in range(20))  # calibrated to use the budget
    assert result.final_accuracy > 0.6, result.final_accuracy  # chance: 0.1; ~0.7 observed on both datasets


def test_unlimited_budget_needs_explicit_noise():
    budgets = [ClientBudget(float("inf"), 1e-5)] + [ClientBudget(1.0, 1e-5)] * 3
    with pytest.raises(ValueError, match=r"clients \[0\] have unlimited budgets"):
        FederatedRun(toy_federation(), linear_model(), fedavg(dpsgd(0.1, 1.0, steps=2)), rounds=2, batch_sizes=8,
                     budgets=budgets)
    run = FederatedRun(toy_federation(), linear_model(), fedavg(dpsgd(0.1, 1.0, steps=2)), rounds=2, batch_sizes=8,
                       budgets=budgets, noise_multipliers=1.0)
    assert run.run().spent()[0] > 0


def test_model_and_program_losses_must_agree():
    model = build_model("relu_mlp", (16,), 3, seed=0)
    with pytest.raises(ValueError, match="loss 'mse_onehot'"):
        FederatedRun(toy_federation(), model, fedavg(sgd(0.1, steps=2)), rounds=1, batch_sizes=8)


def _without_time(history):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in history]


@pytest.mark.parametrize("central", [False, True])
def test_resuming_from_a_checkpoint_reproduces_the_uninterrupted_run(central):
    def make():
        if central:
            alg = central_dp_fedavg(sgd(0.1, steps=3), clip=0.5, noise_multiplier=1.0, selection=Selection("poisson", rate=0.5))
        else:
            alg = fedavg(dpsgd(0.1, 1.0, steps=3), Selection("fixed", k=2))
        return FederatedRun(toy_federation(), linear_model(), alg, rounds=6, batch_sizes=8,
                            budgets=[ClientBudget(e, 1e-5) for e in (2.0, 3.0, 4.0, 30.0)], seed=7)

    states = []
    full = make().run(on_checkpoint=states.append, checkpoint_every=2)
    assert [s.round for s in states] == [2, 4, len(full.history)]


    mid = states[0].to_dict()
    resumed = make().run(state=type(states[0]).from_dict(mid))
    assert _without_time(resumed.history) == _without_time(full.history)
    assert resumed.stop_reason == full.stop_reason
    assert resumed.spent() == full.spent()
    for n in full.params:
        assert torch.equal(resumed.params[n], full.params[n])

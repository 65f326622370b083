"""The round loop end to end: per-client budgets, exact budget stops, ledgers, accuracy."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from dp_accounting import SelfComposedDpEvent
from torch import nn

from dpfl.algorithms.algorithm import Algorithm, central_dp_fedavg, fedavg
from dpfl.algorithms.client.program import dpsgd, sgd
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.oracle import OracleAverage
from dpfl.algorithms.server.pfa_plus import PFAPlus
from dpfl.algorithms.server.robust_hdp import RobustHDP
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.data import federated_dataset, load_dataset
from dpfl.data.errors import DatasetNotFoundError
from dpfl.experiment.federated_run import FederatedRun
from dpfl.privacy.budgets import ClientBudget
from dpfl.models import build_model
from dpfl.privacy.accountant import epsilon
from dpfl.privacy.events import dpsgd_event
from unaccounted_stage import UnaccountedNoise
from untimed import untimed


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
    assert result.privacy.unit == "client" and "trusted" in result.privacy.observer


def test_unaccounted_mechanism_reports_no_epsilon():
    data = toy_federation()
    alg = Algorithm("noisy", sgd(0.1, steps=2), upload=UnaccountedNoise(0.01))
    result = FederatedRun(data, linear_model(), alg, rounds=2, batch_sizes=8, budgets=ClientBudget(1.0, 1e-5)).run()
    assert result.ledger is None and "epsilon" not in result.history[-1]
    assert "no guarantee" in result.privacy.warning


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


def test_param_norm_is_the_global_models_norm_and_the_noise_walk_shows_in_it():
    """Every round logs the global model's L2 norm; the last one is the final parameters'. The noise adds a random
    walk to the mean of 4 clients' models: after 150 steps of lr 0.1 on 51 parameters its norm is
    sqrt(150 x 51) x 0.1 x z C / (b sqrt(4)) = 0.27 at z = 0.5 and 10.9 at z = 20, beside the ~2.2 the weights reach
    without noise, so the two runs should end near 2.3 and 11 (measured: 2.27 and 10.5). A ratio above 3 leaves room
    for the walk's own spread (its squared norm over 51 coordinates varies by about 20%)."""
    histories = []
    for z in (0.5, 20.0):
        budgets = [ClientBudget(float("inf"), 1e-5)] * 4
        run = FederatedRun(toy_federation(), linear_model(), fedavg(dpsgd(0.1, 1.0, steps=5)), rounds=30,
                           batch_sizes=8, budgets=budgets, noise_multipliers=z)
        result = run.run()
        norms = [row["param_norm"] for row in result.history]
        assert len(norms) == 30
        final = float(torch.sqrt(sum(t.double().pow(2).sum() for t in result.params.values())))
        assert norms[-1] == pytest.approx(final, rel=1e-6)
        histories.append(norms)
    assert histories[1][-1] > 3 * histories[0][-1]


def test_model_and_program_losses_must_agree():
    model = build_model("relu_mlp", (16,), 3, seed=0)
    with pytest.raises(ValueError, match="loss 'mse_onehot'"):
        FederatedRun(toy_federation(), model, fedavg(sgd(0.1, steps=2)), rounds=1, batch_sizes=8)


def _without_time(history):
    return untimed(history)


@pytest.mark.parametrize("kind", ["local", "central", "pfa_plus", "robust_hdp_once"])
def test_resuming_from_a_checkpoint_reproduces_the_uninterrupted_run(kind):
    def make():
        if kind == "central":
            alg = central_dp_fedavg(sgd(0.1, steps=3), clip=0.5, noise_multiplier=1.0,
                                    selection=Selection("poisson", rate=0.5))
        elif kind == "pfa_plus":  # stateful: the previous round's subspace is in the checkpoint
            alg = Algorithm("pfa_plus", dpsgd(0.1, 1.0, steps=3), Selection("fixed", k=3), FullUpdate(), PFAPlus())
        elif kind == "robust_hdp_once":  # stateful: the round-1 weights are in the checkpoint
            alg = Algorithm("robust_hdp", dpsgd(0.1, 1.0, steps=3), Selection(), FullUpdate(),
                            RobustHDP(schedule="once"))
        else:
            alg = fedavg(dpsgd(0.1, 1.0, steps=3), Selection("fixed", k=2))
        return FederatedRun(toy_federation(), linear_model(), alg, rounds=6, batch_sizes=8,
                            budgets=[ClientBudget(e, 1e-5) for e in (2.0, 3.0, 4.0, 30.0)], seed=7)

    states = []
    full = make().run(on_checkpoint=states.append, checkpoint_every=2)
    assert [s.round for s in states] == [2, 4, len(full.history)]


    if kind == "pfa_plus":
        assert [row["traffic"]["warmup"] for row in full.history][:2] == [True, False]
    if kind == "robust_hdp_once":  # the robust PCA's diagnostics reach the metrics
        assert full.history[0]["pcp_iterations"][0] > 0 and full.history[0]["pcp_converged"]
        assert full.history[1]["pcp_reused"] and "pcp_iterations" not in full.history[1]
    mid = states[0].to_dict()
    resumed = make().run(state=type(states[0]).from_dict(mid))
    assert _without_time(resumed.history) == _without_time(full.history)
    assert resumed.stop_reason == full.stop_reason
    assert resumed.spent() == full.spent()
    for n in full.params:
        assert torch.equal(resumed.params[n], full.params[n])
    if kind == "robust_hdp_once":  # a checkpoint written before the state kept the round's weights ("last")
        old = type(states[0]).from_dict({**mid, "aggregator_state": {"once": mid["aggregator_state"]["once"]}})
        assert _without_time(make().run(state=old).history) == _without_time(full.history)
    forgetful = type(states[0]).from_dict({**mid, "ledger": None})  # what the clients spent must not be lost
    with pytest.raises(ValueError, match="has no privacy ledger but this run is accounted"):
        make().run(state=forgetful)


def _hetero_run(**kw):
    budgets = [ClientBudget(e, 1e-5) for e in (1.0, 2.0, 4.0, 8.0)]
    weighting = kw.pop("weighting", "uniform")
    return FederatedRun(toy_federation(), linear_model(), fedavg(dpsgd(0.1, 1.0, steps=3), weighting=weighting),
                        rounds=2, batch_sizes=8, budgets=budgets, seed=1, **kw)


def test_weiavg_weights_follow_reported_epsilons_and_a_liar_gets_more_weight():
    honest = _hetero_run(weighting="epsilon").run()
    assert honest.history[0]["weights"] == pytest.approx([1 / 15, 2 / 15, 4 / 15, 8 / 15])
    lying = _hetero_run(weighting="epsilon", misreport={0: 10.0}).run()
    assert lying.history[0]["weights"] == pytest.approx([10 / 24, 2 / 24, 4 / 24, 8 / 24])
    # the liar's noise and spent epsilon are those of its true budget
    assert lying.spent() == honest.spent()
    assert lying.privacy.clients[0].epsilon_reported == 10.0
    # FedAvg ignores the reports entirely: bit-identical models with and without the lie
    a, b = _hetero_run().run(), _hetero_run(misreport={0: 10.0}).run()
    assert all(torch.equal(a.params[n], b.params[n]) for n in a.params)


def test_minimum_epsilon_target_meets_every_budget():
    run = _hetero_run(calibrate_to="min")
    assert len(set(np.round(run.noise, 9))) == 1  # everyone the same noise
    result = run.run()
    assert result.privacy.meets_budgets and result.privacy.calibrated_to == "min"
    assert max(result.spent().values()) <= 1.0


def test_maximum_epsilon_target_is_refused_unless_labelled_non_private():
    with pytest.raises(ValueError, match="allow_budget_violation"):
        _hetero_run(calibrate_to="max")
    result = _hetero_run(calibrate_to="max", allow_budget_violation=True).run()
    assert not result.privacy.meets_budgets
    assert "NOT PRIVATE AS PROMISED" in result.privacy.warning
    assert result.spent()[0] > 1.0  # reported truthfully, above the budget
    assert result.spent()[3] <= 8.0


def test_noise_statistics_are_logged_and_the_oracle_minimises_the_analytic_one():
    """Oracle weights ∝ 1/σ_i² minimise Σ w_i² σ_i²: its analytic noise statistic is below WeiAvg's and
    FedAvg's, and equals 1 / Σ (1/σ_i²) normalised."""
    rows = {}
    for name, weighting in (("fedavg", "uniform"), ("weiavg", "epsilon")):
        rows[name] = _hetero_run(weighting=weighting).run().history[0]
    run = _hetero_run()
    oracle_alg = Algorithm("oracle", run.algorithm.local, run.algorithm.selection, aggregator=OracleAverage())
    oracle_run = FederatedRun(toy_federation(), linear_model(), oracle_alg, rounds=2, batch_sizes=8,
                              budgets=run.budgets.tolist(), seed=1)
    oracle_result = oracle_run.run()
    assert oracle_result.privacy.oracle and not _hetero_run().run().privacy.oracle
    rows["oracle"] = oracle_result.history[0]
    for row in rows.values():
        assert row["noise_stat_empirical"] > 0 and len(row["weights"]) == 4
    assert rows["oracle"]["noise_stat_analytic"] < rows["weiavg"]["noise_stat_analytic"]
    assert rows["oracle"]["noise_stat_analytic"] < rows["fedavg"]["noise_stat_analytic"]
    sigma2 = 3 * 1.0 * np.asarray(oracle_run.noise) ** 2 / 8**2  # T C^2 z^2 / b^2 per client (p eta^2 cancels)
    assert rows["oracle"]["noise_stat_analytic"] == pytest.approx(1 / np.sum(1 / sigma2), rel=1e-6)
    assert rows["oracle"]["weights"] == pytest.approx(list((1 / sigma2) / np.sum(1 / sigma2)), rel=1e-5)


def test_privileged_channel_is_never_given_to_a_normal_aggregator():
    from dpfl.algorithms.server.view import ServerView

    with pytest.raises(TypeError):
        FedAvg().aggregate({"w": torch.zeros(1)}, {"w": torch.zeros(1, 1)}, ServerView.simple([1]), 0, 0, channel=None)
    with pytest.raises(ValueError, match="privileged"):
        OracleAverage().weights(ServerView.simple([1]))


def test_pfa_heuristic_calibration_is_labelled_and_reports_the_real_epsilon():
    """Heuristic mode: noise from PFA's formula, each client stops after its T* steps, and privacy.json
    carries the accountant's epsilon of that noise next to the heuristic's claim."""
    run = _hetero_run(calibration="pfa-heuristic")
    for i, b in enumerate((1.0, 2.0, 4.0, 8.0)):  # T* = 2 rounds x 3 steps, q = 8/60
        assert run.noise[i] == pytest.approx(10 * (8 / 60) * np.sqrt(6 * np.log10(1e5)) / b)
    result = run.run()
    assert len(result.history) == 2 and result.stop_reason == "rounds"
    assert "NOT a DP guarantee" in result.privacy.heuristic
    for c, b in zip(result.privacy.clients, (1.0, 2.0, 4.0, 8.0), strict=True):
        assert c.epsilon_heuristic == pytest.approx(b)
        expected = epsilon(SelfComposedDpEvent(dpsgd_event(c.noise_multiplier, 3, sampling="poisson",
                                                           sample_rate=8 / 60), 2), 1e-5)
        assert c.epsilon_spent == pytest.approx(expected, rel=1e-9)
    assert result.privacy.meets_budgets == all(c.epsilon_spent <= c.epsilon_budget for c in result.privacy.clients)


def test_remote_clients_may_not_take_more_local_steps_than_the_ledger_charged():
    """A Flower federation's nodes report their local steps; the ledger charged the planned ones, so a node that
    took more (a config it did not get from the server, a patched program) would spend privacy nobody recorded."""
    import numpy as np

    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import load_config
    from dpfl.experiment.federated_run import RemoteRound

    class Nodes:  # zero updates, the steps the test chooses: only the bookkeeping is under test
        def __init__(self, extra: int) -> None:
            self.extra = extra

        def round(self, run, r, w, ids):
            planned = [run.algorithm.local.steps_for(int(run.n_records[i]), int(run.batch_sizes[i])) for i in ids]
            uploads = {n: torch.zeros((len(ids), *t.shape), dtype=t.dtype) for n, t in w.items()}
            steps = [p + self.extra * (i == ids[-1]) for i, p in zip(ids, planned, strict=True)]
            return RemoteRound(uploads, steps, None)

    def run(extra: int):
        fed = build_run(load_config("configs/demo.yaml", ["training.rounds=2", "data.clients=4"]))
        fed.remote_clients = Nodes(extra)
        return fed.run()

    assert np.isfinite(run(0).privacy.clients[0].epsilon_spent)
    assert run(-1).stop_reason == "rounds"  # fewer steps than charged: conservative, allowed
    with pytest.raises(ValueError, match=r"more local steps than the ledger charged \(\(client, reported, planned\): "
                                         r"\[\(3, "):
        run(1)

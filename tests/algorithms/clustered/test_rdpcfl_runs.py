"""R-DPCFL and its clustered baselines in the round loop (clustered_dpfl.md §5-§6; required tests 5, 7, 8)."""

import copy
from dataclasses import replace

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.client.program import dpsgd
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.clustered.aggregator import ClusteredAggregator
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs
from dpfl.data.builtin import make_classification
from dpfl.data.clustered import clustered_split
from dpfl.experiment.federated_run import FederatedRun
from dpfl.models import build_model
from dpfl.privacy import two_stage as ts
from dpfl.privacy.budgets import ClientBudget

E, B, EPS, DELTA, N = 20, 32, 10.0, 1e-4, 500


@pytest.fixture(scope="module")
def blobs():
    return make_classification(n_samples=8000, n_features=20, n_classes=10, seed=0)


def same_partition(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return {frozenset(np.flatnonzero(a == k)) for k in set(a)} == {frozenset(np.flatnonzero(b == k)) for k in set(b)}


def rdpcfl_run(blobs, seed, *, rounds=E, strategy="rdpcfl", **agg):
    """Spec test 5's setting: 10-class blobs in d = 20, label flip, M = 3, sizes [2, 4, 4], N_i = 500, softmax
    regression, b = 32, c = 1, eps_total = 10 (two-stage plan; IFCA and fixed clusters: single stage)."""
    data = clustered_split(blobs, 10, 3, shift="label_flip", minority_ratio=0.2, n_train_per_client=N, seed=seed)
    two = strategy == "rdpcfl"
    plan = ts.plan(EPS, DELTA, N, B, 1, rounds, round1_batch="full" if two else None, selections=strategy != "fixed")
    local = dpsgd(0.1, 1.0, epochs=1, sampling="poisson")
    if two:
        local = replace(local, round1_batch="full")
    aggregator = ClusteredAggregator(strategy, 10, rounds, seed=seed, eps_sel=plan.eps_sel, **agg)
    run = FederatedRun(data, build_model("logr", data.input_shape, 10, seed=seed),
                       Algorithm(strategy, local, Selection("all"), aggregator=aggregator), rounds=rounds,
                       batch_sizes=B, budgets=ClientBudget(EPS, DELTA), noise_multipliers=plan.noise_multiplier,
                       seed=seed, eval_every=5)
    return run, run.run(), plan, data


@pytest.mark.parametrize("seed", range(4))
def test_rdpcfl_recovers_the_planted_clusters_and_the_minority(blobs, seed):
    run, result, plan, data = rdpcfl_run(blobs, seed)
    truth = data.info["true_cluster"]
    facts = result.states.server["facts"]
    assert facts["n_clusters"] == 3  # chosen by MSS among 2..8
    assert same_partition(facts["round1_clusters"], truth)
    final = result.history[-1]["clusters"]
    assert same_partition(final, truth)
    minority = {i for i, t in enumerate(truth) if t == 0}
    assert any({i for i, m in enumerate(final) if m == k} == minority for k in set(final))
    assert facts["selections_made"] == plan.n_sel == 3
    spent = result.ledger.spent_all()
    assert max(spent.values()) <= EPS and max(spent.values()) == pytest.approx(plan.planned_epsilon, rel=1e-9)
    assert result.history[-1]["acc_personal"] > 0.8 and "acc_personal_minority" in result.history[-1]


def test_round_1_is_full_batch_dpsgd_and_the_ledger_is_the_two_stage_plan(blobs):
    run, result, plan, _ = rdpcfl_run(blobs, 0, rounds=6)
    entries = result.ledger.entries(0)
    first = [e.event for e in entries if e.round == 0]
    z = plan.noise_multiplier
    assert first[0] == dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(1.0, dpa.GaussianDpEvent(z)), 1)  # q = 1, K
    assert (run.algorithm.local.plan(0, N, B, z, 0).batch_size == N
            and run.algorithm.local.plan(0, N, B, z, 0).steps == 1)
    assert run.algorithm.local.plan(0, N, B, z, 1).batch_size == B
    n_sel = sum(isinstance(e.event, dpa.ZCDpEvent) for e in entries)
    whole = dpa.ComposedDpEvent([ts.training_event(z, N, B, 1, 6), ts.selection_event(plan.eps_sel, n_sel)])
    assert result.ledger.spent(0) == pytest.approx(ts.epsilon(whole, DELTA), rel=1e-9)


def test_cluster_aggregation_is_the_uniform_mean_and_an_empty_cluster_is_unchanged():
    w = {"a": torch.zeros(2)}
    agg = ClusteredAggregator("fixed", 4, 5, assignment=(0, 0, 2, 2))
    starts, state = agg.start_points(agg.init(w), w, [0, 1, 2], 1)
    assert torch.equal(starts["a"], torch.zeros(3, 2))
    ups = {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])}
    out = agg.update(state, w, ups, RoundInputs(ServerView.simple([1, 1, 1]), 0, 1, starts=starts))
    assert torch.equal(out.state["models"]["a"], torch.tensor([[2.0, 3.0], [0.0, 0.0], [5.0, 6.0]]))  # 1: no client
    assert torch.equal(out.params["a"], torch.tensor([7.0, 9.0]) / 3)  # the mean of the cluster models


def test_stage_2_draws_follow_the_posteriors_and_choices_freeze():
    agg = ClusteredAggregator("rdpcfl", 3, 200, seed=1, eps_sel=0.5)
    state = {**agg.init({}), "posteriors": torch.tensor([[0.7, 0.2, 0.1], [1.0, 0.0, 0.0], [0.0, 0.5, 0.5]],
                                                        dtype=torch.float64)}
    draws = np.array([agg.cluster_of(state, 0, r) for r in range(1, 3001)])
    counts = np.bincount(draws, minlength=3)
    assert stats.chisquare(counts, np.array([0.7, 0.2, 0.1]) * len(draws)).pvalue > 1e-3
    assert {agg.cluster_of(state, 1, r) for r in range(1, 50)} == {0}
    state, metrics = agg.chosen(state, 10, {0: 2})
    assert metrics["selections_made"] == state["facts"]["selections_made"] == 1
    assert {agg.cluster_of(state, 0, r) for r in range(11, 60)} == {2}  # frozen after the choice
    state = {**state, "facts": {**state["facts"], "e_c_effective": 100}}
    assert agg.selection_rounds_planned(state) == list(range(99, 120))  # e in {E_c, ..., E_c + floor(0.1 E)}


def test_ifca_and_fixed_baselines_run(blobs):
    run, result, plan, data = rdpcfl_run(blobs, 0, strategy="ifca", n_clusters=3)
    assert result.states.server["facts"]["selections_made"] == plan.n_sel
    assert max(result.ledger.spent_all().values()) <= EPS
    run, result, _, data = rdpcfl_run(blobs, 0, strategy="fixed", assignment=tuple(data.info["true_cluster"]))
    assert result.history[-1]["clusters"] == data.info["true_cluster"]  # Oracle: the true clusters, no selection
    assert all(isinstance(e.event, dpa.SelfComposedDpEvent) for e in result.ledger.entries(3))


def test_reference_ifca_discards_round_1_then_draws_uniformly_and_selects_one_round_later():
    """ifca_round1 = reference (§6, the reference code): round 1 trains from the initial model but moves no cluster
    model; round 2 uses the same uniform draw the default IFCA uses in round 1; selections end rounds 2..floor(0.1 E)
    + 1 (0-based 1..floor(0.1 E)), one fewer than the default's window, which starts a round earlier."""
    E_ref = 40
    ref = ClusteredAggregator("ifca", 6, E_ref, seed=3, eps_sel=0.5, n_clusters=3, ifca_round1="reference")
    default = ClusteredAggregator("ifca", 6, E_ref, seed=3, eps_sel=0.5, n_clusters=3)
    w = {"a": torch.arange(4, dtype=torch.float32)}
    assert default.selection_rounds_planned(default.init(w)) == [0, 1, 2, 3, 4]
    assert ref.selection_rounds_planned(ref.init(w)) == [1, 2, 3, 4]
    starts, state = ref.start_points(ref.init(w), w, list(range(6)), 0)
    assert starts is None  # everyone starts from the initial model
    state = ref.update(state, w, {"a": torch.randn(6, 4)}, RoundInputs(ServerView.simple([5] * 6), 0, 0)).state
    assert torch.equal(state["models"]["a"], w["a"].repeat(3, 1))  # the uploads moved nothing
    assert ref.model_choice(state, 0, w) is None and ref.model_choice(state, 1, w) is not None
    starts, state = ref.start_points(state, w, list(range(6)), 1)
    # round 2: the default's uniform draw
    assert state["trained"] == {c: default.cluster_of(default.init(w), c, 0) for c in range(6)}
    assert torch.equal(starts["a"], w["a"].repeat(6, 1))
    with pytest.raises(ValueError, match="no selection at all"):
        ClusteredAggregator("ifca", 6, 9, eps_sel=0.5, n_clusters=3, ifca_round1="reference")  # floor(0.9) = 0
    with pytest.raises(ValueError, match="ifca strategy only"):
        ClusteredAggregator("rdpcfl", 6, 9, eps_sel=0.5, ifca_round1="reference")


def _ifca_config(rounds: int, **params):
    from dpfl.experiment.config import validate_config

    return validate_config({
        "name": "c", "seed": 2, "data": {"dataset": "digits", "clients": 6, "partition": "clustered",
                                         "clustered": {"clusters": 3, "minority_ratio": 0.34, "train_per_client": 60}},
        "model": {"name": "logr"}, "algorithm": {"name": "ifca_dp", "params": {"clusters": 3, **params}},
        "training": {"rounds": rounds, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.1},
                     "selection": {"kind": "all"}},
        "privacy": {"mechanism": "dpsgd", "clip": 1.0, "sampling": "poisson", "budgets": 8.0, "delta": 1e-3},
        "evaluation": {"every": 5}})


def test_reference_ifca_run_charges_and_makes_floor_ratio_e_selections_and_keeps_round_1_out_of_the_models():
    from dpfl.experiment.build import build_run

    run = build_run(_ifca_config(20, ifca_round1="reference"))
    states = []
    result = run.run(on_checkpoint=states.append, checkpoint_every=1)
    after_round1 = next(s for s in states if s.round == 1).aggregator_state["models"]
    initial = build_run(_ifca_config(20, ifca_round1="reference")).initial_state().params
    for n, t in after_round1.items():
        assert torch.equal(t, initial[n].unsqueeze(0).repeat(3, *([1] * initial[n].ndim)))
    assert result.states.server["facts"]["selections_made"] == 2  # floor(0.1 x 20), after rounds 2 and 3
    selections = [e for e in result.ledger.entries(0) if isinstance(e.event, dpa.ZCDpEvent)]
    assert sorted(e.round for e in selections) == [1, 2]
    assert max(result.ledger.spent_all().values()) <= 8.0
    default = build_run(_ifca_config(20))  # the default plans one more selection, so its noise is a little larger
    assert default.noise[0] > run.noise[0]


def test_reference_ifca_without_a_selection_round_is_a_config_error():
    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import ConfigError

    with pytest.raises(ConfigError, match="ifca_round1.*none with E = 8"):
        build_run(_ifca_config(8, ifca_round1="reference"))  # floor(0.1 x 8) = 0
    build_run(_ifca_config(8))  # the default still selects after round 1


def test_mr_mtl_with_lambda_0_is_local_training_and_the_mean_is_over_every_client():
    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import validate_config

    def cfg(algorithm):
        return validate_config({
            "name": "c", "seed": 2, "data": {"dataset": "digits", "clients": 6, "partition": "clustered",
                                             "clustered": {"clusters": 3, "minority_ratio": 0.34,
                                                           "train_per_client": 60}},
            "model": {"name": "logr"}, "algorithm": algorithm,
            "training": {"rounds": 3, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.1},
                         "selection": {"kind": "all"}},
            "privacy": {"mechanism": "dpsgd", "clip": 1.0, "sampling": "poisson", "budgets": 8.0, "delta": 1e-3},
            "evaluation": {"every": 3}})

    mr = build_run(cfg({"name": "mr_mtl", "params": {"lam": 0.0}}))
    local = build_run(cfg({"name": "clustered_local"}))
    assert list(mr.noise) == list(local.noise)
    a, b = mr.run(), local.run()
    pa = mr.algorithm.aggregator.personal_models(a.states.server, a.params)
    pb = local.algorithm.aggregator.personal_models(b.states.server, b.params)
    for c in range(6):
        for n in pa[c]:
            torch.testing.assert_close(pa[c][n], pb[c][n], atol=1e-6, rtol=1e-5)
    assert a.history[-1]["acc_personal"] == pytest.approx(b.history[-1]["acc_personal"])
    for n, t in a.params.items():  # thetabar = the mean of every client's personal model
        torch.testing.assert_close(t, torch.stack([pa[c][n] for c in range(6)]).mean(0))
    pulled = build_run(cfg({"name": "mr_mtl", "params": {"lam": 5.0}}))
    assert pulled.algorithm.local.spec.prox_to == "anchor" and pulled.algorithm.local.spec.prox_mu == 5.0
    p = pulled.run()
    pp = pulled.algorithm.aggregator.personal_models(p.states.server, p.params)
    spread = lambda ms: float(sum((ms[c]["fc.weight"] - ms[0]["fc.weight"]).norm() for c in range(6)))  # noqa: E731
    assert spread(pp) < spread(pa)  # the pull brings the personal models together


def test_one_cluster_found_degrades_to_global_and_says_so(blobs):
    run, result, plan, _ = rdpcfl_run(blobs, 0, rounds=6, n_clusters=1)
    state = result.states.server
    assert state["facts"]["degraded_to_global"] and state["n_clusters"] == 1
    assert set(result.history[-1]["clusters"]) == {0} and state["facts"].get("selections_made", 0) == 0
    assert not any(isinstance(e.event, dpa.ZCDpEvent)
                   for e in result.ledger.entries(0))  # nothing chosen, nothing spent
    assert result.ledger.spent(0) < plan.planned_epsilon
    assert "degraded_to_global" in result.privacy.extra["stage"]


@pytest.mark.parametrize("algorithm", [{"name": "rdpcfl", "params": {"clusters": 3}},
                                       {"name": "ifca_dp", "params": {"clusters": 3}},
                                       {"name": "mr_mtl", "params": {"lam": 0.5}}])
def test_a_resumed_clustered_run_equals_an_uninterrupted_one(algorithm):
    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import validate_config

    cfg = validate_config({
        "name": "c", "seed": 4, "data": {"dataset": "digits", "clients": 6, "partition": "clustered",
                                         "clustered": {"clusters": 3, "minority_ratio": 0.34, "train_per_client": 60}},
        "model": {"name": "logr"}, "algorithm": algorithm,
        "training": {"rounds": 8, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.1},
                     "selection": {"kind": "all"}},
        "privacy": {"mechanism": "dpsgd", "clip": 1.0, "sampling": "poisson", "budgets": 8.0, "delta": 1e-3},
        "evaluation": {"every": 2}})
    whole = build_run(cfg).run()
    states = []
    build_run(cfg).run(on_checkpoint=states.append, checkpoint_every=3)
    for at in (3, 6):  # before and after R-DPCFL's selection window (E_c ~ 4 here)
        resumed = build_run(cfg).run(state=next(s for s in states if s.round == at))
        for n in whole.params:
            assert torch.equal(whole.params[n], resumed.params[n])
        assert whole.history[-1].get("clusters") == resumed.history[-1].get("clusters")
        assert whole.history[-1]["acc_personal"] == resumed.history[-1]["acc_personal"]
        assert whole.ledger.spent_all() == resumed.ledger.spent_all()


def test_a_given_m_whose_fit_finds_one_cluster_keeps_one_model():
    """M = 3 asked for, but identical updates leave one cluster: one model, not three copies."""
    agg = ClusteredAggregator("rdpcfl", 6, 10, seed=0, eps_sel=0.5, n_clusters=3)
    w = {"a": torch.zeros(4)}
    _, state = agg.start_points(agg.init(w), w, list(range(6)), 0)
    state = agg.update(state, w, {"a": torch.ones(6, 4)}, RoundInputs(ServerView.simple([5] * 6), 0, 0)).state
    assert state["facts"]["degraded_to_global"] and state["facts"]["n_clusters"] == 3  # the fit had 3 components
    assert state["n_clusters"] == 1 and state["models"]["a"].shape == (1, 4)
    assert agg.selection_rounds_planned(state) == []


def _same(a, b) -> bool:
    """Equal nested states: dicts, lists, tensors (same dtype and values), scalars."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def test_a_round_replayed_from_an_earlier_state_gives_the_earlier_result_and_no_state_passed_in_changes():
    """The step is a function of its configuration and the state passed in: round 2 run again from round 1's state,
    after rounds 2 and 3 ran, gives round 2's models, assignment and metrics again; no call changes its state."""
    agg = ClusteredAggregator("rdpcfl", 6, 10, seed=2, eps_sel=0.5, n_clusters=2)
    gen = torch.Generator().manual_seed(0)
    w = {"a": torch.zeros(4), "b": torch.zeros(2, 3)}
    view = ServerView.simple([5] * 6)
    centres = torch.tensor([[4.0] * 4 + [0.0] * 6] * 3 + [[0.0] * 4 + [4.0] * 6] * 3)
    round0 = centres + 0.1 * torch.randn(6, 10, generator=gen)  # two clear groups: the GMM finds both
    later = [torch.randn(6, 10, generator=gen) for _ in range(2)]

    def uploads(x):
        return {"a": x[:, :4], "b": x[:, 4:].reshape(6, 2, 3)}

    def round_(state, params, r, x):
        before = copy.deepcopy(state)
        starts, mid = agg.start_points(state, params, list(range(6)), r)
        assert _same(state, before)
        between = copy.deepcopy(mid)
        out = agg.update(mid, params, uploads(x), RoundInputs(view, 0, r, starts=starts))
        assert _same(mid, between)  # update left the state passed in unchanged
        return out

    first = round_(agg.init(w), w, 0, round0)
    assert first.state["facts"]["n_clusters"] == 2 and not first.state["facts"].get("degraded_to_global")
    second = round_(first.state, first.params, 1, later[0])
    before = copy.deepcopy(second.state)
    chosen, answered = agg.chosen(second.state, 1, {0: 1, 3: 0})
    assert _same(second.state, before) and chosen["assigned"] == {0: 1, 3: 0}
    assert answered["selections_made"] == 1 and answered["clusters"][0] == 1 and answered["clusters"][3] == 0
    round_(chosen, second.params, 2, later[1])
    again = round_(first.state, first.params, 1, later[0])
    assert _same(again.params, second.params) and _same(again.state, second.state)
    assert _same(again.metrics, second.metrics)
    assert again.state["trained"] and not torch.equal(second.state["models"]["a"], first.state["models"]["a"])


def test_training_micro_batch_in_a_config_gives_the_same_run():
    """`training.micro_batch` as a user sets it: the full-batch round 1 and later rounds accumulate in micro-batches
    of 7 records and give the same models (float32 tolerance) and the same ledger."""
    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import validate_config

    def cfg(**training):
        return validate_config({
            "name": "m", "seed": 1, "data": {"dataset": "digits", "clients": 6, "partition": "clustered",
                                             "clustered": {"clusters": 3, "minority_ratio": 0.34,
                                                           "train_per_client": 60}},
            "model": {"name": "cnn_digits"}, "algorithm": {"name": "rdpcfl", "params": {"clusters": 3}},
            "training": {"rounds": 3, "local_epochs": 1, "batch_size": 16, "optimizer": {"lr": 0.1},
                         "selection": {"kind": "all"}, **training},
            "privacy": {"mechanism": "dpsgd", "clip": 1.0, "sampling": "poisson", "budgets": 8.0, "delta": 1e-3}})

    one, acc = build_run(cfg()).run(), build_run(cfg(micro_batch=7)).run()
    for n in one.params:
        torch.testing.assert_close(acc.params[n], one.params[n], atol=1e-5, rtol=1e-4)
    assert acc.ledger.spent_all() == one.ledger.spent_all()

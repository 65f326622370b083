"""Round stages: selection, FedAvg, central DP-FedAvg, client-level upload noise, algorithm bundles."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent, SampledWithoutReplacementDpEvent

from dpfl.algorithms.algorithm import Algorithm, central_dp_fedavg, fedavg
from dpfl.algorithms.client.program import dpsgd, sgd
from dpfl.algorithms.client.prox import fedprox
from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs
from unaccounted_stage import UnaccountedNoise


def stacked(rows):
    return {"w": torch.tensor(rows, dtype=torch.float32)}


def test_fixed_selection_draws_k_distinct_candidates_reproducibly():
    sel = Selection("fixed", k=4)
    cands = np.array([9, 2, 5, 7, 11, 3])
    a = sel.select(cands, seed=1, round_=3)
    assert len(a) == 4 and len(set(a.tolist())) == 4 and set(a.tolist()) <= set(cands.tolist())
    assert (a == sel.select(cands, seed=1, round_=3)).all()
    assert any((sel.select(cands, seed=1, round_=r) != a).any() for r in range(4, 10))
    with pytest.raises(ValueError, match="cannot select 4"):
        sel.select(cands[:3], seed=1, round_=0)


def test_poisson_selection_rate():
    sel = Selection("poisson", rate=0.2)
    counts = [len(sel.select(np.arange(1000), seed=0, round_=r)) for r in range(50)]
    # 50,000 Bernoulli(0.2) draws: mean 200 per round, standard error of the mean ~ 1.8
    assert abs(np.mean(counts) - 200) < 8


def test_selection_builds_the_matching_client_level_event():
    assert isinstance(Selection("poisson", rate=0.1).client_level_event(1.0, 100), PoissonSampledDpEvent)
    assert isinstance(Selection("fixed", k=10).client_level_event(1.0, 100), SampledWithoutReplacementDpEvent)
    assert isinstance(Selection("all").client_level_event(1.0, 100), GaussianDpEvent)


def test_bad_selection_fails_clearly():
    with pytest.raises(ValueError, match="k >= 1"):
        Selection("fixed")
    with pytest.raises(ValueError, match="rate"):
        Selection("poisson", rate=1.5)
    with pytest.raises(ValueError, match="selection kind"):
        Selection("roundrobin")


def test_fedavg_uniform_and_sample_weighted():
    g = {"w": torch.zeros(2)}
    up = stacked([[1.0, 0.0], [0.0, 3.0]])
    n = torch.tensor([100, 300])
    u = FedAvg("uniform").aggregate(g, up, ServerView.simple(n), 0, 0)["w"]
    torch.testing.assert_close(u, torch.tensor([0.5, 1.5]))
    s = FedAvg("samples").aggregate(g, up, ServerView.simple(n), 0, 0)["w"]
    torch.testing.assert_close(s, torch.tensor([0.25, 2.25]))


def test_weiavg_weights_by_reported_epsilon():
    g = {"w": torch.zeros(2)}
    up = stacked([[1.0, 0.0], [0.0, 3.0]])
    view = ServerView.simple([10, 10], eps_reported=[1.0, 3.0])
    torch.testing.assert_close(FedAvg("epsilon").weights(view), torch.tensor([0.25, 0.75]))
    torch.testing.assert_close(FedAvg("epsilon").aggregate(g, up, view, 0, 0)["w"], torch.tensor([0.25, 2.25]))
    with pytest.raises(ValueError, match="reported epsilon"):
        FedAvg("epsilon").weights(ServerView.simple([10, 10]))


def test_central_dp_fedavg_clips_and_uses_the_fixed_denominator():
    g = {"w": torch.ones(2)}
    up = stacked([[3.0, 4.0], [0.3, 0.4]])  # norms 5 and 0.5
    agg = CentralDPFedAvg(clip=1.0, noise_multiplier=0.0)
    out = agg.aggregate(g, up, ServerView.simple([1, 1], expected_clients=4.0), seed=0, round_=0)["w"]
    expected = torch.ones(2) + (torch.tensor([0.6, 0.8]) + torch.tensor([0.3, 0.4])) / 4.0
    torch.testing.assert_close(out, expected)


def test_central_dp_fedavg_noise_std():
    """Noise on the sum has std z*S; divided by the expected count. 20,000 coordinates: the sample std
    has relative standard error ~0.5%, so 3% is a 6-sigma bound at this fixed seed."""
    d = 20000
    g = {"w": torch.zeros(d)}
    agg = CentralDPFedAvg(clip=0.5, noise_multiplier=2.0)
    out = agg.aggregate(g, {"w": torch.zeros(3, d)}, ServerView.simple([1, 1, 1], expected_clients=10.0), seed=4,
                        round_=2)["w"]
    assert float(out.std()) == pytest.approx(2.0 * 0.5 / 10.0, rel=0.03)


def test_udp_clips_the_whole_update_and_adds_noise_of_the_configured_std():
    d = 20000
    deltas = {"a": torch.full((2, d // 2), 1.0), "b": torch.full((2, d // 2), 1.0)}  # norm sqrt(d)
    quiet = ClippedNoisyUpdate(clip=2.0, noise_multiplier=0.0).apply(deltas, [0, 1], 0, 0)
    norms = torch.cat([quiet["a"], quiet["b"]], 1).norm(dim=1)
    torch.testing.assert_close(norms, torch.full((2,), 2.0), rtol=1e-5, atol=0)
    noisy = ClippedNoisyUpdate(clip=2.0, noise_multiplier=1.5).apply(deltas, [0, 1], 0, 0)
    noise = torch.cat([noisy["a"] - quiet["a"], noisy["b"] - quiet["b"]], 1)
    assert float(noise.std()) == pytest.approx(1.5 * 2.0, rel=0.03)
    # a client's upload noise is its own: the same alone as in a cohort
    alone = ClippedNoisyUpdate(clip=2.0, noise_multiplier=1.5).apply({k: v[1:] for k, v in deltas.items()}, [1], 0, 0)
    torch.testing.assert_close(alone["a"][0], noisy["a"][1])


def test_algorithm_declares_its_privacy_semantics():
    local = fedavg(dpsgd(0.1, 1.0, steps=5), Selection("fixed", k=3))
    assert local.unit == "sample" and "server" in local.observer and local.accounted
    central = central_dp_fedavg(sgd(0.1, steps=5), clip=1.0, noise_multiplier=1.0,
                                selection=Selection("poisson", rate=0.1))
    assert central.unit == "client" and "trusted" in central.observer
    plain = fedavg(sgd(0.1, steps=5))
    assert plain.unit is None and plain.mechanism.startswith("none")
    unaccounted = Algorithm("noisy", sgd(0.1, steps=5), upload=UnaccountedNoise())
    assert not unaccounted.accounted and "NOT accounted" in unaccounted.mechanism
    with pytest.raises(ValueError, match="mixes privacy units"):
        Algorithm("bad", dpsgd(0.1, 1.0, steps=5), upload=ClippedNoisyUpdate(1.0, 1.0))
    with pytest.raises(ValueError, match="non-private local program"):
        central_dp_fedavg(dpsgd(0.1, 1.0, steps=5), clip=1.0, noise_multiplier=1.0, selection=Selection())


def test_local_program_steps_and_validation():
    assert dpsgd(0.1, 1.0, epochs=2).steps_for(1200, 64) == 2 * 19
    assert sgd(0.1, steps=7).steps_for(10, 3) == 7
    with pytest.raises(ValueError, match="exactly one of steps and epochs"):
        sgd(0.1)
    with pytest.raises(ValueError, match="'poisson' or 'fixed'"):
        dpsgd(0.1, 1.0, steps=3, sampling="shuffle")
    with pytest.raises(ValueError, match="mu > 0"):
        fedprox(0.1, 0.0, steps=3)
    assert fedprox(0.1, 0.5, steps=3, clip=1.0).private


def test_dpsgd_program_event_matches_its_sampling():
    poisson = dpsgd(0.1, 1.0, steps=10).event(1200, 8, 1.1)
    fixed = dpsgd(0.1, 1.0, steps=10, sampling="fixed").event(1200, 8, 1.1)
    assert "Poisson" in type(poisson.event).__name__
    assert "WithoutReplacement" in type(fixed.event).__name__
    assert sgd(0.1, steps=3).event(100, 8, 1.0) is None


def test_round_specs_may_change_only_the_learning_rate_and_the_proximal_weight():
    from dataclasses import replace

    from dpfl.algorithms.client.program import sgd

    program = sgd(0.1, steps=2, prox_mu=1.0)
    scheduled = replace(program, round_specs=(program.spec, replace(program.spec, lr=0.05, prox_mu=2.0)))
    assert scheduled.spec_at(1).lr == 0.05 and scheduled.spec_at(0) == program.spec == program.spec_at(7)
    with pytest.raises(ValueError, match="only lr and prox_mu"):
        replace(program, round_specs=(replace(program.spec, momentum=0.9),))
    with pytest.raises(ValueError, match="at least one"):
        replace(program, round_specs=())


# ---- the stage contracts (dpfl.algorithms.stages) -------------------------------------------------------------
def test_an_algorithm_refuses_stages_that_keep_no_contract():
    from dpfl.algorithms.stages import AggregateFunction

    with pytest.raises(TypeError, match="upload stage must be a dpfl.UploadMechanism, got object"):
        Algorithm("x", sgd(0.1, steps=1), upload=object())
    with pytest.raises(TypeError, match="must subclass dpfl.ServerStep or have aggregate"):
        Algorithm("x", sgd(0.1, steps=1), aggregator=object())

    class Plain:  # a user's aggregator written without the contract
        def aggregate(self, global_params, uploads, view, seed, round_):
            return {n: w + uploads[n].sum(0) for n, w in global_params.items()}

    wrapped = Algorithm("x", sgd(0.1, steps=1), aggregator=Plain()).aggregator
    assert isinstance(wrapped, AggregateFunction)
    out = wrapped.update(None, {"w": torch.zeros(2)}, {"w": torch.ones(3, 2)},
                         RoundInputs(ServerView.simple([1, 1, 1]), 0, 0))
    assert torch.equal(out.params["w"], torch.full((2,), 3.0)) and out.state is None and out.metrics == {}


def test_a_stateful_step_depends_only_on_the_state_passed_in():
    """MR-MTL's personal models live in its state: replaying round 1 from the initial state gives round 1's result
    again after round 2 ran, the states passed in are left as they were, and `personal_models` reads the state it is
    given (a resumed run's checkpointed state describes the step at once)."""
    from dpfl.algorithms.server.mean_regularized import MeanRegularized

    step, w, ids = MeanRegularized(n_clients=3), {"w": torch.zeros(2)}, [0, 1, 2]
    view, uploads = ServerView.simple([10, 10, 10]), {"w": torch.ones(3, 2)}

    def round_(state, params, r):
        starts, state = step.start_points(state, params, ids, r)
        return step.update(state, params, uploads, RoundInputs(view, 0, r, starts=starts))

    initial = step.init(w)
    kept = copy.deepcopy(initial)
    first = round_(initial, w, 0)
    after_first = copy.deepcopy(first.state)
    second = round_(first.state, first.params, 1)
    again = round_(initial, w, 0)
    assert torch.equal(first.params["w"], torch.ones(2)) and torch.equal(second.params["w"], torch.full((2,), 2.0))
    assert torch.equal(again.params["w"], first.params["w"])
    assert torch.equal(again.state["personal"]["w"], first.state["personal"]["w"])
    for passed, copied in ((initial, kept), (first.state, after_first)):  # update wrote new tensors
        assert passed.keys() == copied.keys() and torch.equal(passed["personal"]["w"], copied["personal"]["w"])
    assert all(torch.equal(m["w"], torch.zeros(2)) for m in step.personal_models(initial, w).values())
    models = MeanRegularized(n_clients=3).personal_models(second.state, w)
    assert sorted(models) == ids and all(torch.equal(m["w"], torch.full((2,), 2.0)) for m in models.values())
    # a checkpoint written before the step's first round held no personal models: built when first handed out
    assert step.personal_models({"personal": None}, w) == {}
    starts, built = step.start_points({"personal": None}, w, [2], 0)
    assert torch.equal(starts["w"], torch.zeros(1, 2)) and torch.equal(built["personal"]["w"], initial["personal"]["w"])

"""CENTAUR's private heads (spec fedceo.md §6.3, tests M4, P1): only the representation is shared."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.client.phased import PhasedProgram
from dpfl.algorithms.client.private_head import PrivateHead
from dpfl.algorithms.client.program import dpsgd, sgd
from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.engine import params as P
from dpfl.experiment.federated_run import FederatedRun
from dpfl.privacy.budgets import ClientBudget

from .federations import tiny_federation

HEAD, BODY = ("2.weight", "2.bias"), ("0.weight", "0.bias")


def toy(n_clients=3, n=30, seed=0):
    return tiny_federation(n_clients, n, seed=seed)


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def centaur(private=False, noise=0.0, clip=1e6, rounds=2, selection=None):
    if private:
        phases = (dpsgd(0.1, 1.0, epochs=1, trainable=HEAD), dpsgd(0.1, 1.0, steps=3, trainable=BODY))
        upload = FullUpdate()
    else:
        phases = (sgd(0.1, epochs=1, trainable=HEAD, momentum=0.5), sgd(0.1, steps=3, trainable=BODY, momentum=0.5))
        upload = ClippedNoisyUpdate(clip, noise, cohort=3)
    alg = Algorithm("centaur", PhasedProgram(phases), selection or Selection(), upload, FedAvg("uniform"),
                    PrivateHead(HEAD))
    return FederatedRun(toy(), model(), alg, rounds=rounds, batch_sizes=10,
                        budgets=ClientBudget(float("inf"), 1e-5), noise_multipliers=1.0 if private else None, seed=3)


def test_m4_uploads_have_no_head_and_the_heads_stay_on_their_clients():
    run = centaur(noise=0.5, clip=1.0)
    seen = []
    original = run.algorithm.aggregator.aggregate

    def spy(global_params, uploads, view, seed, round_):
        seen.append((set(global_params), set(uploads)))
        return original(global_params, uploads, view, seed, round_)

    object.__setattr__(run.algorithm.aggregator, "aggregate", spy)
    result = run.run()
    assert seen and all(g == set(BODY) and u == set(BODY) for g, u in seen)  # the server never gets a head
    heads = run.algorithm.personal.heads
    assert set(heads) == {0, 1, 2}
    assert not torch.equal(heads[0]["2.weight"], heads[1]["2.weight"])  # each client its own head
    mean_head = torch.stack([h["2.weight"] for h in heads.values()]).mean(0)
    torch.testing.assert_close(result.params["2.weight"], mean_head)  # the global head is the diagnostic mean
    assert result.history[-1]["bytes_up"] == [4 * (5 * 6 + 5)] * 3  # φ only
    assert result.history[-1]["acc_personal_clients"] == 3


def test_head_phase_leaves_the_body_and_body_phase_leaves_the_head():
    """One round, no noise: each client's stored head is its head-phase result from h(0) on the initial φ,
    and the uploaded body update was trained with that head frozen."""
    run = centaur(rounds=1)
    w0 = P.model_params(model())
    result = run.run()
    heads = run.algorithm.personal.heads
    for c in range(3):
        assert not torch.equal(heads[c]["2.weight"], w0["2.weight"])
    assert not torch.equal(result.params["0.weight"], w0["0.weight"])
    # a head-only program changes nothing but the head
    only_head = Algorithm("h", PhasedProgram((sgd(0.1, epochs=1, trainable=HEAD),)), Selection(), FullUpdate(),
                          FedAvg("uniform"))
    out = FederatedRun(toy(), model(), only_head, rounds=1, batch_sizes=10).run()
    assert (torch.equal(out.params["0.weight"], w0["0.weight"])
            and not torch.equal(out.params["2.weight"], w0["2.weight"]))


def test_dpsgd_mode_charges_both_phases():
    run = centaur(private=True, rounds=1)
    run.run()
    one_phase = Algorithm("b", dpsgd(0.1, 1.0, steps=3, trainable=BODY), Selection(), FullUpdate(), FedAvg("uniform"))
    body_only = FederatedRun(toy(), model(), one_phase, rounds=1, batch_sizes=10,
                             budgets=ClientBudget(float("inf"), 1e-5), noise_multipliers=1.0, seed=3).run()
    both = run.ledger.spent_all()
    assert all(both[c] > body_only.spent()[c] for c in range(3))  # the head phase is accounted too
    assert run.algorithm.local.steps_for(30, 10) == 3 + 3


def test_resume_is_exact():
    states = []
    full = centaur(noise=0.5, clip=1.0, rounds=3).run(on_checkpoint=states.append)
    again = centaur(noise=0.5, clip=1.0, rounds=3).run(state=next(s for s in states if s.round == 1))
    for n in full.params:
        assert torch.equal(again.params[n], full.params[n])


def test_invalid_phased_programs_and_models_are_refused():
    with pytest.raises(ValueError):
        PhasedProgram(())
    with pytest.raises(ValueError):
        PhasedProgram((sgd(0.1, steps=1), sgd(0.1, steps=1, trainable=BODY)))  # first phase trains everything
    with pytest.raises(ValueError):
        PhasedProgram((dpsgd(0.1, 1.0, steps=1, trainable=HEAD), sgd(0.1, steps=1, trainable=BODY)))
    from dpfl.experiment.build import build_algorithm
    from dpfl.experiment.config import ConfigError, load_config

    base = ["algorithm.name=centaur", "privacy.budgets=.inf", "privacy.noise_multiplier=1.0"]
    with pytest.raises(ConfigError, match="only a head"):
        build_algorithm(load_config("configs/demo.yaml", base))  # logr is all head
    alg = build_algorithm(load_config("configs/demo.yaml",
                                      [*base, "model.name=mlp2", "algorithm.params={head_epochs: 2}"]))
    assert alg.personal.head == ("fc2.weight",)
    assert (alg.local.phases[0].spec.trainable == ("fc2.weight",)
            and alg.local.phases[1].spec.trainable == ("fc1.weight",))
    assert alg.local.phases[0].epochs == 2

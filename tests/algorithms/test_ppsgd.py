"""PPSGD's additive personalisation (spec fedceo.md §6.2, tests M4, P1): θ_k = w + u_k, u_k stays local."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.client.additive_personal import AdditivePersonal
from dpfl.algorithms.client.program import sgd
from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.engine import params as P
from dpfl.experiment.federated_run import FederatedRun
from dpfl.privacy.budgets import ClientBudget

from .federations import tiny_federation


def toy(n_clients=3, n=24, seed=0):
    return tiny_federation(n_clients, n, seed=seed)


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def ppsgd_run(alpha=0.5, rounds=2, noise=0.0, clip=1e6, selection=None, personal=True, data=None):
    """lr 0.2 for the shared part; the engine trains θ at (1 + α)·0.2 (full batches: deterministic)."""
    stage = AdditivePersonal(alpha) if personal else None
    lr = 0.2 * (stage.lr_factor if stage else 1.0)
    alg = Algorithm("ppsgd" if personal else "udp_fedavg", sgd(lr, steps=4, momentum=0.5),
                    selection or Selection(), ClippedNoisyUpdate(clip, noise, cohort=3), FedAvg("uniform"), stage)
    return FederatedRun(data or toy(), model(), alg, rounds=rounds, batch_sizes=24,
                        budgets=ClientBudget(float("inf"), 1e-5), seed=2)


def reference_two_part_sgd(w, u, x, y, alpha, lr=0.2, steps=4, momentum=0.5):
    """Bietti et al.'s client round written out: two parts, two momentum buffers, one gradient."""
    net = model()
    v = {n: t.clone() for n, t in w.items()}
    u = {n: t.clone() for n, t in u.items()}
    bv = {n: torch.zeros_like(t) for n, t in w.items()}
    bu = {n: torch.zeros_like(t) for n, t in w.items()}
    for _ in range(steps):
        theta = {n: (v[n] + u[n]).requires_grad_(True) for n in v}
        loss = nn.functional.cross_entropy(functional_call(net, theta, (x,)), y)
        grads = torch.autograd.grad(loss, list(theta.values()))
        for (n, _), g in zip(theta.items(), grads, strict=True):
            bv[n] = momentum * bv[n] + g
            bu[n] = momentum * bu[n] + g
            v[n] = v[n] - lr * bv[n]
            u[n] = u[n] - alpha * lr * bu[n]
    return v, u


def test_engine_split_equals_the_two_part_update_and_u_never_leaves_the_client():
    data = toy()
    run = ppsgd_run(alpha=0.5, rounds=2, data=data)
    states = []
    result = run.run(on_checkpoint=states.append)
    w0 = P.model_params(model())
    vs, us = zip(*[reference_two_part_sgd(w0, {n: torch.zeros_like(t) for n, t in w0.items()},
                                          c.x_train, c.y_train, 0.5) for c in data.clients], strict=True)
    w1 = {n: torch.stack([v[n] for v in vs]).mean(0) for n in w0}  # the server averages v only
    round1 = next(s for s in states if s.round == 1)
    for n in w0:
        torch.testing.assert_close(round1.params[n], w1[n], rtol=1e-5, atol=1e-6)
    # round 2 starts from w1 + u_k (the local parts were never averaged)
    parts = [reference_two_part_sgd(w1, u, c.x_train, c.y_train, 0.5) for u, c in zip(us, data.clients, strict=True)]
    vs2, us2 = zip(*parts, strict=True)
    w2 = {n: torch.stack([v[n] for v in vs2]).mean(0) for n in w0}
    for n in w0:
        torch.testing.assert_close(result.params[n], w2[n], rtol=1e-4, atol=1e-5)
        for c in range(3):
            torch.testing.assert_close(run.algorithm.personal.local[c][n], us2[c][n], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(run.algorithm.personal.local[0]["0.weight"], torch.zeros(5, 6))


def test_personal_accuracy_is_logged_and_resume_is_exact():
    states = []
    full = ppsgd_run(rounds=4, noise=1.0, clip=1.0).run(on_checkpoint=states.append)
    assert all("acc_personal" in row for row in full.history)  # every evaluated round: w + u_k on local tests
    assert full.history[-1]["acc_personal_clients"] == 3
    again = ppsgd_run(rounds=4, noise=1.0, clip=1.0).run(state=next(s for s in states if s.round == 2))
    for n in full.params:
        assert torch.equal(again.params[n], full.params[n])
    assert [r["acc_personal"] for r in again.history] == [r["acc_personal"] for r in full.history]


def test_p1_ppsgd_reports_the_guarantee_of_udp_fedavg():
    poisson = Selection("poisson", rate=0.6)
    a = ppsgd_run(rounds=3, noise=2.0, clip=1.0, selection=poisson).run().privacy.to_dict()
    b = ppsgd_run(rounds=3, noise=2.0, clip=1.0, selection=poisson, personal=False).run().privacy.to_dict()
    assert a["clients"] == b["clients"] and a["aggregate_view"] == b["aggregate_view"]


def test_alpha_must_be_positive_and_the_config_builds_ppsgd():
    with pytest.raises(ValueError):
        AdditivePersonal(0.0)
    from dpfl.experiment.build import build_algorithm
    from dpfl.experiment.config import load_config

    cfg = load_config("configs/demo.yaml", ["algorithm.name=ppsgd", "algorithm.params={alpha: 3.0}",
                                            "privacy.budgets=.inf", "privacy.noise_multiplier=1.0"])
    alg = build_algorithm(cfg)
    assert isinstance(alg.personal, AdditivePersonal) and alg.personal.alpha == 3.0
    assert alg.local.spec.lr == pytest.approx(cfg.training.optimizer.lr * 4.0)

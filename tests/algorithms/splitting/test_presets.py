"""§12.6: each preset against its one-line definition (50 rounds, 1e-12), and bad input."""

import numpy as np
import pytest
import torch

from dpfl.algorithms.client.convex_clients import ConvexClients
from dpfl.algorithms.client.local_operators import ExactLeastSquaresProx, GradientSteps, InexactProx
from dpfl.algorithms.server.splitting import AndersonII, presets
from dpfl.algorithms.server.splitting.schedules import StepSchedule
from dpfl.algorithms.selection import Selection
from dpfl.data.synthetic import make_logistic
from dpfl.reproduce.splitting_solver import run_splitting

from .closed_forms import gradient_steps, project, prox, reflect

ROUNDS = 50


def direct(name, ls, eta, k, u):
    """One round of the preset written from the spec's table (§3), on the product-space point u [n, d]."""
    lam, P = ls.lam, (lambda x: prox(ls.Q, ls.c, eta, x))
    G = lambda x: gradient_steps(ls.Q, ls.c, eta, k, x)  # noqa: E731
    R_f = lambda x: 2 * P(x) - x  # noqa: E731
    return {"fedavg": lambda: project(lam, G(u)), "fedprox": lambda: project(lam, P(u)),
            "fedsplit": lambda: reflect(lam, R_f(u)), "fedpi": lambda: (u + reflect(lam, R_f(u))) / 2,
            "fedrp": lambda: project(lam, R_f(u)), "rh_g": lambda: reflect(lam, G(u)),
            "rh_p": lambda: reflect(lam, P(u))}[name]()


@pytest.mark.parametrize("name", list(presets.PRESETS))
def test_preset_equals_its_direct_implementation(ls, name):
    eta, k = 0.5 / ls.max_eig, 3
    gradient = presets.PRESETS[name][3] == "gradient"
    alg = presets.make(name, eta, GradientSteps(k) if gradient else ExactLeastSquaresProx())
    server = alg.server(torch.zeros(ls.fns.dim, dtype=torch.float64), ls.fns.n_records)
    u = np.zeros((ls.fns.n_clients, ls.fns.dim))
    everyone = torch.arange(ls.fns.n_clients)
    for t in range(ROUNDS):
        server.round(ls.fns, everyone, eta, 0, t)
        u = direct(name, ls, eta, k, u)
        np.testing.assert_allclose(server.u.numpy(), u, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(u).max()))


def test_fedpi_admm_has_the_same_iterates_as_fedpi(ls):
    eta = 1.0 / ls.mean_eig
    unified = presets.fedpi(eta, local=ExactLeastSquaresProx(), report="shadow").server(
        torch.zeros(ls.fns.dim, dtype=torch.float64), ls.fns.n_records)
    admm = presets.fedpi_admm(eta, local=ExactLeastSquaresProx()).server(torch.zeros(ls.fns.dim, dtype=torch.float64),
                                                                         ls.fns.n_records)
    everyone = torch.arange(ls.fns.n_clients)
    for t in range(ROUNDS):
        a, b = unified.round(ls.fns, everyone, eta, 0, t), admm.round(ls.fns, everyone, eta, 0, t)
        assert torch.allclose(unified.u, admm.u, rtol=1e-12, atol=1e-12)  # u = theta + u_dual
        assert torch.allclose(a.reported, b.xbar, rtol=1e-12, atol=1e-12)  # theta = P_H(P_f(v)), the shadow
        assert np.abs(ls.lam @ admm.dual.numpy()).max() < 1e-9  # the duals stay in H-perp


def test_inexact_prox_approaches_the_exact_prox(ls):
    eta, idx = 1.0 / ls.mean_eig, torch.arange(ls.fns.n_clients)
    u = torch.randn(ls.fns.n_clients, ls.fns.dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    from dpfl.algorithms.client.local_operators import OperatorCall

    exact = ExactLeastSquaresProx().apply(ls.fns, idx, u, eta, OperatorCall())
    inexact = InexactProx(steps=400, lr=0.5 / (ls.max_eig + 1 / eta)).apply(ls.fns, idx, u, eta, OperatorCall())
    assert float(torch.linalg.vector_norm(inexact - exact) / torch.linalg.vector_norm(exact)) < 1e-8


def test_fedpi_with_the_reference_inexact_prox_solves_heterogeneous_logistic_regression():
    problem = make_logistic(preset="small", shift_scale=1.0, seed=0)
    local = InexactProx(steps=100, lr=0.01)  # the reference settings, eta = 0.01
    fedpi = run_splitting(problem, presets.fedpi(0.01, local=local), 300)
    fedprox = run_splitting(problem, presets.fedprox(0.01, local=local), 300)
    assert fedpi.history[-1]["rel_dist"] < 1e-8 and abs(fedpi.history[-1]["gap"]) < 1e-8
    assert fedprox.history[-1]["rel_dist"] > 1e-2  # constant eta: the envelope problem's solution


@pytest.mark.parametrize("build, match", [
    (lambda: presets.make("fedsgd", 0.1), "unknown splitting preset 'fedsgd'"),
    (lambda: presets.fedpi(0.1, anderson=AndersonII(-1)), "memory tau must be an integer >= 0"),
    (lambda: presets.fedpi(0.0), "eta must be a number > 0"),
    (lambda: presets.fedpi(-1.0), "eta must be a number > 0"),
    (lambda: presets.fedprox(0.1, local=GradientSteps(2)), "needs a prox operator"),
    (lambda: presets.fedavg(0.1, local=ExactLeastSquaresProx()), "needs a gradient operator"),
    (lambda: presets.fedpi(0.1, mode="decentralized", participation=Selection("poisson", rate=0.5)),
     "decentralized mode with partial participation needs beta = gamma = 1"),
    (lambda: presets.fedpi(0.1, anderson=AndersonII(2, scope="global")), "scope 'global'"),
    (lambda: presets.fedpi_admm(0.1, participation=Selection("fixed", k=2)), "full participation"),
    (lambda: StepSchedule(0.1, "inv_cube"), "schedule must be one of"),
])
def test_bad_input_is_one_clear_error(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_exact_least_squares_prox_refuses_a_logistic_problem():
    fns = ConvexClients(make_logistic(preset="small"))
    with pytest.raises(ValueError, match="cannot apply to a logistic problem"):
        run_splitting(fns, presets.fedprox(0.1, local=ExactLeastSquaresProx()), 1)


def test_parameters_outside_the_nonexpansive_ranges_warn_but_run(ls):
    from dpfl.algorithms.server.splitting import UnifiedSplitting

    with pytest.warns(UserWarning, match="guarantees do not apply"):
        alg = UnifiedSplitting(2.5, 1.0, 1.0, ExactLeastSquaresProx(), StepSchedule(0.001))
    assert len(run_splitting(ls.fns, alg, 3).history) == 3

"""§12.1-12.4: where FedAvg, FedProx and FedPi converge on quadratics (float64, the `small` problem)."""

import numpy as np
import pytest
import torch

from dpfl.algorithms.client.local_operators import ExactLeastSquaresProx, GradientSteps, MoreauEnvelope
from dpfl.algorithms.server.splitting import presets
from dpfl.reproduce.splitting_solver import run_splitting

from .closed_forms import fedavg_fixed_point, fedprox_fixed_point


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(b))


@pytest.mark.parametrize("k", [1, 2, 5])
def test_fedavg_converges_to_its_closed_form_fixed_point(ls, k):
    eta = 0.5 / ls.max_eig
    run = run_splitting(ls.fns, presets.fedavg(eta, k=k, local=GradientSteps(k)), 3000, stop_residual=1e-14)
    assert run.stop_reason == "residual"
    expected = fedavg_fixed_point(ls.Q, ls.c, ls.lam, eta, k)
    assert rel(run.final, expected) < 1e-8
    if k == 1:
        assert rel(expected, ls.theta) < 1e-10  # one local step is gradient descent on f: no bias
    else:
        assert rel(expected, ls.theta) > 1e-4  # heterogeneous data: k > 1 moves the fixed point


def test_fedavg_bias_is_first_order_in_eta_times_k_minus_1(ls):
    c = 0.2 / max(np.linalg.norm(q, 2) for q in ls.Q)

    def spread_and_distance(c):
        points = [fedavg_fixed_point(ls.Q, ls.c, ls.lam, eta, k) for k, eta in ((2, c), (5, c / 4), (11, c / 10))]
        spread = max(np.linalg.norm(a - b) for a in points for b in points)
        return spread, np.linalg.norm(points[0] - ls.theta)

    spread, distance = spread_and_distance(c)
    assert spread <= 0.15 * distance  # same eta (k - 1): same fixed point to first order
    spread_half, distance_half = spread_and_distance(c / 2)
    assert spread / spread_half == pytest.approx(4.0, rel=0.25)  # the spread is second order
    assert distance / distance_half == pytest.approx(2.0, rel=0.25)  # the bias is first order


def test_fedprox_is_fedavg_on_the_moreau_envelopes(ls):
    eta = 1.0 / ls.mean_eig
    prox_run = run_splitting(ls.fns, presets.fedprox(eta, local=ExactLeastSquaresProx()), 50)
    envelope = MoreauEnvelope(ls.fns, ExactLeastSquaresProx(), eta)
    avg_run = run_splitting(envelope, presets.fedavg(eta, k=1, local=GradientSteps(1)), 50)
    for a, b in zip(prox_run.history, avg_run.history, strict=True):
        assert a["dist"] == pytest.approx(b["dist"], rel=1e-12, abs=1e-12)
    assert torch.allclose(prox_run.final, avg_run.final, rtol=1e-12, atol=1e-12)


def test_fedprox_limit_is_the_envelope_solution_not_theta_star(ls, ls_homogeneous):
    eta = 1.0 / ls.mean_eig
    run = run_splitting(ls.fns, presets.fedprox(eta, local=ExactLeastSquaresProx()), 2000, stop_residual=1e-14)
    expected = fedprox_fixed_point(ls.Q, ls.c, ls.lam, eta)
    assert rel(run.final, expected) < 1e-8
    assert rel(expected, ls.theta) > 1e-3  # s = 1: biased
    h = ls_homogeneous
    assert rel(fedprox_fixed_point(h.Q, h.c, h.lam, eta), h.theta) < rel(expected, ls.theta) / 10


def test_fedpi_reaches_theta_star_while_fedavg_k5_stays_biased(ls):
    fedpi = run_splitting(ls.fns, presets.fedpi(1.0 / ls.mean_eig, local=ExactLeastSquaresProx()), 300)
    assert min(row["rel_dist"] for row in fedpi.history) <= 1e-8
    assert fedpi.history[-1]["rel_dist"] <= 1e-8
    eta = 0.3 / ls.max_eig
    fedavg = run_splitting(ls.fns, presets.fedavg(eta, k=5), 3000, stop_residual=1e-14)
    limit = fedavg_fixed_point(ls.Q, ls.c, ls.lam, eta, 5)
    assert rel(fedavg.final, limit) < 1e-8
    assert all(row["rel_dist"] > 1e-3 for row in fedavg.history)

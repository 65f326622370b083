"""§12.8: step-size schedules and ergodic averaging."""

import math

import pytest
import torch

from dpfl.algorithms.server.splitting import ErgodicAverage, StepSchedule

TIMES = (0, 1, 499, 500, 1000)
E0 = 0.3
TABLE = {
    "constant": lambda t: E0,
    "inv_t": lambda t: E0 / (t + 1),
    "inv_sqrt": lambda t: E0 / math.sqrt(t + 1),
    "inv_log": lambda t: E0 / (math.log10(t + 1) + 1),
    "inv_log_e": lambda t: E0 / math.log(t + math.e),
    "exp_halving": lambda t: E0 / 2 ** (t // 500),
}


@pytest.mark.parametrize("name", TABLE)
def test_schedule_values(name):
    schedule = StepSchedule(E0, name)
    for t in TIMES:
        assert schedule(t) == pytest.approx(TABLE[name](t), rel=1e-15)


def test_spot_values():
    assert StepSchedule(1.0, "inv_log")(999) == pytest.approx(0.25)  # 1 / (3 + 1)
    assert StepSchedule(1.0, "exp_halving", period=10)(25) == 0.25
    assert StepSchedule(1.0, "inv_log_e")(0) == pytest.approx(1.0)


def test_ergodic_incremental_equals_the_batch_formula():
    g = torch.Generator().manual_seed(0)
    points = [torch.randn(7, generator=g, dtype=torch.float64) for _ in range(40)]
    etas = [StepSchedule(0.5, "inv_sqrt")(t) for t in range(40)]
    avg = ErgodicAverage()
    for t, (x, eta) in enumerate(zip(points, etas, strict=True)):
        running = avg.add(x, eta)
        batch = sum(e * p for e, p in zip(etas[: t + 1], points[: t + 1], strict=True)) / sum(etas[: t + 1])
        assert torch.allclose(running, batch, rtol=1e-13, atol=1e-14)


def test_ergodic_runs_log_both_the_average_and_the_last_iterate(ls):
    from dpfl.algorithms.client.local_operators import ExactLeastSquaresProx
    from dpfl.algorithms.server.splitting import presets
    from dpfl.reproduce.splitting_solver import run_splitting

    run = run_splitting(ls.fns, presets.fedprox(1.0 / ls.mean_eig, local=ExactLeastSquaresProx(), schedule="inv_sqrt",
                                                ergodic=True), 20)
    row = run.history[-1]
    assert {"dist", "reported_dist"} <= set(row) and row["dist"] != row["reported_dist"]


def test_the_final_model_is_the_last_reported_one(ls):
    from dpfl.algorithms.client.local_operators import ExactLeastSquaresProx
    from dpfl.algorithms.server.splitting import presets
    from dpfl.reproduce.splitting_solver import run_splitting

    eta = 1.0 / ls.mean_eig
    shadow = run_splitting(ls.fns, presets.fedpi(eta, local=ExactLeastSquaresProx(), report="shadow"), 3)
    admm = run_splitting(ls.fns, presets.fedpi_admm(eta, local=ExactLeastSquaresProx()), 3)
    assert torch.allclose(shadow.final, admm.final, atol=1e-12)  # the shadow is FedPi-ADMM's theta, not xbar
    assert shadow.history[-1]["reported_dist"] == pytest.approx(float(torch.linalg.vector_norm(
        shadow.final - torch.as_tensor(ls.theta))), rel=1e-12)

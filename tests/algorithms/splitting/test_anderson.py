"""§12.5: type-II Anderson acceleration of the round map."""

import numpy as np
import pytest
import torch

from dpfl.algorithms.client.local_operators import ExactLeastSquaresProx, GradientSteps
from dpfl.algorithms.server.splitting import AndersonII, presets
from dpfl.algorithms.server.splitting.anderson import AndersonWindow
from dpfl.reproduce.splitting_solver import run_splitting

CAP = 5000


@pytest.mark.parametrize("name", ["fedprox", "fedavg"])
def test_anderson_tau2_at_least_halves_the_rounds_and_keeps_the_limit(ls, name):
    eta = 0.02 / ls.max_eig
    local = GradientSteps(5) if name == "fedavg" else ExactLeastSquaresProx()

    def run(tau):
        return run_splitting(ls.fns, presets.make(name, eta, local, anderson=AndersonII(tau)), CAP, stop_residual=1e-8)

    plain, fast = run(0), run(2)
    assert plain.rounds_to() is not None and fast.rounds_to() is not None
    assert fast.rounds_to() <= plain.rounds_to() / 2
    assert np.linalg.norm(fast.final - plain.final) <= 1e-6 * np.linalg.norm(plain.final)


def test_tau_0_reproduces_the_plain_iterates(ls):
    eta = 1.0 / ls.mean_eig
    plain = run_splitting(ls.fns, presets.fedpi(eta, local=ExactLeastSquaresProx()), 40)
    tau0 = run_splitting(ls.fns, presets.fedpi(eta, local=ExactLeastSquaresProx(), anderson=AndersonII(0)), 40)
    assert [r["dist"] for r in plain.history] == [r["dist"] for r in tau0.history]


def test_weights_sum_to_one_minimise_the_residual_and_may_be_negative():
    g = torch.Generator().manual_seed(3)
    window = AndersonWindow(AndersonII(memory=3))
    lam = torch.tensor([0.1, 0.3, 0.6], dtype=torch.float64)
    pairs = [(torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g, dtype=torch.float64))
             for _ in range(4)]
    for u, tu in pairs:
        out, status = window.next(u, tu, lam)
    assert status == "accelerated"
    pi = window.last_pi
    assert float(pi.sum()) == pytest.approx(1.0, abs=1e-12)
    assert torch.allclose(out, sum(p * tu for p, (_, tu) in zip(pi, pairs, strict=True)), atol=1e-12)
    # pi minimises the lambda-weighted norm of sum pi_s r_s over the affine set 1^T pi = 1
    r = torch.stack([((u - tu) * lam.sqrt().view(-1, 1)).flatten() for u, tu in pairs]).T
    best = float(torch.linalg.vector_norm(r @ pi))
    for _ in range(50):
        direction = torch.randn(4, generator=g, dtype=torch.float64)
        direction -= direction.mean()  # stay on 1^T pi = 1
        assert float(torch.linalg.vector_norm(r @ (pi + 1e-3 * direction))) >= best - 1e-12


def test_window_fills_before_accelerating_and_degenerate_gram_falls_back():
    window = AndersonWindow(AndersonII(memory=2))
    x = torch.ones(2, 3, dtype=torch.float64)
    statuses = [window.next(x, x, torch.tensor([0.5, 0.5], dtype=torch.float64))[1] for _ in range(3)]
    assert statuses[:2] == ["plain", "plain"]
    assert statuses[2].startswith("fallback") and window.fallbacks == 1  # all residuals zero: no combination


def test_blend_moves_weight_to_the_last_pair():
    g = torch.Generator().manual_seed(1)
    pairs = [(torch.randn(5, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64))
             for _ in range(3)]
    plain, blended = AndersonWindow(AndersonII(2)), AndersonWindow(AndersonII(2, blend=0.25))
    for u, tu in pairs:
        plain.next(u, tu)
        blended.next(u, tu)
    expected = 0.75 * plain.last_pi
    expected[-1] += 0.25
    assert torch.allclose(blended.last_pi, expected, atol=1e-14)


def test_safeguard_rejects_a_far_extrapolation():
    window = AndersonWindow(AndersonII(1, safeguard=True, distance=1e-6))
    u0, tu0 = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0.5, 0.1], dtype=torch.float64)
    u1, tu1 = torch.tensor([0.5, 0.1], dtype=torch.float64), torch.tensor([0.3, 0.3], dtype=torch.float64)
    window.next(u0, tu0)
    out, status = window.next(u1, tu1)
    assert status.startswith("fallback") and torch.equal(out, tu1)


def test_an_overflowed_iterate_falls_back_instead_of_failing_the_run(monkeypatch):
    """A diverged reflection preset (FedSplit on the CNN) can overflow to inf: the window falls back to the plain step
    and counts it, and an eigensolver failure on an ill-conditioned Gram matrix does the same."""
    window = AndersonWindow(AndersonII(1))
    window.next(torch.zeros(3), torch.ones(3))
    out, status = window.next(torch.ones(3), torch.tensor([float("inf"), 0.0, 1.0]))
    assert status == "fallback: non-finite residuals" and window.fallbacks == 1 and torch.isinf(out[0])

    def fails(*args, **kwargs):
        raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")

    monkeypatch.setattr(torch.linalg, "pinv", fails)
    window = AndersonWindow(AndersonII(1))
    window.next(torch.zeros(3), torch.ones(3))
    out, status = window.next(torch.ones(3) * 2, torch.ones(3) * 3)
    assert (status == "fallback: degenerate Gram matrix" and window.fallbacks == 1
            and torch.equal(out, torch.ones(3) * 3))

"""§12.10: the DP modes release what they state and put exactly one event per upload in the ledger."""

import dp_accounting as dpa
import pytest
import torch

from dpfl.algorithms.client.local_operators import ExactLeastSquaresProx, GradientSteps, InexactProx
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.splitting import SplittingDP, presets
from dpfl.reproduce.splitting_solver import run_splitting
from dpfl.privacy.accountant import epsilon


def test_update_gaussian_release_is_clip_plus_noise_of_the_stated_std():
    d, clip, z = 20_000, 0.5, 1.5
    g = torch.Generator().manual_seed(0)
    U = torch.randn(3, d, generator=g, dtype=torch.float64)
    out = U + torch.randn(3, d, generator=g, dtype=torch.float64) * torch.tensor([[0.001], [1.0], [10.0]])
    dp = SplittingDP("update_gaussian", clip, z)
    idx = torch.tensor([0, 1, 2])
    noiseless = SplittingDP("update_gaussian", clip, 0.0).release(U, out, idx, seed=7, round_=2)
    delta = out - U
    norms = torch.linalg.vector_norm(delta, dim=1)
    assert torch.allclose(noiseless[0], out[0])  # ||D|| < C: unchanged
    assert torch.allclose(torch.linalg.vector_norm(noiseless[1:] - U[1:], dim=1),
                          torch.full((2,), clip, dtype=torch.float64))
    assert torch.allclose((noiseless[1:] - U[1:]) / clip, delta[1:] / norms[1:].unsqueeze(1))  # direction kept
    noise = dp.release(U, out, idx, seed=7, round_=2) - noiseless
    # 3 x 20,000 draws: the sample std is within 1.5% of z C with probability > 1 - 1e-6 (its relative
    # standard error is 1/sqrt(2 n) = 0.29%); the mean within 5 standard errors of 0
    assert float(noise.std()) == pytest.approx(z * clip, rel=0.015)
    assert abs(float(noise.mean())) < 5 * z * clip / (3 * d) ** 0.5
    again = dp.release(U, out, idx, seed=7, round_=2) - noiseless
    assert torch.equal(noise, again)  # keyed by (seed, round, client)
    assert not torch.equal(noise, dp.release(U, out, idx, seed=7, round_=3) - noiseless)


def test_ledger_has_one_gaussian_event_per_upload(ls):
    dp = SplittingDP("update_gaussian", clip=1.0, noise_multiplier=2.0)
    alg = presets.fedpi(1.0 / ls.mean_eig, local=ExactLeastSquaresProx(), dp=dp,
                        participation=Selection("poisson", rate=0.6))
    run = run_splitting(ls.fns, alg, 8, seed=1, delta=1e-5)
    for client in range(ls.fns.n_clients):
        took_part = [row["round"] - 1 for row in run.history if client in row.get("selected", range(ls.fns.n_clients))]
        entries = run.ledger.entries(client)
        assert [e.round for e in entries] == took_part
        assert all(e.event == dpa.GaussianDpEvent(2.0) for e in entries)
        expected = (epsilon(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), len(took_part)), 1e-5)
                    if took_part else 0.0)
        assert run.ledger.spent(client) == pytest.approx(expected, rel=1e-9)
    assert run.history[-1]["label"] == "no guarantee of convergence under noise"


def test_dpsgd_mode_accounts_every_inner_step_with_the_poisson_rate(ls):
    dp = SplittingDP("dpsgd", clip=1.0, noise_multiplier=1.0, batch=20)
    alg = presets.fedavg(1e-4, k=3, dp=dp)
    run = run_splitting(ls.fns, alg, 2, delta=1e-5)
    entries = run.ledger.entries(0)
    assert len(entries) == 2
    assert entries[0].event == dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(20 / 200, dpa.GaussianDpEvent(1.0)), 3)
    assert run.ledger.unit == "sample"


def test_dpsgd_gradients_without_noise_and_clip_are_unbiased_minibatch_estimates(ls):
    # clip huge, z = 0: the DP-SGD step is the (N / b) Poisson-batch sum, an unbiased gradient estimate
    from dpfl.algorithms.client.local_operators import OperatorCall, InnerDPSGD

    idx, eta = torch.arange(ls.fns.n_clients), 1e-5
    u = torch.zeros(ls.fns.n_clients, ls.fns.dim, dtype=torch.float64)
    exact = GradientSteps(1).apply(ls.fns, idx, u, eta, OperatorCall())
    draws = torch.stack([GradientSteps(1).apply(ls.fns, idx, u, eta,
                                                OperatorCall(seed=s, dpsgd=InnerDPSGD(1e9, 0.0, 50)))
                         for s in range(400)])
    spread = draws.std(0) / 400 ** 0.5
    assert ((draws.mean(0) - exact).abs() <= 5 * spread + 1e-15).float().mean() > 0.99


def test_dpsgd_needs_inner_steps():
    with pytest.raises(ValueError, match="has none"):
        presets.fedprox(0.1, local=ExactLeastSquaresProx(), dp=SplittingDP("dpsgd", 1.0, 1.0, batch=10))
    alg = presets.fedprox(0.1, local=InexactProx(steps=5, lr=1e-3), dp=SplittingDP("dpsgd", 1.0, 1.0, batch=10))
    assert alg.dp.unit == "sample"


@pytest.mark.parametrize("mode", ["update_gaussian", "dpsgd"])
def test_noise_is_calibrated_from_the_budgets_for_worst_case_participation(ls, mode):
    from dpfl.privacy.budgets import ClientBudget

    rounds, budget = 6, ClientBudget(3.0, 1e-5)
    if mode == "update_gaussian":
        alg = presets.fedpi(1.0 / ls.mean_eig, local=ExactLeastSquaresProx(), dp=SplittingDP(mode, 1.0, None),
                            participation=Selection("poisson", rate=0.6))
    else:
        alg = presets.fedavg(1e-4, k=3, dp=SplittingDP(mode, 1.0, None, batch=20))
    run = run_splitting(ls.fns, alg, rounds, budgets=budget)
    z = run.noise_multiplier
    assert z is not None and z > 0
    spent = run.ledger.spent_all()
    assert max(spent.values()) <= 3.0 + 1e-6
    one = (dpa.GaussianDpEvent(z) if mode == "update_gaussian" else
           dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(20 / 200, dpa.GaussianDpEvent(z)), 3))
    assert epsilon(dpa.SelfComposedDpEvent(one, rounds), 1e-5) == pytest.approx(3.0, rel=1e-3)  # taking part always


def test_unset_noise_without_budgets_is_an_error(ls):
    alg = presets.fedpi(0.01, local=ExactLeastSquaresProx(), dp=SplittingDP("update_gaussian", 1.0, None))
    with pytest.raises(ValueError, match="give budgets"):
        run_splitting(ls.fns, alg, 2)


def test_given_noise_stops_the_run_before_a_budget_is_exceeded(ls):
    from dpfl.privacy.budgets import ClientBudget

    alg = presets.fedpi(1.0 / ls.mean_eig, local=ExactLeastSquaresProx(), dp=SplittingDP("update_gaussian", 1.0, 2.0))
    run = run_splitting(ls.fns, alg, 50, budgets=ClientBudget(5.0, 1e-5))
    assert run.stop_reason == "budget" and 0 < len(run.history) < 50
    assert max(run.ledger.spent_all().values()) <= 5.0  # z = 2: eps 5.38 after 5 uploads, 4.01 after 3
    one_more = epsilon(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), len(run.history) + 1), 1e-5)
    assert one_more > 5.0  # it stopped exactly where the next upload would have gone over

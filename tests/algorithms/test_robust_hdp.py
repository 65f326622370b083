"""Robust-HDP (spec heterogeneous_dp §4.4): PCP by inexact ALM, noise-aware weights, schedules (tests 5, 6, 11)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings

import numpy as np
import pytest
import torch

from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.robust_hdp import RobustHDP, last_weights, noise_weights, round_weights, row_blocks
from dpfl.algorithms.server import rpca
from dpfl.algorithms.server.rpca import pcp
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs
from same_state import same_state

try:  # installed with scikit-learn
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    threadpool_limits = None


# -- test 5: RPCA recovers a planted matrix -----------------------------------------------------------
def planted(seed=0, shape=(200, 200), rank=4, frac=0.05):
    """M = L0 + S0: L0 = A B with Gaussian A (m x rank), B (rank x n); S0 has `frac` of its entries +-10."""
    rng = np.random.default_rng(seed)
    L0 = rng.standard_normal((shape[0], rank)) @ rng.standard_normal((rank, shape[1]))
    support = rng.random(L0.shape) < frac
    S0 = np.zeros_like(L0)
    S0[support] = 10.0 * rng.choice([-1.0, 1.0], size=int(support.sum()))
    return L0, S0, support


def tall_planted(seed=0):
    """The spec's earlier instance: 1000 x 20, rank 2, 5% of entries +-10."""
    return planted(seed, shape=(1000, 20), rank=2)


def solve(M, **kwargs):
    """pcp on one BLAS thread. Its cost is one thin SVD (200 x 200) or Gram product per iteration, and
    multithreaded OpenBLAS on such small matrices is 7-10x slower on a loaded 2-core machine (measured:
    max_col_sum seed 0, 926 iterations, 6 s on one thread, 45-70 s with the default threads)."""
    limit = threadpool_limits(1, user_api="blas") if threadpool_limits else contextlib.nullcontext()
    with limit:
        L, S, info = pcp(M, **kwargs)
    return L.numpy(), S.numpy(), info


def recovery(L, S, L0, support):
    err = np.linalg.norm(L - L0) / np.linalg.norm(L0)
    est = np.abs(S) > 1e-6 * np.abs(S).max()
    f1 = 2 * (est & support).sum() / (est.sum() + support.sum())
    return err, f1


# measured (seeds 0, 1, 2), default lam = 1/sqrt(200), tol 1e-7, max_iter 10,000:
#   entrywise   (mu ~ 0.13): rel. error 8.1e-8 / 7.2e-8 / 8.8e-8, F1 1.0, 24 / 24 / 23 iterations
#   max_col_sum (mu ~ 13):   rel. error 9.9e-3 / 1.0e-7 / 1.4e-7, F1 1.0, 926 / 1033 / 879 iterations
# With the ~100x larger mu of max_col_sum the primal residual stays ~1e-5 relative from the start and the
# stopping rule (primal residual only) fires as soon as the SVT rank collapses; for seed 0 that iterate
# still carries a spurious 5th singular value (3.8), and ~90 more iterations (tol 1e-8) reach 9e-9.
# The default (mu grows 1.5x per iteration from LCM's 1.25 / ||M||_2, spec §4.4 as revised): rel. error 5.7e-8 at
# seed 0 in 16 iterations.
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mu_growth, mu_norm, err_bound, f1_bound", [
    (1.0, "entrywise", 1e-3, 0.99), (1.0, "max_col_sum", 2e-2, 0.95), (1.5, None, 1e-3, 0.99)])
def test_pcp_recovers_planted_low_rank_plus_sparse(mu_growth, mu_norm, err_bound, f1_bound, seed):
    L0, S0, support = planted(seed)
    L, S, info = solve(L0 + S0, mu_norm=mu_norm, mu_growth=mu_growth, max_iter=10_000)  # lam: 1/sqrt(200)
    err, f1 = recovery(L, S, L0, support)
    assert info.lam == pytest.approx(1 / np.sqrt(200))
    assert info.converged and info.iterations < 10_000, info
    assert err < err_bound, err
    assert f1 >= f1_bound, f1


def test_pcp_default_lambda_reaches_the_pcp_optimum_not_the_planted_pair():
    """The tall-instance finding behind the revision of spec §8.5.

    The spec's earlier test asked for recovery of a rank-2 1000 x 20 matrix with 5% +-10 corruptions at
    the default lam = 1/sqrt(1000) (rel. error < 1e-2, F1 >= 0.95). The solver converges there to rel.
    error 0.045 / 0.049 and F1 0.94 / 0.90 (entrywise / max_col_sum), and this is not a solver failure:
    its objective ||L||_* + lam ||S||_1 (619.76) is below the planted pair's (620.07), so (L0, S0) is not
    the PCP optimum of that instance. The exact-recovery theorem of Candès et al. needs both dimensions
    large (rank <~ min(m, n) / log^2 max(m, n)); with only 20 columns it says nothing.
    """
    L0, S0, _ = tall_planted()
    lam = 1 / np.sqrt(1000)
    L, S, info = solve(L0 + S0, mu_norm="entrywise", mu_growth=1.0, max_iter=10_000)
    obj = lambda L, S: np.linalg.svd(L, compute_uv=False).sum() + lam * np.abs(S).sum()  # noqa: E731
    assert info.converged and obj(L, S) < obj(L0, S0) - 0.1


# A growing mu from LCM's start: at the default 1.5 this instance stalls at the cap 1e7 mu_0 on a suboptimal iterate
# (rank 12, objective 1244.0 against the optimum's 1236.7, rel. error 0.075, the same at tol 1e-10); 1.2 and 1.1
# reach the optimum in 30-31 iterations (constant mu: 79). Measured; reported to the spec's owners.
@pytest.mark.parametrize("mu_growth, mu_norm", [(1.0, "entrywise"), (1.0, "max_col_sum"), (1.2, None)])
def test_pcp_recovers_tall_instance_at_larger_lambda(mu_growth, mu_norm):
    # Not a spec target: at lam = 3/sqrt(1000) the planted pair is the PCP optimum of the tall instance, and
    # this covers the Gram-matrix SVT path (m >= 4n, the Robust-HDP shape) that the square test does not use.
    L0, S0, support = tall_planted()
    L, S, info = solve(L0 + S0, lam=3 / np.sqrt(1000), mu_norm=mu_norm, mu_growth=mu_growth, max_iter=10_000)
    err, f1 = recovery(L, S, L0, support)
    assert info.converged and info.iterations < 10_000
    assert err < 1e-2 and f1 >= 0.95
    assert info.rank == 2
    assert np.linalg.norm(L0 + S0 - L - S) < 1e-7 * np.linalg.norm(L0 + S0)


def test_pcp_input_checks_and_zero_matrix():
    with pytest.raises(ValueError, match="mu_norm"):
        pcp(np.ones((4, 3)), mu_norm="l2")
    with pytest.raises(ValueError, match="2-D"):
        pcp(np.ones(4))
    with pytest.raises(ValueError, match="finite"):
        pcp(np.array([[1.0, np.nan]]))
    L, S, info = pcp(np.zeros((5, 3)))
    assert info.converged and info.iterations == 0 and not L.any() and not S.any()
    assert L.dtype == torch.float64 and isinstance(S, torch.Tensor)
    L, S, info = pcp(torch.ones(6, 3), max_iter=2)  # torch input; not converged flag when max_iter is hit
    assert L.dtype == torch.float64 and info.iterations <= 2
    L, S, info = pcp(torch.ones(6, 3), max_iter=2, dtype=torch.float32)
    assert L.dtype == S.dtype == torch.float32


# -- test 6: Robust-HDP approaches the oracle ---------------------------------------------------------
def oracle_problem(seed=0, p=20_000, k=20):
    """u_i = g + drift_i + nu_i: g rank-1 shared, small drift, nu_i ~ N(0, s_i^2 I); 6 noisy, 14 quiet."""
    rng = np.random.default_rng(seed)
    noisy = 6 if k == 20 else k // 3
    s2 = np.concatenate([np.full(noisy, 1.0), np.full(k - noisy, 0.01)]) * rng.uniform(1.0, 2.0, k)
    g = 0.1 * rng.standard_normal(p)
    drift = 0.01 * rng.standard_normal((k, p))
    u = g + drift + rng.standard_normal((k, p)) * np.sqrt(s2)[:, None]
    return {"w": torch.from_numpy(u)}, s2


def noise_stat(w, s2):
    return float((w**2 * s2).sum())


def run(agg, uploads, view=None, state=None, round_=0):
    """One update from `state` (the initial state by default) at zero: the step's ServerUpdate."""
    k = next(iter(uploads.values())).shape[0]
    view = ServerView.simple([100] * k) if view is None else view
    zero = {n: torch.zeros(u.shape[1:], dtype=u.dtype) for n, u in uploads.items()}
    state = agg.init(zero) if state is None else state
    return agg.update(state, zero, uploads, RoundInputs(view, seed=0, round_=round_))


def check_oracle(agg, bound):
    uploads, s2 = oracle_problem()
    step = run(agg, uploads)
    w = last_weights(step.state).numpy()
    w_star = (1 / s2) / (1 / s2).sum()
    ratio = noise_stat(w, s2) / noise_stat(w_star, s2)
    cos = w @ w_star / np.linalg.norm(w) / np.linalg.norm(w_star)
    assert step.metrics["pcp_converged"]
    assert ratio <= bound, ratio
    assert cos >= 0.99, cos
    return ratio, cos


@pytest.mark.parametrize("mu_growth", [1.0, 1.5])
def test_robust_hdp_first_block_approaches_oracle(mu_growth):
    # measured (seed 0): constant mu ratio 1.0005, cos 0.99978, 1471 PCP iterations on the 5000 x 20 block;
    # the default growing mu ratio 1.0095 in 25 iterations
    check_oracle(RobustHDP(blocks="first", p_prime=5_000, mu_growth=mu_growth), bound=1.10)


def test_robust_hdp_all_blocks_approaches_oracle_by_default():
    check_oracle(RobustHDP(), bound=1.05)


@pytest.mark.integration  # ~2,800 (entrywise) / ~6,800 (max_col_sum) PCP iterations on 20000 x 20: ~20-50 s each
@pytest.mark.parametrize("mu_norm", ["entrywise", "max_col_sum"])
def test_robust_hdp_all_blocks_approaches_oracle_at_a_constant_mu(mu_norm):
    # measured (seed 0): entrywise ratio 1.0003, cos 0.99983; max_col_sum ratio 1.0005, cos 0.99985
    check_oracle(RobustHDP(mu_norm=mu_norm, mu_growth=1.0), bound=1.05)


def test_a_growing_mu_reaches_the_constant_mu_weights_from_lcm_start_only():
    """Spec §4.4 (revised): mu grows by 1.5 per iteration up to 1e7 mu_0, and the weights are those of the constant
    mu the authors' code used. They are from LCM's mu_0 = 1.25 / ||M||_2 (the default: 25 iterations instead of
    1,471; noise statistic within 1% of the constant mu's, every weight within 2e-3). From the spec's literal
    mu_0 = m n / (4 ||M||_1), ~50x larger here, the primal stopping rule fires after 12 iterations far from the
    optimum: 17x the oracle's noise statistic (measured 17.3). That is why the growing default starts from LCM's."""
    uploads, s2 = oracle_problem()
    w_star = (1 / s2) / (1 / s2).sum()

    def weights(**kwargs):
        step = run(RobustHDP(blocks="first", p_prime=5_000, **kwargs), uploads)
        return last_weights(step.state).numpy(), step.metrics["pcp_iterations"][0]

    constant, it_constant = weights(mu_growth=1.0)
    grown, it_grown = weights()
    literal, _ = weights(mu_norm="entrywise", mu_growth=1.5)
    assert it_grown < it_constant / 20, (it_grown, it_constant)
    assert np.abs(grown - constant).max() < 2e-3
    assert noise_stat(grown, s2) / noise_stat(constant, s2) == pytest.approx(1.0, abs=0.01)
    assert noise_stat(literal, s2) / noise_stat(w_star, s2) > 10


# -- test 11: misreport invariance --------------------------------------------------------------------
def small_problem(seed=1):
    uploads, s2 = oracle_problem(seed, p=2_000, k=8)
    return {"a": uploads["w"][:, :1_500].reshape(8, 30, 50).float(), "b": uploads["w"][:, 1_500:].float()}, s2


def test_misreport_invariance_bit_identical():
    uploads, _ = small_problem()
    honest = ServerView.simple([100] * 8, eps_reported=[1.0] * 8)
    liar = dataclasses.replace(honest, eps_reported=torch.tensor([10.0] + [1.0] * 7, dtype=torch.float64))
    agg = RobustHDP()
    step1 = run(agg, uploads, honest)
    w1 = agg.aggregation_weights(step1.state, honest, None, 2_000)
    step2 = run(RobustHDP(), uploads, liar)
    for n in step1.params:
        assert torch.equal(step1.params[n], step2.params[n])
    assert torch.equal(w1, round_weights(step2.state, liar))
    # while WeiAvg's weights move as predicted: the liar's weight goes from 1/8 to 10/17
    wa = FedAvg("epsilon")
    assert wa.weights(honest)[0] == pytest.approx(1 / 8) and wa.weights(liar)[0] == pytest.approx(10 / 17)


# -- aggregation, options and state --------------------------------------------------------------------
def test_aggregate_is_weighted_sum_with_server_lr_and_cached_weights():
    uploads, s2 = small_problem()
    agg = RobustHDP(server_lr=0.5)
    glob = {"a": torch.ones(30, 50), "b": torch.zeros(500)}
    view = ServerView.simple([100] * 8)
    step = agg.update(agg.init(glob), glob, uploads, RoundInputs(view, seed=0, round_=3))
    out = step.params
    w = agg.aggregation_weights(step.state, view, None, 2_000)
    assert w.dtype == torch.float32 and torch.equal(w, last_weights(step.state).to(torch.float32))
    assert w.shape == (8,) and float(w.sum()) == pytest.approx(1.0, abs=1e-6)
    assert torch.allclose(out["a"], 1 + 0.5 * torch.einsum("k,k...->...", w, uploads["a"]), atol=1e-6)
    assert torch.allclose(out["b"], 0.5 * torch.einsum("k,k...->...", w, uploads["b"]), atol=1e-6)
    assert w[:2].max() < w[2:].min()  # noisy clients get less weight
    _, d = agg.noise_aware_weights(uploads)  # the estimation record behind the metrics
    assert len(d["sigma2"]) == 8 and d["blocks"][0]["converged"]
    m = step.metrics  # what metrics.jsonl gets
    assert m["pcp_iterations"] == [b["iterations"] for b in d["blocks"]] and m["pcp_iterations"][0] > 0
    assert m["pcp_converged"] and not m["pcp_reused"] and m["sigma2_estimate"] == d["sigma2"]
    assert set(m) == {"pcp_reused", "pcp_iterations", "pcp_converged", "pcp_rel_residual", "pcp_rank",
                      "sigma2_estimate"}
    with pytest.raises(ValueError, match="differ"):
        agg.aggregation_weights(step.state, ServerView.simple([100] * 7), None, 2_000)
    with pytest.raises(ValueError, match="call update"):
        agg.aggregation_weights(agg.init(glob), view, None, 2_000)


def test_row_blocks_and_noise_weights():
    assert row_blocks(10, 20, "all") == [(0, 10)]
    assert row_blocks(10, 3, "all") == [(0, 3), (3, 6), (6, 9)]  # rows past Q p' are ignored
    assert row_blocks(10, 3, "first") == [(0, 3)]
    np.testing.assert_allclose(noise_weights([1.0, 4.0]), [0.8, 0.2])
    np.testing.assert_allclose(noise_weights([0.0, 0.0, 0.0]), [1 / 3] * 3)
    w = noise_weights([0.0, 1.0], floor=1e-6)  # a zero estimate is floored at phi * max
    np.testing.assert_allclose(w, [1e6 / (1e6 + 1), 1 / (1e6 + 1)])


def test_first_block_scales_by_q():
    uploads, _ = small_problem()
    all_, first = run(RobustHDP(p_prime=1_000), uploads).metrics, run(RobustHDP(p_prime=1_000, blocks="first"),
                                                                       uploads).metrics
    assert len(all_["pcp_iterations"]) == 2 and len(first["pcp_iterations"]) == 1
    ratio = np.array(first["sigma2_estimate"]) / np.array(all_["sigma2_estimate"])
    assert np.allclose(ratio, 1.0, atol=0.2)  # Q ||S_1||^2 estimates the same total as sum_j ||S_j||^2


def test_schedule_once_reuses_weights_by_client_id_and_needs_full_participation():
    uploads, _ = small_problem()
    agg = RobustHDP(schedule="once")
    view = ServerView.simple([100] * 8)
    first = run(agg, uploads, view)
    w1 = last_weights(first.state).clone()
    assert first.state["once"] == {c: float(w) for c, w in enumerate(w1)}
    perm = torch.tensor([3, 1, 0, 2, 7, 6, 5, 4])
    shuffled = {n: torch.randn_like(u) for n, u in uploads.items()}  # other updates: weights must not change
    view2 = dataclasses.replace(view, clients=perm)
    second = run(agg, shuffled, view2, first.state)
    assert torch.equal(last_weights(second.state), w1[perm]) and second.metrics["pcp_reused"]
    assert second.metrics == {"pcp_reused": True}
    assert second.state["once"] == first.state["once"]
    with pytest.raises(ValueError, match="full participation"):
        run(agg, {n: u[:7] for n, u in uploads.items()}, ServerView.simple([100] * 7, expected_clients=8),
            second.state)
    with pytest.raises(ValueError, match="full participation"):
        run(RobustHDP(schedule="once"), uploads, ServerView.simple([100] * 8, expected_clients=10))
    every = RobustHDP(schedule="every-round")
    assert every.schedule == "every_round"
    state = run(every, uploads, view).state
    assert state["once"] is None
    assert not torch.equal(last_weights(run(every, shuffled, view2, state).state), w1[perm])


@pytest.mark.parametrize("kwargs, match", [
    ({"blocks": "last"}, "blocks"), ({"schedule": "sometimes"}, "schedule"), ({"mu_norm": "fro"}, "mu_norm"),
    ({"p_prime": 0}, "p_prime"), ({"server_lr": 0.0}, "server_lr"), ({"floor": 1.0}, "floor"),
    ({"mu_growth": 0.5}, "mu_growth"), ({"tol": 0.0}, "tol"), ({"max_iter": 0}, "max_iter"), ({"lam": -1.0}, "lam"),
])
def test_bad_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RobustHDP(**kwargs)


def test_mismatched_view_and_empty_round():
    uploads, _ = small_problem()
    with pytest.raises(ValueError, match="uploads"):
        run(RobustHDP(), uploads, ServerView.simple([100] * 5))
    agg = RobustHDP()
    glob = {"w": torch.ones(3)}
    step = agg.update(agg.init(glob), glob, {"w": torch.zeros(0, 3)}, RoundInputs(ServerView.simple([]), 0, 0))
    assert torch.equal(step.params["w"], glob["w"]) and step.metrics == {"pcp_reused": False}
    assert round_weights(step.state, ServerView.simple([])).numel() == 0


def test_update_is_a_function_of_the_state_passed_in():
    """(a) A round replayed from an earlier state gives the earlier result after later rounds ran; (b) `update`
    leaves the state passed in unchanged (schedule "once": its round-1 weights are the state that matters)."""
    uploads, _ = small_problem()
    agg, view = RobustHDP(schedule="once", server_lr=0.5), ServerView.simple([100] * 8)
    states, steps = [agg.init({})], []
    for r in range(3):
        state = states[-1]
        before = copy.deepcopy(state)
        step = run(agg, {n: (r + 1) * u for n, u in uploads.items()}, view, state, round_=r)
        assert same_state(state, before)  # (b)
        assert step.metrics["pcp_reused"] == (r > 0)
        states.append(step.state)
        steps.append(step)
    again = run(agg, {n: 1 * u for n, u in uploads.items()}, view, states[0])  # (a): round 1 again, from its state
    assert same_state(again.state, steps[0].state) and again.metrics == steps[0].metrics
    assert all(torch.equal(again.params[n], steps[0].params[n]) for n in uploads)
    fresh = run(agg, {n: 2 * u for n, u in uploads.items()}, view, states[0])  # from the initial state: re-estimated
    assert not fresh.metrics["pcp_reused"]


def test_a_checkpoint_without_last_resumes_and_non_convergence_warns():
    """A state written before `last` existed ({"once": ...} only) resumes; the PCP's non-convergence still warns."""
    uploads, _ = small_problem()
    agg, view = RobustHDP(schedule="once"), ServerView.simple([100] * 8)
    first = run(agg, uploads, view)
    old = {"once": dict(first.state["once"])}
    step = run(agg, uploads, view, old)
    assert torch.equal(step.params["a"], first.params["a"]) and torch.equal(last_weights(step.state),
                                                                            last_weights(first.state))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(RobustHDP(max_iter=1), uploads, view)
    assert any(issubclass(w.category, RuntimeWarning) and "did not converge" in str(w.message) for w in caught)


def test_robust_hdp_is_a_frozen_config():
    agg = RobustHDP(p_prime=np.int64(1_000), max_iter=np.int64(5), schedule="every-round")
    assert type(agg.p_prime) is int and type(agg.max_iter) is int and agg.schedule == "every_round"
    assert agg == RobustHDP(p_prime=1_000, max_iter=5) and repr(agg).startswith("RobustHDP(p_prime=1000, ")
    with pytest.raises(dataclasses.FrozenInstanceError):
        agg.p_prime = 2  # type: ignore[misc]


# -- spec §4.4 (revised) / issue 67 5(a): a growing mu against the authors' constant mu, thesis Table 3.4 setting ---
# The setting of the thesis's Table 3.4 (docs/papers/robust_hdp.md): 20 clients, cnn_rhdp (p = 28,938), the rhdp20
# batch sizes, N_i = 2,400 training records, one local epoch (T_i = ceil(2400 / b_i) steps) of Poisson DP-SGD at
# C = 3, eta = 0.01, noise calibrated for 200 rounds. Round 1's uploads are synthesised instead of trained (no
# Fashion-MNIST in the default tier): u_i = T_i eta g + drift_i + n_i, g a shared direction with ||g|| = C / 2 over
# the full model, drift 10% of that per step, n_i ~ N(0, T_i eta^2 C^2 z_i^2 / b_i^2 I) (the per-coordinate update
# noise of spec §4.5). z_i: dpfl's calibration of Dist5 (dp_accounting conversion, delta 1e-4); mean 7.82, the
# table's z-bar for fmnist-Dist5 (integration test below recomputes them).
RHDP_Z_DIST5 = (6.06, 5.75, 17.27, 7.56, 8.19, 9.95, 7.1, 6.9, 6.29, 7.15, 6.06, 5.99, 6.77, 6.97, 14.14, 6.06, 6.06,
                6.94, 8.35, 6.87)
TABLE34_P = 28_938


def table34_uploads(p: int, z=RHDP_Z_DIST5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(M, s2): the p x 20 update matrix of the first p coordinates (p = 28,938: the whole model) and the
    per-coordinate noise variances."""
    from dpfl.privacy.budget_distributions import RHDP_BATCH20

    c, eta, b = 3.0, 0.01, np.array(RHDP_BATCH20, dtype=np.float64)
    steps = np.ceil(2400 / b)
    s2 = steps * eta**2 * c**2 * np.asarray(z) ** 2 / b**2
    rng = np.random.default_rng(seed)
    per_coordinate = c / 2 / np.sqrt(TABLE34_P)
    g = rng.standard_normal(p) * per_coordinate
    drift = 0.1 * eta * per_coordinate * rng.standard_normal((p, 20)) * np.sqrt(steps)
    return eta * g[:, None] * steps + drift + rng.standard_normal((p, 20)) * np.sqrt(s2), s2


def pcp_weights(M, **kwargs):
    """(L, S, Robust-HDP's weights, iterations) of one PCP of M (one row block)."""
    L, S, info = solve(M, **kwargs)
    return L, S, noise_weights(np.einsum("ij,ij->j", S, S)).numpy(), info.iterations


def check_same_solution(M, s2, mu_growth):
    """The growing mu's weights, L and S against the constant mu's (tol 1e-7, the spec's), measured against how well
    the constant mu itself pins them down: the distance from its own iterate at tol 1e-9 (2x that gap allowed)."""
    L0, S0, w0, it0 = pcp_weights(M, mu_growth=1.0)
    L9, S9, w9, _ = pcp_weights(M, mu_growth=1.0, tol=1e-9)
    L, S, w, it = pcp_weights(M, mu_growth=mu_growth)
    rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))  # noqa: E731
    gap_w, gap_l, gap_s = float(np.abs(w9 - w0).max()), rel(L9, L0), rel(S9, S0)
    stat = lambda w: float((w**2 * s2).sum())  # noqa: E731
    assert it < it0 / 5, (it, it0)
    assert np.abs(w - w0).max() <= 2 * gap_w, (np.abs(w - w0).max(), gap_w)
    assert stat(w) == pytest.approx(stat(w0), rel=1e-5)
    assert rel(L, L0) <= 2 * gap_l and rel(S, S0) <= 2 * gap_s, (rel(L, L0), gap_l, rel(S, S0), gap_s)


# Measured (p = 5,000; constant mu: 1,611 iterations, rank 13, noise statistic 1.000125 x the oracle's):
#   rho 1.02: 255 iterations, rank 13, weights within 1.1e-5 (the constant mu's own tol gap 2.9e-5), L 6.0e-3
#             (gap 7.1e-3), S 1.6e-4 (gap 1.8e-4), statistic 1.000125;
#   rho 1.05: 126 iterations, weights 2.2e-4, L 3.4e-2: outside the gap;
#   rho 1.5 (the spec's revised default): 29 iterations, rank 17, weights 9.9e-3 off, L 15x its norm, statistic
#             1.0040. The primal residual falls like 1/mu and meets tol 1e-7 before the split has converged; a
#             tighter tol does not help (at 1e-10, 61 iterations, the same iterate: mu is then at its cap).
# The same at the full p = 28,938 on Dist1, Dist5 and Dist8 (integration test below; rho 1.5: weights 1.0e-1, 1.7e-2,
# 1.5e-1 off, statistic 1.025, 1.0047, 1.047). Reported to the spec's owners: the revised default does not reach the
# constant mu's weights on this setting; rho = 1.02 does, in 250 iterations instead of 1,600-3,700.
@pytest.mark.parametrize("mu_growth", [
    1.02,
    pytest.param(rpca.MU_GROWTH, marks=pytest.mark.xfail(strict=True, reason="the spec's revised default rho = 1.5 "
                                                          "stops at another iterate on this setting (see above)"))])
def test_growing_and_constant_mu_reach_the_same_weights_on_the_table_3_4_setting(mu_growth):
    M, s2 = table34_uploads(5_000)  # scaled down: the first 5,000 coordinates (constant mu: ~2 s, not ~45 s)
    check_same_solution(M, s2, mu_growth)


def test_table_3_4_weights_through_the_aggregator_equal_the_pcp_weights():
    M, _ = table34_uploads(5_000)
    _, _, w, _ = pcp_weights(M, mu_growth=1.02)
    step = run(RobustHDP(mu_growth=1.02), {"w": torch.from_numpy(np.ascontiguousarray(M.T))})
    np.testing.assert_allclose(last_weights(step.state).numpy(), w, rtol=1e-12)


@pytest.mark.integration  # calibration ~25 s and three constant-mu solves of 28,938 x 20 (~2 min)
def test_growing_mu_on_the_full_table_3_4_setting():
    import math

    from dpfl.privacy.budget_distributions import RHDP_BATCH20, RHDP_EPS20
    from dpfl.privacy.events import dpsgd_event
    from dpfl.privacy.two_stage import calibrate_grid

    z = [calibrate_grid(lambda s, b=b: dpsgd_event(s, 200 * math.ceil(2400 / b), sampling="poisson",
                                                   sample_rate=b / 2400), eps, 1e-4)
         for eps, b in zip(RHDP_EPS20["Dist5"], RHDP_BATCH20, strict=True)]
    assert z == pytest.approx(RHDP_Z_DIST5, abs=1e-9)
    M, s2 = table34_uploads(TABLE34_P)
    check_same_solution(M, s2, 1.02)

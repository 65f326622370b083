"""PFA aggregator (spec heterogeneous_dp §4.2; tests §8 items 1, 2, 12 and §6, §9.9)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.pfa import PFA, NoPublicClients, cluster_split, top_fraction_split
from dpfl.algorithms.server.subspace import SUBSPACES, fit_subspace, principal_angles
from dpfl.algorithms.server.view import ServerView
from dpfl.privacy.budgets import draw_budgets

MODES = SUBSPACES  # centered, second-moment, mean-outer, random


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _uploads(K: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = _gen(seed)
    return {"w": torch.randn(K, 4, 5, generator=g), "b": torch.randn(K, 5, generator=g),
            "c": torch.randn(K, 3, generator=g)}


def _zeros(uploads):
    return {n: torch.zeros(u.shape[1:]) for n, u in uploads.items()}


def _rel(a: dict, b: dict) -> float:
    num = sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in a) ** 0.5
    den = sum(float(b[n].double().pow(2).sum()) for n in b) ** 0.5
    return num / den


# ---- §8.1: all public == WeiAvg ---------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scope", ["tensor", "model"])
def test_all_public_equals_weiavg(mode, scope):
    K = 7
    eps = torch.tensor([0.1, 0.5, 1.0, 2.0, 3.0, 9.0, 10.0], dtype=torch.float64)
    view = ServerView.simple([100] * K, eps_reported=eps)
    ups = _uploads(K)
    g0 = {n: torch.randn(u.shape[1:], generator=_gen(5)) for n, u in ups.items()}
    pfa = PFA(split="explicit", public_clients=tuple(range(K)), subspace=mode, scope=scope, server_lr=0.7)
    got = pfa.aggregate(g0, ups, view, seed=3, round_=2)
    want = FedAvg("epsilon", server_lr=0.7).aggregate(g0, ups, view, seed=3, round_=2)
    assert _rel(got, want) < 1e-6
    torch.testing.assert_close(pfa.weights(view), FedAvg("epsilon").weights(view))


# ---- §8.2: projection idempotence -------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("solver", ["exact", "lanczos"])
def test_projection_idempotent(mode, solver):
    g = _gen(1)
    U = torch.randn(6, 300, generator=g, dtype=torch.float64) + 2.0
    d_pub = U.mean(0)
    k = 1 if mode == "mean-outer" else 3
    sub = fit_subspace(U, k, mode, solver, d_pub=d_pub, generator=_gen(2), random_center=(mode == "random"))
    assert sub.k == k
    torch.testing.assert_close(sub.V.T @ sub.V, torch.eye(k, dtype=torch.float64), atol=1e-6, rtol=0)
    x = torch.randn(5, 300, generator=g, dtype=torch.float64)
    px = sub.project(x)
    torch.testing.assert_close(sub.project(px), px, atol=1e-9, rtol=1e-9)
    on = sub.mu + torch.randn(4, k, generator=g, dtype=torch.float64) @ sub.V.T  # points of μ + span(V)
    torch.testing.assert_close(sub.project(on), on, atol=1e-9, rtol=1e-9)
    if mode == "centered":  # the centred subspace passes through the public mean and spans its deviations
        torch.testing.assert_close(sub.mu, U.mean(0))


def test_centered_single_public_client_has_zero_mean_and_k_is_truncated_to_rank():
    U = torch.randn(1, 50, generator=_gen(0), dtype=torch.float64)
    sub = fit_subspace(U, 1, "centered")
    assert torch.equal(sub.mu, torch.zeros(50, dtype=torch.float64))
    torch.testing.assert_close(sub.V[:, 0].abs(), (U[0] / U[0].norm()).abs())
    U4 = torch.randn(4, 50, generator=_gen(1), dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="truncated to 3"):  # centred rank <= |S_pub| - 1
        assert fit_subspace(U4, 5, "centered").k == 3
    with pytest.warns(RuntimeWarning, match="truncated to 3"):
        assert fit_subspace(U4, 5, "centered", "lanczos", generator=_gen(2)).k == 3


# ---- §8.12: top_fraction counts, Lanczos vs exact --------------------------------------------------

@pytest.mark.parametrize("M,expected", [(20, 2), (30, 3), (40, 4), (50, 5)])
def test_top_fraction_mixgauss1(M, expected):
    # The count is max(1, floor(0.1 M)) for any tie-free draw, so it does not depend on the seed:
    # checked over several seeds of draw_budgets("MixGauss1", M, default_rng(seed)).
    for seed in range(5):
        eps = draw_budgets("MixGauss1", M, np.random.default_rng(seed))
        mask = top_fraction_split(eps)
        assert mask.sum() == expected
        assert eps[mask].min() > eps[~mask].max()


def test_top_fraction_ties_and_guard():
    assert top_fraction_split(np.array([1.0, 2.0, 3.0])).tolist() == [False, False, True]  # M < 10: max(1, ·)
    eps = np.array([0.1] * 17 + [5.0, 5.0, 5.0])  # 3 tied at the 2nd-largest value: all 3 public
    assert top_fraction_split(eps).sum() == 3
    assert top_fraction_split(np.array([0.1] * 18 + [7.0, 9.0])).tolist() == [False] * 18 + [True, True]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("mode", ["centered", "second-moment"])
def test_lanczos_matches_exact(k, mode):
    g = _gen(10 + k)
    scales = torch.tensor([20.0, 12.0, 7.0, 4.0, 2.5, 1.5, 1.0, 0.5], dtype=torch.float64)
    U = (torch.randn(8, 8, generator=g, dtype=torch.float64) * scales) @ torch.linalg.qr(
        torch.randn(2000, 8, generator=g, dtype=torch.float64))[0].T + 1.0
    ex = fit_subspace(U, k, mode, "exact")
    lz = fit_subspace(U, k, mode, "lanczos", generator=_gen(99), lanczos_iters=128)
    assert float(principal_angles(ex.V, lz.V).max()) < 1e-4
    torch.testing.assert_close(ex.mu, lz.mu)


def test_lanczos_aggregate_matches_exact():
    K = 10
    eps = torch.tensor([10.0, 9.0, 8.0, 7.5] + [0.5] * 6, dtype=torch.float64)
    view = ServerView.simple([50] * K, eps_reported=eps)
    ups = _uploads(K, seed=4)
    a = PFA(split="explicit", public_clients=(0, 1, 2, 3), k=2).aggregate(_zeros(ups), ups, view, 0, 1)
    b = PFA(split="explicit", public_clients=(0, 1, 2, 3), k=2,
            svd_solver="lanczos").aggregate(_zeros(ups), ups, view, 0, 1)
    assert _rel(a, b) < 1e-6


# ---- aggregation formula, per-tensor scope, randomness ---------------------------------------------

def test_aggregate_matches_formula_per_tensor():
    K = 9
    eps = torch.tensor([0.2, 0.3, 8.0, 0.4, 9.0, 0.5, 10.0, 0.6, 0.7], dtype=torch.float64)
    view = ServerView.simple([10] * K, eps_reported=eps)
    ups = _uploads(K, seed=7)
    pfa = PFA(k=2, public_fraction=0.3)  # top 2 of 9 -> ⌊2.7⌋ = 2 public: clients 4 and 6
    assert pfa.public_mask(view).nonzero().ravel().tolist() == [4, 6]
    with pytest.warns(RuntimeWarning, match="k=2 truncated to 1"):  # 2 public, centred: rank 1
        got = pfa.mean_update(ups, view, seed=0, round_=0)
    pub, pri = [4, 6], [0, 1, 2, 3, 5, 7, 8]
    for name, u in ups.items():
        X = u.flatten(1).double()
        e_pub, e_pri = eps[pub].sum(), eps[pri].sum()
        d_pub = (eps[pub] / e_pub) @ X[pub]
        d_pri = (eps[pri] / e_pri) @ X[pri]
        mu = X[pub].mean(0)
        _, _, Vh = torch.linalg.svd(X[pub] - mu, full_matrices=False)
        V = Vh[:1].T
        want = (e_pub * d_pub + e_pri * (mu + V @ (V.T @ (d_pri - mu)))) / (e_pub + e_pri)
        torch.testing.assert_close(got[name].double().ravel(), want, atol=1e-6, rtol=1e-6)


def test_scope_model_differs_from_tensor_and_random_is_seeded():
    K = 8
    eps = torch.tensor([9.0, 8.0, 7.0, 6.0, 0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    view = ServerView.simple([10] * K, eps_reported=eps)
    ups = _uploads(K, seed=2)
    base = dict(split="explicit", public_clients=(0, 1, 2, 3))
    t = PFA(**base).mean_update(ups, view, 0, 0)
    m = PFA(**base, scope="model").mean_update(ups, view, 0, 0)
    assert _rel(t, m) > 1e-3
    r1 = PFA(**base, subspace="random", k=2).mean_update(ups, view, 5, 3)
    r2 = PFA(**base, subspace="random", k=2).mean_update(ups, view, 5, 3)
    r3 = PFA(**base, subspace="random", k=2).mean_update(ups, view, 5, 4)
    assert all(torch.equal(r1[n], r2[n]) for n in r1)
    assert _rel(r1, r3) > 1e-6


def test_no_public_raises_and_count_weighting():
    eps = torch.tensor([0.1, 0.2, 5.0], dtype=torch.float64)
    view = ServerView.simple([10] * 3, eps_reported=eps)
    ups = _uploads(3)
    with pytest.raises(NoPublicClients):
        PFA(split="explicit", public_clients=(7,)).mean_update(ups, view, 0, 0)
    # count weighting, all public: a plain mean (the code's un-weighted class)
    got = PFA(split="explicit", public_clients=(0, 1, 2), weighting="count").mean_update(ups, view, 0, 0)
    for n, u in ups.items():
        torch.testing.assert_close(got[n], u.mean(0))


@pytest.mark.parametrize("bad", [
    dict(k=0), dict(k=1.5), dict(subspace="pca"), dict(split="median"), dict(scope="layer"),
    dict(svd_solver="arpack"), dict(weighting="size"), dict(subspace="mean-outer", k=2),
    dict(split="explicit"), dict(public_fraction=0.0), dict(svd_solver="lanczos", k=5, lanczos_iters=4),
    dict(server_lr=0.0), dict(public_clients=(1, 1)),
])
def test_bad_options(bad):
    with pytest.raises(ValueError):
        PFA(**bad)


def test_undeclared_budget_raises():
    view = ServerView.simple([10, 10])  # eps = inf
    with pytest.raises(ValueError, match="epsilon"):
        PFA().mean_update(_uploads(2), view, 0, 0)


# ---- splits: fitted over the population, gmm / kmeans ---------------------------------------------

def test_fit_split_population_and_clusters():
    eps = draw_budgets("MixGauss1", 30, np.random.default_rng(0))
    top = PFA().fit_split(np.arange(30), eps)
    assert len(top.public_clients) == 3
    high = set(np.nonzero(eps > 1.0)[0].tolist())  # the N(10, 0.1) component
    for method in ("gmm", "kmeans"):
        assert set(np.nonzero(cluster_split(eps, method, seed=1))[0].tolist()) == high
        fitted = PFA(split=method).fit_split(np.arange(30), eps, seed=1)
        assert set(fitted.public_clients) == high
    # a round's view: only the participants that are in the fitted public set are public
    view = ServerView(torch.tensor([0, 1, 2, 3, 4]), torch.full((5,), 10), torch.ones(5, dtype=torch.int64),
                      torch.as_tensor(eps[:5]), torch.zeros(5, dtype=torch.float64), 5.0)
    assert top.public_mask(view).tolist() == [i in top.public_clients for i in range(5)]


# ---- §6: misreport ------------------------------------------------------------------------------------

def test_misreporting_client_becomes_public_and_gains_weight():
    # client 4 truly has ε = 1.2 and reports 10x (12.0), above every honest report
    eps = np.array([0.1, 0.12, 0.09, 0.11, 1.2, 0.1, 0.1, 0.13, 0.1, 0.1,
                    10.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 9.9, 0.1, 0.1])
    lied = eps.copy()
    lied[4] *= 10
    honest = PFA().fit_split(np.arange(20), eps)
    liar = PFA().fit_split(np.arange(20), lied)
    assert honest.public_clients == (10, 17)
    assert liar.public_clients == (4, 10)  # the liar displaces an honest public client
    for method in ("gmm", "kmeans"):
        assert 4 not in PFA(split=method).fit_split(np.arange(20), eps, seed=0).public_clients
        assert 4 in PFA(split=method).fit_split(np.arange(20), lied, seed=0).public_clients
    w_h = PFA().weights(ServerView.simple([10] * 20, eps_reported=eps))
    w_l = PFA().weights(ServerView.simple([10] * 20, eps_reported=lied))
    assert w_l[4] > 5 * w_h[4] and w_l[4] == w_l.max()


# ---- noise reduction sanity check -------------------------------------------------------------------

def test_pfa_reduces_private_noise_vs_weiavg():
    """Shared rank-2 signal + per-client noise with std ∝ 1/ε: PFA is closer to the signal than WeiAvg.

    40 clients, 4 public (ε 8..10), 36 private (ε in [0.2, 1]); noise norm 1/ε per client, signal norm ≈ 3.2.
    Observed (seed 0, k = 2): err_pfa ≈ 0.0175 vs err_weiavg ≈ 0.0321 (ratio 0.55; over seeds 0-4 the ratio is
    0.50-0.70); for the private group alone the projection cuts the error of its mean 3.6x (0.274 -> 0.076,
    what is left being mostly the public mean μ and its noise).
    The remaining PFA error is the public clients' own noise, which both methods keep.
    """
    g = _gen(0)
    K, p, n_pub = 40, 4000, 4
    eps = torch.cat([torch.linspace(8, 10, n_pub, dtype=torch.float64),
                     0.2 + 0.8 * torch.rand(K - n_pub, generator=g, dtype=torch.float64)])
    basis = torch.linalg.qr(torch.randn(p, 2, generator=g, dtype=torch.float64))[0]
    coef = torch.tensor([3.0, 1.0], dtype=torch.float64) + 0.5 * torch.randn(K, 2, generator=g, dtype=torch.float64)
    signal = coef @ basis.T  # [K, p], rank 2
    noise = torch.randn(K, p, generator=g, dtype=torch.float64) * (1.0 / eps)[:, None] / p**0.5
    X = signal + noise
    ups = {"w": X.reshape(K, 40, 100).float()}
    view = ServerView.simple([10] * K, eps_reported=eps)
    zero = {"w": torch.zeros(40, 100)}
    target = (eps / eps.sum()) @ signal  # the noiseless WeiAvg aggregate
    pfa = PFA(k=2).fit_split(view.clients, eps)
    assert pfa.public_clients == (0, 1, 2, 3)
    wei = FedAvg("epsilon").aggregate(zero, ups, view, 0, 0)["w"].double().ravel()
    got = pfa.aggregate(zero, ups, view, 0, 0)["w"].double().ravel()
    err_wei = float((wei - target).norm() / target.norm())
    err_pfa = float((got - target).norm() / target.norm())
    assert err_pfa < 0.7 * err_wei, (err_pfa, err_wei)
    # the private group alone: projection onto the public subspace removes most of its noise
    w_pri = eps[n_pub:] / eps[n_pub:].sum()
    d_pri, s_pri = w_pri @ X[n_pub:].float().double(), w_pri @ signal[n_pub:]
    sub = fit_subspace(X[:n_pub].float().double(), 2, "centered")
    before = float((d_pri - s_pri).norm())
    after = float((sub.project(d_pri) - s_pri).norm())
    assert after < before / 2.5, (before, after)


# ---- §5: pfa_noise_passthrough ----------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("scope", ["tensor", "model"])
@pytest.mark.parametrize("public", [(2, 4, 6), (6,)])
def test_noise_passthrough_is_the_rounds_map_applied_to_the_noise(mode, scope, public):
    """With the subspaces fitted to the uploads fixed, Δ̄ is linear in the uploads: the map applied to the clean
    updates plus the map applied to their noise is Δ̄ itself (every subspace mode, both scopes, a centred and an
    uncentred public group), and the noise part differs from Δ̄ of the noise alone (whose subspaces differ)."""
    K = 8
    eps = torch.tensor([0.2, 0.3, 8.0, 0.4, 9.0, 0.5, 10.0, 0.6], dtype=torch.float64)
    view = ServerView.simple([10] * K, eps_reported=eps)
    clean = _uploads(K, seed=3)
    noise = {n: 0.5 * torch.randn(u.shape, generator=_gen(4), dtype=torch.float64) for n, u in clean.items()}
    uploads = {n: (clean[n].double() + noise[n]).float() for n in clean}
    exact = {n: uploads[n].double() - noise[n] for n in uploads}  # the float32 uploads minus the noise
    pfa = PFA(split="explicit", public_clients=public, subspace=mode, scope=scope)
    total = {n: t.double() for n, t in pfa.mean_update(uploads, view, seed=1, round_=2).items()}
    noise_part = pfa.noise_passthrough(uploads, noise, view, seed=1, round_=2)
    clean_part = pfa.noise_passthrough(uploads, exact, view, seed=1, round_=2)
    assert all(t.dtype == torch.float64 for t in noise_part.values())
    assert _rel({n: noise_part[n] + clean_part[n] for n in total}, total) < 1e-6  # float32 Δ̄
    if mode != "random":  # a random basis does not depend on the uploads
        alone = pfa.mean_update({n: t.float() for n, t in noise.items()}, view, seed=1, round_=2)
        assert _rel(noise_part, {n: t.double() for n, t in alone.items()}) > 1e-3


def test_noise_passthrough_with_every_client_public_is_the_weighted_noise_and_bad_noise_is_refused():
    K = 5
    eps = torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    view = ServerView.simple([10] * K, eps_reported=eps)
    uploads = _uploads(K, seed=5)
    noise = {n: torch.randn(u.shape, generator=_gen(6), dtype=torch.float64) for n, u in uploads.items()}
    pfa = PFA(split="explicit", public_clients=tuple(range(K)))
    got = pfa.noise_passthrough(uploads, noise, view, seed=0, round_=0)
    w = eps / eps.sum()
    for n, t in noise.items():
        torch.testing.assert_close(got[n], torch.einsum("k,k...->...", w, t))
    with pytest.raises(ValueError, match="the uploads' tensors and shapes"):
        pfa.noise_passthrough(uploads, {"w": noise["w"]}, view, seed=0, round_=0)

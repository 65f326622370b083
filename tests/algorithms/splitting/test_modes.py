"""§12.7: execution modes and partial participation."""

import pytest
import torch

from dpfl.algorithms.client.local_operators import ExactLeastSquaresProx, GradientSteps
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.splitting import presets
from dpfl.reproduce.splitting_solver import run_splitting


def local_for(name):
    return GradientSteps(2) if presets.PRESETS[name][3] == "gradient" else ExactLeastSquaresProx()


@pytest.mark.parametrize("name", list(presets.PRESETS))
def test_centralized_and_decentralized_give_identical_iterates(ls, name):
    eta = 0.5 / ls.max_eig
    runs = [run_splitting(ls.fns, presets.make(name, eta, local_for(name), mode=mode), 30)
            for mode in ("centralized", "decentralized")]
    for a, b in zip(*(r.history for r in runs), strict=True):
        assert a["dist"] == pytest.approx(b["dist"], rel=1e-12, abs=1e-12)
        assert a["bytes_up"] == b["bytes_up"]


def test_decentralized_partial_participation_for_beta_gamma_one(ls):
    eta, sel = 1.0 / ls.mean_eig, Selection("poisson", rate=0.5)
    runs = [run_splitting(ls.fns, presets.fedrp(eta, local=ExactLeastSquaresProx(), mode=mode, participation=sel), 30,
                          seed=4) for mode in ("centralized", "decentralized")]
    assert any(row["participants"] < ls.fns.n_clients for row in runs[0].history)
    for a, b in zip(*(r.history for r in runs), strict=True):
        assert a["dist"] == pytest.approx(b["dist"], rel=1e-12, abs=1e-12)


def test_participation_one_equals_full_participation(ls):
    eta = 1.0 / ls.mean_eig
    full = run_splitting(ls.fns, presets.fedpi(eta, local=ExactLeastSquaresProx()), 20)
    p1 = run_splitting(ls.fns, presets.fedpi(eta, local=ExactLeastSquaresProx(),
                                             participation=Selection("poisson", rate=1.0)), 20)
    assert [r["dist"] for r in full.history] == [r["dist"] for r in p1.history]


def test_non_participants_keep_z_and_xbar_is_the_renormalised_participant_mean(ls):
    eta = 1.0 / ls.mean_eig
    server = presets.fedpi(eta, local=ExactLeastSquaresProx()).server(torch.zeros(ls.fns.dim, dtype=torch.float64),
                                                                      ls.fns.n_records)
    everyone = torch.arange(ls.fns.n_clients)
    for t in range(3):
        server.round(ls.fns, everyone, eta, 0, t)
    z_before, u_before = server.z.clone(), server.u.clone()
    idx = torch.tensor([1, 3])
    res = server.round(ls.fns, idx, eta, 0, 3)
    others = torch.tensor([0, 2, 4])
    assert torch.equal(server.z[others], z_before[others])
    lam = torch.as_tensor(ls.lam)
    expected_xbar = (lam[idx] / lam[idx].sum()) @ server.z[idx]
    assert torch.allclose(res.xbar, expected_xbar, atol=1e-13)
    # every client's u moves, from its (possibly stale) z: u = (1 - gamma) u + gamma (2 xbar - z) for fedpi
    assert torch.allclose(server.u, 0.5 * u_before + 0.5 * (2 * res.xbar - server.z), atol=1e-12)


def test_an_empty_round_is_a_logged_no_op(ls):
    eta = 1.0 / ls.mean_eig
    server = presets.fedpi(eta, local=ExactLeastSquaresProx()).server(torch.zeros(ls.fns.dim, dtype=torch.float64),
                                                                      ls.fns.n_records)
    server.round(ls.fns, torch.arange(ls.fns.n_clients), eta, 0, 0)
    u, z = server.u.clone(), server.z.clone()
    res = server.round(ls.fns, torch.tensor([], dtype=torch.int64), eta, 0, 1)
    assert res.anderson == "skipped" and res.participants == 0
    assert torch.equal(server.u, u) and torch.equal(server.z, z)

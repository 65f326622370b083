"""MP_Server and LMT (spec bidirectional.md §3-§4, T6-T13): the expanded net, its identities, exact recovery."""

import pickle

import numpy as np
import pytest
import torch

from dpfl.algorithms.secure.mpdp.lmt import UnsupportedLossError, clip_joint, lmt
from dpfl.algorithms.secure.mpdp.perturb import FactorPlan, forward, mp_server, recover


def _model(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(sizes[l], sizes[l - 1], generator=g, dtype=torch.float64) / sizes[l - 1] ** 0.5
            for l in range(1, len(sizes))]


def _batch(sizes, B, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(B, sizes[0], generator=g, dtype=torch.float64)
    y = torch.nn.functional.one_hot(torch.randint(0, sizes[-1], (B,), generator=g), sizes[-1]).to(torch.float64)
    return x, y


def _true_grads(weights, x, y):
    ws = [w.clone().requires_grad_(True) for w in weights]
    out, _ = forward(ws, None, x)
    loss = 0.5 * ((out - y) ** 2).sum(1).mean()
    return list(torch.autograd.grad(loss, ws))


def test_expanded_layers_and_factor_layout():  # T6
    plan = FactorPlan((6, 5, 4, 3))
    W = _model(plan.sizes)
    payload, sec = mp_server(W, plan, np.random.default_rng(0), round_id=3)
    assert len(payload.odd) + len(payload.transitional) == 2 * plan.layers - 1
    assert torch.allclose(payload.odd[0], sec.r[0][:, None] * W[0])
    assert torch.allclose(payload.odd[1], torch.outer(sec.r[1], sec.s[0]) * W[1])
    assert torch.allclose(payload.odd[2], sec.s[1][None, :] * W[2] + sec.mask[:, None])
    for l, d in enumerate(payload.transitional, start=1):
        assert d.shape == (plan.sizes[l],) and torch.allclose(d, 1 / (sec.s[l - 1] * sec.r[l - 1]))
    assert all((f > 0).all() for f in sec.r + sec.s)


def test_two_layer_case_uses_dn_star_1_for_both_factors():  # T6, L = 2
    plan = FactorPlan((4, 50_000, 3))
    _, sec = mp_server(_model(plan.sizes), plan, np.random.default_rng(0))
    for f in (sec.r[0], sec.s[0]):  # |DN*(1)| = sqrt(Gamma(3/2)): E = 2/sqrt(pi), E[f^2] = 3/2
        assert float(f.mean()) == pytest.approx(2 / np.pi**0.5, rel=0.01)
        assert float((f**2).mean()) == pytest.approx(1.5, rel=0.02)


@pytest.mark.parametrize("sizes", [(5, 7, 3), (6, 5, 4, 3), (8, 6, 6, 5, 5, 4)])
def test_forward_identities(sizes):  # T7 (Theorem 12)
    plan = FactorPlan(sizes)
    W = _model(sizes)
    payload, sec = mp_server(W, plan, np.random.default_rng(1))
    x, _ = _batch(sizes, 9)
    y_true, _ = forward(W, None, x)
    y_hat, alpha = forward(list(payload.odd), payload.transitional, x)
    assert torch.allclose(y_hat, y_true + alpha[:, None] * sec.mask[None, :], rtol=0, atol=1e-12)
    h_true, h_hat = x, x  # hidden layers: r^(l) times the true activations, then 1/s^(l) after the transitional
    for l in range(plan.layers - 1):
        h_true = torch.relu(h_true @ W[l].T)
        h_hat = torch.relu(h_hat @ payload.odd[l].T)
        assert torch.allclose(h_hat, sec.r[l] * h_true, rtol=0, atol=1e-12)
        h_hat = torch.relu(h_hat * payload.transitional[l])
        assert torch.allclose(h_hat, h_true / sec.s[l], rtol=0, atol=1e-12)


def test_secrets_are_fresh_each_round_and_absent_from_the_payload():  # T8
    plan = FactorPlan((6, 5, 4, 3))
    W = _model(plan.sizes)
    gen = np.random.default_rng(2)
    (p1, s1), (_, s2) = mp_server(W, plan, gen, 0), mp_server(W, plan, gen, 1)
    assert not torch.equal(s1.r[0], s2.r[0]) and not torch.equal(s1.gamma, s2.gamma)
    blob = pickle.dumps(p1)
    for secret in s1.r + s1.s + (s1.gamma, s1.r_a, s1.mask):
        assert secret.numpy().tobytes() not in blob
    assert set(vars(p1)) == {"odd", "transitional", "sizes", "round_id", "plan", "shortcuts", "attempt"}


def test_mask_scale_is_honoured():  # T9
    plan = FactorPlan((4, 5, 20_000))
    _, sec = mp_server(_model(plan.sizes), plan, np.random.default_rng(3), mask_scale=3.0)
    assert float(sec.gamma.std()) == pytest.approx(3.0, rel=0.03)
    assert float(sec.r_a.std()) == pytest.approx(3.0, rel=0.03)


@pytest.mark.parametrize("sizes", [(5, 7, 3), (6, 5, 4, 3), (8, 6, 6, 5, 5, 4)])
@pytest.mark.parametrize("B", [1, 16])
def test_exact_recovery(sizes, B):  # T10
    plan = FactorPlan(sizes)
    W = _model(sizes)
    payload, sec = mp_server(W, plan, np.random.default_rng(4))
    x, y = _batch(sizes, B)
    res = lmt(payload, x, y)
    got = recover(res.grads, res.psi, res.phi, sec)
    want = _true_grads(W, x, y)
    scale = max(1.0, max(float(w.abs().max()) for w in want))
    for g, w in zip(got, want, strict=True):
        assert float((g - w).abs().max()) <= 1e-10 * scale


def test_batched_vmap_and_loop_agree():  # T11
    plan = FactorPlan((6, 5, 4, 3))
    payload, _ = mp_server(_model(plan.sizes), plan, np.random.default_rng(5))
    x, y = _batch(plan.sizes, 8)
    ref = lmt(payload, x, y, method="loop")
    for method, chunk in (("batched", None), ("batched", 2), ("vmap", None)):
        res = lmt(payload, x, y, method=method, psi_chunk=chunk)
        for a, b in zip(ref.grads + ref.psi + ref.phi, res.grads + res.psi + res.phi, strict=True):
            assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_joint_clipping_recovers_exactly_the_clipped_gradient():  # T12
    plan = FactorPlan((6, 5, 4, 3))
    W = _model(plan.sizes)
    payload, sec = mp_server(W, plan, np.random.default_rng(6))
    x, y = _batch(plan.sizes, 8)
    res = lmt(payload, x, y)
    bound = 0.1 * res.grad_norm
    clipped = clip_joint(res, bound)
    assert clipped.clip_factor == pytest.approx(0.1) and clipped.grad_norm == pytest.approx(bound)
    got = recover(clipped.grads, clipped.psi, clipped.phi, sec)
    for g, w in zip(got, _true_grads(W, x, y), strict=True):
        assert torch.allclose(g, 0.1 * w, rtol=0, atol=1e-11)


def test_cross_entropy_is_refused():  # T13 (local_steps > 1 is refused by the round)
    plan = FactorPlan((4, 3, 2))
    payload, _ = mp_server(_model(plan.sizes), plan, np.random.default_rng(7))
    x, y = _batch(plan.sizes, 2)
    with pytest.raises(UnsupportedLossError, match="MSE"):
        lmt(payload, x, y, loss="cross_entropy")

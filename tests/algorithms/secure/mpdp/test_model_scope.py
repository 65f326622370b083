"""MP-DP beyond bias-free MLPs (spec bidirectional.md §7, T14, T15, T17): convolutions, pooling, biases, refusals."""

import numpy as np
import pytest
import torch
from scipy.stats import kstest
from torch import nn

from dpfl.algorithms.secure.mpdp.ddp import DDPClient, NoiseLayout, edge_seed, shared_x2
from dpfl.algorithms.secure.mpdp.dn import dn, dn_star_abs
from dpfl.algorithms.secure.mpdp.lmt import lmt
from dpfl.algorithms.secure.mpdp.perturb import FactorPlan, UnsupportedModelError, forward, mp_server, recover
from dpfl.models.mpdp_networks import TiedResidual, norm_free_resnet


def _init(plan, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64) * 0.4 for s in plan.shapes()]


def _data(shape, n_out, B=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(B, *shape, generator=g, dtype=torch.float64)
    y = torch.nn.functional.one_hot(torch.randint(0, n_out, (B,), generator=g), n_out).to(torch.float64)
    return x, y


def _true(plan, weights, x, y):
    ws = [w.clone().requires_grad_(True) for w in weights]
    out, _ = forward(ws, None, x, plan)
    return list(torch.autograd.grad(0.5 * ((out - y) ** 2).sum(1).mean(), ws))


def _assert_exact(plan, input_shape, seed=0):
    weights = _init(plan, seed)
    payload, sec = mp_server(weights, plan, np.random.default_rng(seed))
    x, y = _data(input_shape, plan.out_dim)
    y_true, _ = forward(weights, None, x, plan)
    y_hat, alpha = forward(list(payload.odd), payload.transitional, x, plan, payload.shortcuts)
    assert torch.allclose(y_hat, y_true + alpha[:, None] * sec.mask, rtol=0, atol=1e-10)
    res = lmt(payload, x, y)
    want = _true(plan, weights, x, y)
    scale = max(1.0, max(float(w.abs().max()) for w in want))
    for g, w in zip(recover(res.grads, res.psi, res.phi, sec), want, strict=True):
        assert float((g - w).abs().max()) <= 1e-10 * scale


def _cnn(bias):
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=bias), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 6, 3, padding=1, bias=bias), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                         nn.Linear(6 * 2 * 2, 5, bias=bias))


@pytest.mark.parametrize("bias", [False, True])
def test_conv_maxpool_flatten_recovers_exactly(bias):  # T14 (and T15 with biases)
    plan = FactorPlan.from_module(_cnn(bias), (1, 8, 8))
    assert plan.layers == 3 and [s.kind for s in plan.layer_specs] == ["conv", "conv", "linear"]
    assert plan.layer_specs[-1].in_repeat == 4  # each of the 6 channels feeds 2 x 2 features
    _assert_exact(plan, (1, 8, 8))


@pytest.mark.parametrize("sizes", [(5, 7, 3), (6, 5, 4, 3), (8, 6, 6, 5, 5, 4)])
def test_mlp_with_biases_recovers_exactly(sizes):  # T15
    _assert_exact(FactorPlan(sizes, bias=True), (sizes[0],))


def test_bias_noise_laws():  # T15: middle-layer R_b X DN(σ,1) is Gaussian, the pairwise X is the same at both ends
    sigma, n = 0.9, 50_000
    g = np.random.default_rng(0)
    r_b = dn_star_abs(2, n, g)  # a middle hidden bias's factor: one |DN*(2)|
    x_private = dn_star_abs(2, n, g)  # the client's extra factor for η
    z = (r_b * x_private * dn(sigma, 1, n, g)).numpy() / sigma
    assert kstest(z, "norm").pvalue > 1e-3
    a, b = DDPClient(1), DDPClient(2)
    seed_a, seed_b = edge_seed(a.keys, b.public, b"r", 0, 1, 2), edge_seed(b.keys, a.public, b"r", 0, 2, 1)
    x_edge = shared_x2(seed_a, 20_000)
    assert np.array_equal(x_edge, shared_x2(seed_b, 20_000))
    w = (dn_star_abs(2, 20_000, g).numpy() * x_edge * dn(sigma, 1, 20_000, g).numpy()) / sigma
    assert kstest(w, "norm").pvalue > 1e-3  # the stream-3 X (200 terms + tail) has the |DN*(2)| law
    plan = FactorPlan((4, 3, 3, 2), bias=True)
    layout = NoiseLayout.from_plan(plan)
    assert plan.noise_kinds() == ["dn", "dn", "dn", "dn_x2", "dn", "gaussian"]
    assert list(layout.x2) == list(range(12 + 3 + 9, 12 + 3 + 9 + 3)) and list(layout.gauss) == [33, 34]


def test_pairwise_noise_with_a_bias_layout_still_cancels():
    plan = FactorPlan((4, 3, 3, 2), bias=True)
    layout = NoiseLayout.from_plan(plan)
    clients = [DDPClient(k) for k in range(4)]
    total = sum(c.pairwise({o.cid: o.public for o in clients if o is not c}, layout.d, 10.0, b"r", 0, layout=layout)
                for c in clients)
    assert float(np.abs(total).max()) < 1e-10


@pytest.mark.parametrize("module,match", [
    (nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2)),
     "'1' \\(BatchNorm1d\\).*normalisation"),
    (nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)), "'1' \\(Tanh\\).*positively homogeneous"),
    (nn.Sequential(nn.Linear(4, 3), nn.GELU(), nn.Linear(3, 2)), "'1' \\(GELU\\)"),
    (nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2), nn.ReLU()), "last module must be a linear"),
    (nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Dropout(), nn.Linear(3, 2)), "'2' \\(Dropout\\).*unknown module"),
    (nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)), "followed by a ReLU"),
    (nn.Sequential(nn.Conv2d(1, 2, 3, groups=1, dilation=2), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2)), "plain conv"),
    (nn.Linear(4, 2), "nn.Sequential"),
    (nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3, 2)), "'2' \\(Flatten\\).*feature maps"),
])
def test_unsupported_modules_are_refused_by_name(module, match):  # T17 (residual blocks: not Sequential, refused)
    with pytest.raises(UnsupportedModelError, match=match):
        FactorPlan.from_module(module, (1, 4, 4) if isinstance(module[0] if isinstance(module, nn.Sequential) else
                                                             module, nn.Conv2d) else (4,))


@pytest.mark.parametrize("shape", [(12,), (3, 4), (3, 2, 2)])
def test_a_flatten_of_the_input_is_an_mlp(shape):
    """A Flatten before the first layer (the registry's MLPs take images) only reshapes the input, of any rank."""
    module = nn.Sequential(nn.Flatten(), nn.Linear(12, 5, bias=True), nn.ReLU(), nn.Linear(5, 3, bias=True))
    plan = FactorPlan.from_module(module.to(torch.float64), shape)
    assert plan.layer_specs == FactorPlan((12, 5, 3), bias=True).layer_specs
    x, _ = _data(shape, plan.out_dim)
    assert torch.allclose(forward(_module_weights(module), None, x, plan)[0], module(x), rtol=0, atol=1e-12)
    _assert_exact(plan, shape)


def _module_weights(module):
    return [p.detach().to(torch.float64).clone() for p in module.parameters()]


def _residual_cnn(bias):
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=bias), nn.ReLU(),
                         TiedResidual(nn.Conv2d(4, 4, 3, padding=1, bias=bias), nn.ReLU(),
                                      nn.Conv2d(4, 4, 3, padding=1, bias=bias)),
                         nn.MaxPool2d(2),
                         TiedResidual(nn.Conv2d(4, 4, 3, padding=1, bias=bias), nn.ReLU(),
                                      nn.Conv2d(4, 4, 3, padding=1, bias=bias)),
                         nn.Flatten(), nn.Linear(4 * 4 * 4, 5, bias=bias))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("build,shape", [
    (_residual_cnn, (1, 8, 8)),
    (lambda bias: nn.Sequential(nn.Linear(5, 6, bias=bias), nn.ReLU(),
                                TiedResidual(nn.Linear(6, 6, bias=bias), nn.ReLU(), nn.Linear(6, 6, bias=bias)),
                                nn.Linear(6, 3, bias=bias)), (5,)),
    (lambda bias: norm_free_resnet(2, 6, 4, widths=(3, 5), blocks=2, bias=bias), (2, 6, 6)),
])
def test_tied_residual_blocks_recover_exactly(build, shape, bias):  # T16
    torch.manual_seed(0)
    module = build(bias).to(torch.float64)
    plan = FactorPlan.from_module(module, shape, allow_residual=True)
    assert plan.skips and all(sk.source < sk.target for sk in plan.skips)
    x, _ = _data(shape, plan.out_dim)
    plain, _ = forward(_module_weights(module), None, x, plan)  # the plan computes the module
    assert torch.allclose(plain, module(x), rtol=0, atol=1e-12)
    _assert_exact(plan, shape)


def test_the_shortcut_diagonal_is_r_out_times_s_in():
    plan = FactorPlan.from_module(_residual_cnn(False), (1, 8, 8), allow_residual=True)
    assert [(sk.source, sk.target) for sk in plan.skips] == [(0, 2), (2, 4)]
    payload, sec = mp_server(_init(plan), plan, np.random.default_rng(3))
    assert torch.equal(payload.shortcuts[1], sec.r[4] * sec.s[2])
    with pytest.raises(ValueError, match="shortcut diagonals"):  # the expanded net cannot skip them
        forward(list(payload.odd), payload.transitional, torch.rand(2, 1, 8, 8, dtype=torch.float64), plan)


@pytest.mark.parametrize("module,match,allow", [
    (_residual_cnn(False), "'2' \\(TiedResidual\\).*experimental.*allow_residual", False),
    (nn.Sequential(nn.Linear(4, 4), nn.ReLU(), TiedResidual(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 3)),
                   nn.Linear(3, 2)), "identity shortcuts", True),
    (nn.Sequential(nn.Linear(4, 4), nn.ReLU(), TiedResidual(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 2)),
     "must end with a trainable layer", True),
    (nn.Sequential(TiedResidual(nn.Linear(4, 4)), nn.Linear(4, 2)), "must follow a hidden layer", True),
    (nn.Sequential(nn.Linear(4, 4), nn.ReLU(),
                   TiedResidual(nn.Linear(4, 4), nn.ReLU(), TiedResidual(nn.Linear(4, 4)), nn.Linear(4, 4)),
                   nn.Linear(4, 2)), "cannot be nested", True),
])
def test_residual_blocks_are_refused_unless_allowed_and_tied(module, match, allow):  # T16
    shape = (1, 8, 8) if isinstance(module[0], nn.Conv2d) else (4,)
    with pytest.raises(UnsupportedModelError, match=match):
        FactorPlan.from_module(module, shape, allow_residual=allow)

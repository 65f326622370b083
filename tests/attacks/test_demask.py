"""Adaptive demasking of MP-DP's perturbed model (spec bidirectional.md §10, W3, T32)."""

import numpy as np
import pytest
import torch
from torch import nn

from dpfl.algorithms.secure.mpdp.perturb import FactorPlan, forward, mp_server
from dpfl.algorithms.secure.mpdp.views import ClientView
from dpfl.attacks.demask import demask
from dpfl.models.mpdp_networks import norm_free_resnet


def _init(plan, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64) * 0.5 for s in plan.shapes()]


@pytest.mark.parametrize("plan,shape", [
    (FactorPlan((6, 8, 5, 3)), (6,)),
    (FactorPlan((6, 8, 5, 3), bias=True), (6,)),
    (FactorPlan.from_module(nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                                          nn.Linear(3 * 4 * 4, 4)), (1, 8, 8)), (1, 8, 8)),
    (FactorPlan.from_module(norm_free_resnet(1, 6, 4, widths=(3, 4), blocks=1, bias=True), (1, 6, 6),
                            allow_residual=True), (1, 6, 6)),
])
def test_teacher_targets_recover_the_mask_and_the_true_function(plan, shape):  # T32
    weights = _init(plan)
    payload, sec = mp_server(weights, plan, np.random.default_rng(0), mask_scale=2.0)
    view = ClientView(payload)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(200, *shape, generator=g, dtype=torch.float64)
    teacher, _ = forward(weights, None, x, plan)
    attack = demask(view, x, teacher)
    assert torch.allclose(attack.r_hat, sec.mask, rtol=0, atol=1e-6)
    x_new = torch.rand(50, *shape, generator=g, dtype=torch.float64)
    truth, _ = forward(weights, None, x_new, plan)
    assert torch.allclose(attack.predict(x_new, view), truth, rtol=0, atol=1e-6)
    # without the attack the perturbed model's outputs are far from the truth
    y_hat, _ = view.outputs(x_new)
    assert float((y_hat - truth).abs().max()) > 0.1


def test_folding_reproduces_the_perturbed_outputs():
    plan = FactorPlan((6, 8, 5, 3), bias=True)
    payload, _ = mp_server(_init(plan), plan, np.random.default_rng(2))
    view = ClientView(payload)
    x = torch.rand(10, 6, dtype=torch.float64)
    folded, _ = forward(view.folded(), None, x, plan)
    assert torch.allclose(folded, view.outputs(x)[0], rtol=0, atol=1e-10)

"""Per-sample losses: values, and that each works under vmap for per-sample gradients."""

import pytest
import torch
from torch.func import grad, vmap

from dpfl.engine.losses import LOSSES, per_sample_loss


def test_mse_onehot_value():
    out = torch.tensor([[0.5, 0.0, 1.0]])
    assert per_sample_loss("mse_onehot")(out, torch.tensor([2])).item() == pytest.approx(0.5 * 0.25)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_every_loss_is_vmappable(name):
    fn = per_sample_loss(name)
    w = torch.randn(4, 3)
    x = torch.randn(5, 4)
    y = torch.rand(5) if name == "mse" else torch.randint(0, 3, (5,))

    def one(w, xi, yi):
        out = xi.unsqueeze(0) @ w
        if name == "mse":
            out = out[:, :1]
        if name == "nll":
            out = out.log_softmax(-1)
        return fn(out, yi.unsqueeze(0)).sum()

    per_sample = vmap(grad(one), in_dims=(None, 0, 0))(w, x, y)
    looped = torch.stack([grad(one)(w, x[i], y[i]) for i in range(5)])
    torch.testing.assert_close(per_sample, looped)


def test_unknown_loss():
    with pytest.raises(ValueError, match="allowed"):
        per_sample_loss("hinge")

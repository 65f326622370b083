"""FedCEO spec test M3: dpfl's native DP-SGD step equals Opacus's at σ = 0 (same batches, same clipping,
same division by the expected batch size, same momentum SGD), on the FedCEO MLP."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfl.engine import params as P
from dpfl.engine.local_training import ClientPlan, LocalSpec, run_local
from dpfl.engine.pooled import PooledData
from dpfl.models import build_model

opacus = pytest.importorskip("opacus")


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_m3_native_dpsgd_equals_opacus_without_noise():
    torch.manual_seed(0)
    n, clip, lr, steps = 16, 0.05, 0.1, 3  # clip small enough that every per-sample gradient is clipped
    x, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
    model = build_model("mlp2", (1, 28, 28), 10, seed=0, dropout=0.0)
    w0 = P.model_params(model)
    # dpfl: fixed-size batches of all n records each step (order does not matter for a sum)
    spec = LocalSpec(lr=lr, clip=clip, sampling="fixed", momentum=0.5)
    ours = run_local(model, spec, [ClientPlan(0, n, steps, 0.0)], PooledData.from_clients([x], [y]), w0,
                     seed=0, round_=0).params
    # Opacus: GradSampleModule + DPOptimizer, noise 0, expected batch size n, the same full batch each step
    from opacus.optimizers import DPOptimizer
    from opacus import GradSampleModule

    ref = build_model("mlp2", (1, 28, 28), 10, seed=0, dropout=0.0)
    gsm = GradSampleModule(ref)
    opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=lr, momentum=0.5), noise_multiplier=0.0,
                      max_grad_norm=clip, expected_batch_size=n)
    norms = []
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(gsm(x), y).backward()
        norms.append(torch.stack([p.grad_sample.flatten(1).norm(dim=1) ** 2 for p in gsm.parameters()]).sum(0).sqrt())
        opt.step()
    assert (torch.cat(norms) > clip).all()  # clipping is exercised on every sample
    for name, p in ref.named_parameters():
        torch.testing.assert_close(ours[name][0], p.detach(), rtol=1e-5, atol=1e-7)

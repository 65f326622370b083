"""LocalSpec.precision "bfloat16" on a CUDA GPU (marked `gpu`; skipped where torch sees none): a DP-SGD round and a
noiseless round in bfloat16 agree with float32 on CUDA to tests/engine/test_bf16.py's tolerance (bf16 rounding,
2e-2 relative), the noise draws are the same, and a clipped record's contribution is at most C."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfl.engine import params as P
from dpfl.engine import per_sample as PS
from dpfl.engine.local_training import ClientPlan, LocalSpec, _clipped_sum, _per_sample_grad_fn, run_local
from dpfl.engine.losses import per_sample_loss
from dpfl.engine.pooled import PooledData

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda")
TOL = 2e-2  # tests/engine/test_bf16.py


def _cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 2 * 2, 10))


def _data() -> PooledData:
    g = torch.Generator().manual_seed(1)
    sizes = (30, 12, 40, 20)
    return PooledData.from_clients([torch.randn(n, 1, 8, 8, generator=g) for n in sizes],
                                   [torch.randint(0, 10, (n,), generator=g) for n in sizes]).to(CUDA)


@pytest.mark.parametrize("engine", ["fast", "vmap"])
def test_bf16_round_agrees_with_float32_on_cuda(engine):
    model, data = _cnn().to(CUDA), _data()
    w = P.model_params(model)
    for z, sampling in ((1.0, "poisson"), (0.0, "fixed")):
        plans = [ClientPlan(i, 4, 6, z) for i in range(4)]
        res = {p: run_local(model, LocalSpec(lr=0.1, clip=0.5, sampling=sampling, precision=p), plans, data, w,
                            seed=0, round_=0, engine=engine) for p in ("float32", "bfloat16")}
        assert res["bfloat16"].noise_sq_norm == res["float32"].noise_sq_norm
        a, b = (P.flatten({n: res[p].params[n] - w[n] for n in w}, leading=1) for p in ("bfloat16", "float32"))
        assert a.dtype == torch.float32 and float((a - b).norm() / b.norm()) < TOL


def test_bf16_clipping_bounds_a_records_contribution_on_cuda():
    model = _cnn().to(CUDA)
    loss = per_sample_loss("cross_entropy")
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(6, 1, 8, 8, generator=g).to(CUDA), torch.randint(0, 10, (6,), generator=g).to(CUDA)
    owner = torch.arange(6, device=CUDA)
    w = P.broadcast(P.model_params(model), 6)
    clip = 1e-3
    for out in (PS.compile_model(model).clipped_sum(w, {}, x, y, owner, clip, loss, bf16=True),
                _clipped_sum(_per_sample_grad_fn(model, loss, bf16=True), w, x, y, owner, clip)):
        norms = P.global_norms({n: v.double() for n, v in out.items()})
        assert bool((norms <= clip * (1 + 1e-5)).all()), (norms / clip).tolist()

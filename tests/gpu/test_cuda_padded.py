"""The padded layout on CUDA (marked `gpu`; skipped where torch sees none): CUDA's default layout, the same round as
the CPU's packed layout on the same batches and noise (the CPU's generators, their draws moved to the GPU), and no
host sync per step (the Poisson capacity is read once per block of steps, the counts once per round)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from dpfl.engine import local_training as LT
from dpfl.engine import params as P
from dpfl.engine.local_training import ClientPlan, LocalSpec, run_local
from dpfl.engine.pooled import PooledData
from dpfl.seeding import torch_generator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda")
RTOL = 1e-4  # as tests/gpu/test_cuda_engine.py: float32 on two devices, TF32 off



def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 2 * 2, 10))


def _data(sizes=(30, 12, 50, 9)) -> PooledData:
    g = torch.Generator().manual_seed(3)
    return PooledData.from_clients([torch.randn(n, 1, 8, 8, generator=g) for n in sizes],
                                   [torch.randint(0, 10, (n,), generator=g) for n in sizes])


# client 2's batches are the largest (the capacity), client 3's often empty; different step counts
PLANS = [ClientPlan(0, 4, 5, 1.1), ClientPlan(1, 3, 3, 0.0), ClientPlan(2, 25, 4, 0.9), ClientPlan(3, 1, 5, 1.2)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


@pytest.mark.parametrize("engine", ["fast", "vmap"])
@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_cuda_trains_padded_and_equals_the_cpus_packed_round(monkeypatch, engine, sampling):
    monkeypatch.delenv(LT.LAYOUT_ENV, raising=False)
    spec = LocalSpec(lr=0.1, sampling=sampling, clip=0.5, momentum=0.5)
    model, data = _cnn(), _data()
    w = P.model_params(model)
    ref = run_local(model, spec, PLANS, data, w, seed=4, round_=2, engine=engine)  # the CPU: packed
    monkeypatch.setattr(LT, "torch_generator",
                        lambda seed, purpose, round_=0, client=0, device="cpu": torch_generator(seed, purpose, round_,
                                                                                                 client))
    calls = []
    step = LT._padded_step
    monkeypatch.setattr(LT, "_padded_step", lambda *a, **k: calls.append(1) or step(*a, **k))
    out = run_local(_cnn().to(CUDA), spec, PLANS, data.to(CUDA), P.to_device(w, CUDA), seed=4, round_=2,
                    engine=engine)
    assert len(calls) >= max(p.steps for p in PLANS)  # every step went through the slots
    assert out.records_used == ref.records_used and out.empty_batches == ref.empty_batches
    assert out.noise_sq_norm == pytest.approx(ref.noise_sq_norm, rel=RTOL)
    for n in w:
        assert out.params[n].device.type == "cuda"
        assert _rel(out.params[n].cpu() - w[n], ref.params[n] - w[n]) <= RTOL, n


def _syncs(steps: int, engine: str) -> int:
    torch.manual_seed(0)
    model, data = _cnn().to(CUDA), _data().to(CUDA)
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=0.5)
    plans = [ClientPlan(c, 4, steps, 1.0) for c in range(4)]
    run_local(model, spec, plans, data, P.model_params(model), seed=1, round_=0, engine=engine)  # warm caches
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_local(model, spec, plans, data, P.model_params(model), seed=1, round_=1, engine=engine)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.parametrize("engine", ["fast", "vmap"])
def test_a_padded_round_syncs_with_the_host_a_fixed_number_of_times(monkeypatch, engine):
    """2 and 12 steps, one block of steps either way: the same number of synchronising operations."""
    monkeypatch.delenv(LT.LAYOUT_ENV, raising=False)
    assert _syncs(2, engine) == _syncs(12, engine)

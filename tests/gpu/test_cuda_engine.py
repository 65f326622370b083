"""The engine and a run on a CUDA GPU (marked `gpu`; skipped where torch sees none).

- the CUDA engine (fast path and vmap path) against the CPU's exact per-sample clip (vmap(grad) per record, each
  gradient clipped, summed per client) on the same records and parameters, and whole `run_local` rounds on CUDA
  against the CPU's with the same batches and noise injected (the CPU's streams: the generators are made on the
  CPU, their draws moved to the GPU): 1e-4 relative in float32, TF32 off;
- the CUDA generators' noise and Poisson batches have the right distribution (CPU and CUDA draw different
  streams from the same keys, so they agree in distribution only);
- determinism: the same round twice on CUDA is bit for bit the same (dropout included);
- a short `dpfl.run` on cuda ends with the CPU run's privacy report (epsilons), and its checkpoints hold CPU
  tensors that resume on the CPU, and a CPU checkpoint on CUDA.

Synthetic records and scikit-learn's bundled digits only: nothing is downloaded. The run tests need the server step
of the demo (FedAvg, src/dpfl/algorithms/server/) to take uploads on the GPU.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from dpfl.engine import local_training as LT
from dpfl.engine import params as P
from dpfl.engine import per_sample as PS
from dpfl.engine.local_training import ClientPlan, LocalSpec, _clipped_sum, _per_sample_grad_fn, run_local
from dpfl.engine.losses import per_sample_loss
from dpfl.engine.pooled import PooledData
from dpfl.engine.sampling import BatchStream, NoiseStream
from dpfl.seeding import Purpose, torch_generator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"
CUDA = torch.device("cuda")
# float32 on two devices: different kernels sum in different orders (about 1e-7 relative per operation); a few
# steps of a small model stay far below 1e-4 (the tolerance), a wrong record, clip or noise far above it
RTOL = 1e-4



def _linear() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


def _mlp(dropout: float = 0.0) -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 10))


def _cnn() -> nn.Sequential:
    # conv1: 1 channel, im2col's (C, kh, kw) layout; conv2: 6 channels, the channels-last one; padding and stride
    return nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 2 * 2, 10))


MODELS = {"linear": _linear, "mlp": _mlp, "cnn": _cnn}


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    return MODELS[name]()


def _records(counts, seed=1):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, 1, 8, 8, generator=g) for n in counts]
    ys = [torch.randint(0, 10, (n,), generator=g) for n in counts]
    return xs, ys


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_clipped_sums_equal_the_cpu_exact_per_sample_clip(name):
    model = _model(name)
    counts = [4, 0, 7, 1, 3]  # heterogeneous, with an empty batch
    xs, ys = _records(counts)
    x, y = torch.cat(xs), torch.cat(ys)
    owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    g = torch.Generator().manual_seed(2)
    w = {n: v + 0.05 * v.abs().mean() * torch.randn(v.shape, generator=g)
         for n, v in P.broadcast(P.model_params(model), len(counts)).items()}  # clients at different parameters
    loss = per_sample_loss("cross_entropy")
    grads_of = _per_sample_grad_fn(model, loss)
    norms = P.global_norms(grads_of(P.select(w, owner), x, y))
    clip = 0.5 * float(norms.median())  # binds for about half the records
    ref = _clipped_sum(grads_of, w, x, y, owner, clip)  # the CPU's exact per-sample clip
    cuda_model = _model(name).to(CUDA)
    wc, xc, yc, oc = P.to_device(w, CUDA), x.to(CUDA), y.to(CUDA), owner.to(CUDA)
    fast = PS.compile_model(cuda_model)
    assert fast is not None
    for label, out in (("fast", fast.clipped_sum(wc, {}, xc, yc, oc, clip, loss)),
                       ("vmap", _clipped_sum(_per_sample_grad_fn(cuda_model, loss), wc, xc, yc, oc, clip))):
        for n in ref:
            assert out[n].device.type == "cuda", (label, n)
            assert _rel(out[n], ref[n]) <= RTOL, (label, n, _rel(out[n], ref[n]))
            assert torch.equal(out[n][1].cpu(), torch.zeros_like(ref[n][1])), (label, n)  # the empty client


@pytest.mark.parametrize("noise", [0.0, 1.0])
@pytest.mark.parametrize("engine", ["fast", "vmap"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_cuda_round_with_the_cpus_batches_and_noise_equals_the_cpu_round(monkeypatch, name, engine, noise):
    """The same batches and noise on both devices: the CPU's streams, drawn by CPU generators and moved to the GPU
    (the engine moves every draw to the records' device). Noise 0 compares the clipped gradients alone."""
    counts = [9, 14, 5, 20]
    xs, ys = _records(counts, seed=3)
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=0.5, momentum=0.5)
    plans = [ClientPlan(c, 4, 2 + c % 3, noise) for c in range(len(counts))]
    model = _model(name)
    w = P.model_params(model)
    ref = run_local(model, spec, plans, PooledData.from_clients(xs, ys), w, seed=4, round_=2, engine=engine)
    monkeypatch.setattr(LT, "torch_generator",
                        lambda seed, purpose, round_=0, client=0, device="cpu": torch_generator(seed, purpose, round_,
                                                                                                 client))
    cuda_model = _model(name).to(CUDA)
    data = PooledData.from_clients(xs, ys).to(CUDA)
    out = run_local(cuda_model, spec, plans, data, P.to_device(w, CUDA), seed=4, round_=2, engine=engine)
    assert out.records_used == ref.records_used and out.steps == ref.steps
    for n in w:
        assert out.params[n].device.type == "cuda"
        assert _rel(out.params[n].cpu() - w[n], ref.params[n] - w[n]) <= RTOL, n
    if noise:
        assert out.noise_sq_norm == pytest.approx(ref.noise_sq_norm, rel=RTOL)


def test_cuda_noise_and_poisson_batches_have_their_distributions():
    """5-sigma bounds on fixed seeds: mean and variance of 10^6 standard normals, the mean Poisson batch size of 200
    steps at rate 0.1 over 1,000 records (sd sqrt(90 / 200))."""
    stream = NoiseStream(1000, 1000, torch_generator(0, Purpose.NOISE, 1, 2, CUDA))
    xi = torch.stack([stream.next() for _ in range(1000)])
    assert xi.device.type == "cuda"
    n = xi.numel()
    assert abs(float(xi.mean())) <= 5 / math.sqrt(n)
    assert abs(float(xi.double().var()) - 1.0) <= 5 * math.sqrt(2 / n)
    batches = BatchStream("poisson", 1000, 100, torch_generator(0, Purpose.BATCH, 1, 2, CUDA), 200)
    sizes = []
    for _ in range(200):
        idx = batches.next()
        assert idx.device.type == "cuda" and len(torch.unique(idx)) == len(idx)
        assert len(idx) == 0 or (0 <= int(idx.min()) and int(idx.max()) < 1000)
        sizes.append(len(idx))
    assert abs(sum(sizes) / len(sizes) - 100) <= 5 * math.sqrt(90 / 200)
    perm = BatchStream("fixed", 50, 10, torch_generator(0, Purpose.BATCH, device=CUDA), 1).next()
    assert perm.device.type == "cuda" and len(torch.unique(perm)) == 10


@pytest.mark.parametrize("engine", ["fast", "vmap"])
@pytest.mark.parametrize("name", ["cnn", "mlp_dropout"])
def test_the_same_round_twice_on_cuda_is_the_same(name, engine):
    """Fixed-order record sums (no index_add_ atomics), deterministic cuDNN, generators keyed as on the CPU and
    dropout masks from the CUDA RNG seeded per round: bit for bit."""
    counts = [30, 12, 41, 25]
    xs, ys = _records(counts, seed=5)
    data = PooledData.from_clients(xs, ys).to(CUDA)
    spec = LocalSpec(lr=0.05, sampling="poisson", clip=1.0, momentum=0.5)
    plans = [ClientPlan(c, 6, 3, 1.1) for c in range(len(counts))]
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        model = (_mlp(0.3) if name == "mlp_dropout" else _cnn()).to(CUDA)
        results.append(run_local(model, spec, plans, data, P.model_params(model), seed=7, round_=3, engine=engine))
    a, b = results
    assert all(torch.equal(a.params[n], b.params[n]) for n in a.params)
    assert a.noise_sq_norm == b.noise_sq_norm and a.records_used == b.records_used


# ---- whole runs --------------------------------------------------------------------------------------------


def _epsilons(report: dict) -> list[dict]:
    return [{k: v for k, v in row.items() if "epsilon" in k} for row in report["clients"]]


def test_a_short_run_on_cuda_reports_the_cpus_privacy(tmp_path):
    import dpfl

    short = ["training.rounds=3", "evaluation.every=1"]
    cpu = dpfl.run(DEMO, overrides=short, out=tmp_path / "cpu")
    gpu = dpfl.run(DEMO, overrides=short, out=tmp_path / "cuda", device="cuda")
    again = dpfl.run(DEMO, overrides=short, out=tmp_path / "cuda-again", device="cuda")
    assert gpu.config.device == "cuda" and gpu.summary["stop_reason"] == cpu.summary["stop_reason"]
    assert _epsilons(gpu.privacy.to_dict()) == _epsilons(cpu.privacy.to_dict())
    assert gpu.epsilon == cpu.epsilon
    assert all(math.isfinite(r["test_loss"]) for r in gpu.metrics)
    assert all(t.device.type == "cpu" for t in gpu.params.values())  # read back from the checkpoint
    assert all(torch.equal(gpu.params[n], again.params[n]) for n in gpu.params)  # a CUDA run repeats
    ckpt = torch.load(tmp_path / "cuda" / "checkpoint.pt", weights_only=True)  # no map_location: saved on the CPU
    assert all(t.device.type == "cpu" for t in ckpt["params"].values())


@pytest.mark.parametrize("first,then", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_resumes_on_the_other_device(first, then):
    """A state checkpointed after round 1 of 3 (through torch.save, as a run directory does) resumes on the other
    device and spends what the uninterrupted run spends."""
    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import load_config
    from dpfl.experiment.run_records import RunState

    def built(device: str):
        return build_run(load_config(DEMO, ["training.rounds=3", f"device={device}"]))

    states: list[RunState] = []
    whole = built(first).run(on_checkpoint=states.append, checkpoint_every=1)
    buffer = io.BytesIO()
    torch.save(states[0].to_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert saved["round"] == 1 and all(t.device.type == "cpu" for t in saved["params"].values())
    resumed_run = built(then)
    resumed = resumed_run.run(state=RunState.from_dict(saved))
    assert all(t.device == resumed_run.device for t in resumed.params.values())
    assert resumed.ledger.spent_all() == whole.ledger.spent_all()
    assert resumed.stop_reason == whole.stop_reason

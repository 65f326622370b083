"""The engine's padded layout (fixed-capacity slots per client, padding weighted 0) against the packed layout.

The padded layout is CUDA's default and forced here on the CPU: it must draw the same records from the same
generators (so `records_used`, `empty_batches` and the noise are equal exactly) and give the same end parameters up
to float rounding (different GEMM shapes and summation orders: 1e-5 relative, float32, a few steps).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from dpfl.engine import local_training as LT
from dpfl.engine import params as P
from dpfl.engine.local_training import ClientPlan, LocalSpec, run_local
from dpfl.engine.per_sample import Packing
from dpfl.engine.pooled import PooledData
from dpfl.engine.sampling import BatchStream, SlotBatches
from dpfl.seeding import Purpose, torch_generator

# float32, a few steps of a small model: the layouts sum in different orders (about 1e-7 relative per operation);
# a missing, repeated or unweighted record, or a wrong denominator, is off by far more than this
RTOL = 1e-5


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(6 * 3 * 3, 16), nn.Tanh(), nn.Linear(16, 10))


def _data(sizes=(40, 25, 60, 12, 33), seed=1) -> PooledData:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, 1, 8, 8, generator=g) for n in sizes]
    ys = [torch.randint(0, 10, (n,), generator=g) for n in sizes]
    return PooledData.from_clients(xs, ys)


# client 2 draws far larger batches than the others (the slots' capacity is its batch); client 3's rate 1/12 leaves
# about a third of its Poisson batches empty; different step counts (clients drop out of the stack)
PLANS = [ClientPlan(0, 4, 5, 1.1), ClientPlan(1, 3, 6, 0.0), ClientPlan(2, 30, 4, 0.8), ClientPlan(3, 1, 6, 1.3),
         ClientPlan(4, 5, 2, 1.0)]


def _rel_update(a: P.Params, b: P.Params, start: P.Params) -> float:
    """The largest tensor's ||a - b|| / ||b - start||: the difference relative to the update itself."""
    return max(float((a[n] - b[n]).norm() / (b[n] - start[n]).norm().clamp(min=1e-30)) for n in b)


def _both(spec: LocalSpec, plans=PLANS, engine: str = "fast", **kw):
    model, data = _cnn(), _data()
    w = P.model_params(model)
    out = [run_local(model, spec, plans, data, w, seed=5, round_=3, engine=engine, layout=layout, **kw)
           for layout in ("packed", "padded")]
    return out, P.broadcast(w, len(plans))


def _assert_same(packed, padded, start):
    assert padded.records_used == packed.records_used
    assert padded.empty_batches == packed.empty_batches
    assert padded.noise_sq_norm == packed.noise_sq_norm
    assert padded.steps == packed.steps
    assert _rel_update(padded.params, packed.params, start) <= RTOL


@pytest.mark.parametrize("engine", ["fast", "vmap"])
@pytest.mark.parametrize("sampling", ["poisson", "fixed", "shuffle"])
@pytest.mark.parametrize("noisy", [False, True])
def test_padded_equals_packed(engine, sampling, noisy):
    spec = LocalSpec(lr=0.1, sampling=sampling, clip=0.7)
    plans = PLANS if noisy else [replace(p, noise_multiplier=0.0) for p in PLANS]
    if sampling == "fixed":  # fixed-size batches need batch <= records
        plans = [replace(p, batch_size=min(p.batch_size, 10)) for p in plans]
    (packed, padded), start = _both(spec, plans, engine)
    _assert_same(packed, padded, start)
    if sampling == "poisson":
        assert sum(packed.empty_batches) > 0  # the weight-0 rows of a whole empty batch are exercised


@pytest.mark.parametrize("engine", ["fast", "vmap"])
@pytest.mark.parametrize("spec", [
    LocalSpec(lr=0.1, sampling="poisson", clip=0.5, momentum=0.6, prox_mu=0.3),
    LocalSpec(lr=0.1, sampling="poisson", clip=0.5, micro_batch=7),
    LocalSpec(lr=0.1, sampling="poisson", clip=0.5, micro_batch=2),  # fewer than the clients: one slot each
    LocalSpec(lr=0.1, sampling="shuffle", clip=0.5, trainable=("0.weight", "6.weight", "6.bias")),
    LocalSpec(lr=0.1, sampling="poisson", clip=0.5, clip_mode="batch"),
    LocalSpec(lr=0.1, sampling="poisson"),  # plain SGD
    LocalSpec(lr=0.1, sampling="shuffle", momentum=0.5),
], ids=["momentum-prox", "micro7", "micro2", "trainable", "clip-batch", "sgd-poisson", "sgd-shuffle"])
def test_padded_equals_packed_across_local_programs(engine, spec):
    plans = PLANS
    if spec.clip is None or spec.clip_mode == "batch":
        plans = [replace(p, noise_multiplier=0.0) for p in PLANS]
    (packed, padded), start = _both(spec, plans, engine)
    _assert_same(packed, padded, start)


def test_padded_equals_packed_with_step_rates_and_many_groups(monkeypatch):
    """Chunks of clients (a small element budget) in threads (two workers), per-step rates."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    plans = [replace(p, step_lrs=tuple(0.05 * (1 + s % 3) for s in range(p.steps))) for p in PLANS]
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=0.5, momentum=0.3)
    (packed, padded), start = _both(spec, plans, "fast", max_elements=1 << 16)
    _assert_same(packed, padded, start)


def test_the_environment_variable_picks_the_layout(monkeypatch):
    calls = []
    step = LT._padded_step
    monkeypatch.setattr(LT, "_padded_step", lambda *a, **k: calls.append(1) or step(*a, **k))
    model, data = _cnn(), _data()
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=0.5)
    args = (model, spec, PLANS, data, P.model_params(model))
    auto = run_local(*args, seed=1, round_=0)
    assert not calls  # the CPU's default: packed
    monkeypatch.setenv(LT.LAYOUT_ENV, "padded")
    env = run_local(*args, seed=1, round_=0)
    assert calls
    forced = run_local(*args, seed=1, round_=0, layout="padded")
    assert all(torch.equal(env.params[n], forced.params[n]) for n in env.params)
    packed = run_local(*args, seed=1, round_=0, layout="packed")  # an explicit layout wins over the variable
    assert all(torch.equal(auto.params[n], packed.params[n]) for n in auto.params)
    monkeypatch.setenv(LT.LAYOUT_ENV, "sideways")
    with pytest.raises(ValueError, match=LT.LAYOUT_ENV):
        run_local(*args, seed=1, round_=0)
    with pytest.raises(ValueError, match="layout"):
        run_local(*args, seed=1, round_=0, layout="sideways")


@pytest.mark.parametrize("sampling", ["poisson", "fixed", "shuffle"])
@pytest.mark.parametrize("budget", [1 << 24, 50])  # one block for the round; many blocks and sub-blocks
def test_slot_batches_hold_the_streams_batches(sampling, budget):
    """Slot j of client i at step t holds the j-th record `BatchStream.next` gives, mask True exactly there,
    padding slots index record 0; the capacity is the block's largest batch (never a truncated one)."""
    sizes, batch, steps = [40, 9, 25], [6, 2, 9], [7, 5, 2]

    def streams():
        return [BatchStream(sampling, n, b, torch_generator(2, Purpose.BATCH, 1, i), s)
                for i, (n, b, s) in enumerate(zip(sizes, batch, steps, strict=True))]

    ref = [[s.next() for _ in range(n)] for s, n in zip(streams(), steps, strict=True)]
    seen = set()
    for blk in SlotBatches(streams(), steps, "cpu", budget=budget):
        k = blk.counts.shape[1]
        assert blk.cap == max(len(ref[i][blk.start + j]) for j in range(len(blk.counts)) for i in range(k)
                              if blk.start + j < steps[i])
        for j in range(len(blk.counts)):
            t = blk.start + j
            seen.add(t)
            assert blk.caps[j] == max(len(ref[i][t]) for i in range(k) if t < steps[i])
            for i in range(k):
                want = ref[i][t] if t < steps[i] else torch.zeros(0, dtype=torch.int64)
                m = len(want)
                assert int(blk.counts[j, i]) == m
                assert torch.equal(blk.index[j, i, :m], want)
                assert torch.equal(blk.mask[j, i], torch.arange(blk.cap) < m)
                assert not blk.index[j, i, m:].any()
    assert seen == set(range(max(steps)))


def test_padded_equals_packed_over_many_steps_in_float64():
    """Over 40 steps float32 rounding, amplified where a ReLU or max-pool input sits at a kink, moves a client by
    up to about 1e-3 of its update (measured on the PFA CNN after 100 steps); in float64 the layouts agree to
    rounding: no record, weight or denominator differs anywhere along the way."""
    model, data = _cnn().double(), _data()
    data = PooledData(data.x.double(), data.y, data.offsets, data.sizes)
    plans = [replace(p, steps=40 - 3 * i) for i, p in enumerate(PLANS)]
    w = P.model_params(model)
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=0.5, momentum=0.5)
    packed, padded = (run_local(model, spec, plans, data, w, seed=2, round_=1, layout=layout)
                      for layout in ("packed", "padded"))
    _assert_same(packed, padded, P.broadcast(w, len(plans)))
    assert _rel_update(padded.params, packed.params, P.broadcast(w, len(plans))) <= 1e-12


def test_slot_batches_are_the_same_whichever_way_a_stream_is_read():
    """Poisson masks cut from the blocks `next` draws: reading some steps one by one and the rest as masks
    gives the same batches as `next` throughout."""
    n, steps = 3000, 800  # blocks of 1 << 20 // 3000 = 349 rows: the reads cross block boundaries
    ref = BatchStream("poisson", n, 30, torch_generator(0, Purpose.BATCH, 0, 0), steps)
    mixed = BatchStream("poisson", n, 30, torch_generator(0, Purpose.BATCH, 0, 0), steps)
    got = [mixed.next() for _ in range(300)]
    got += [row.nonzero().squeeze(1) for row in mixed.masks(450)]
    got += [mixed.next() for _ in range(50)]
    for t in range(steps):
        assert torch.equal(got[t], ref.next()), t


def test_a_uniform_packing_reads_nothing_from_the_device():
    """Sizes given by `slots`: the packing is built from a tensor without data (the meta device)."""
    owner = torch.empty(12, dtype=torch.int64, device="meta")
    pk = Packing(owner, 3, slots=4)
    assert pk.counts == [4, 4, 4] and pk.bmax == 4 and pk.active == [0, 1, 2]
    assert pk.bounds == [(0, 4), (4, 8), (8, 12)]
    x = torch.arange(24.0).view(12, 2)
    assert torch.equal(pk.pad(x), x.view(3, 4, 2)) and torch.equal(pk.unpad(pk.pad(x)), x)
    with pytest.raises(ValueError, match="slots"):
        Packing(owner, 4, slots=4)


def _old_cpu_choice(pk: Packing, rows: int, d: int, e: int) -> bool:
    """The CPU cost model as it was before the per-device profiles (constants inline)."""
    flops = 2.0 * pk.s * rows * d * e
    loop = pk.nonempty * 6.0 + flops / 50_000.0
    padded_floats = pk.k * pk.bmax * rows * (d + e)
    pad = 4 * 6.0 + flops * (pk.k * pk.bmax) / max(1, pk.s) / 50_000.0 \
        + 2.0 * padded_floats * (0.25e-3, 2e-3)[padded_floats > (8 << 20)]
    return loop <= pad


def test_the_cost_model_keeps_the_cpus_choices_and_batches_on_cuda():
    """CPU packings decide as before; the CUDA profile (a call is a kernel launch) takes the padded batched GEMM for a
    cohort, and so does a uniform packing (no copies) of more than four clients on the CPU."""
    import dpfl.engine.per_sample as PS

    g = torch.Generator().manual_seed(0)
    flips = 0
    for k in (1, 3, 24, 200):
        counts = torch.randint(0, 40, (k,), generator=g)
        pk = Packing(torch.repeat_interleave(torch.arange(k), counts), k)
        assert pk.costs == PS.cost_profile(torch.device("cpu"))
        for rows, d, e in ((1, 512, 32), (1, 32, 10), (49, 64, 16), (196, 16, 32), (1, 4096, 4096)):
            cpu = pk.loop_is_cheaper(rows, d, e)
            assert cpu == _old_cpu_choice(pk, rows, d, e)
            pk.costs = PS.cost_profile(torch.device("cuda"))
            cuda = pk.loop_is_cheaper(rows, d, e)
            pk.costs = PS.cost_profile(torch.device("cpu"))
            if k >= 24 and d * e <= 512 * 32:  # small layers: launches dominate (a 4096 x 4096 layer may loop)
                assert not cuda, (k, rows, d, e)
            flips += cpu != cuda
    assert flips  # the profiles decide differently somewhere
    uniform = Packing(torch.arange(24).repeat_interleave(8), 24, slots=8)
    assert not uniform.loop_is_cheaper(1, 512, 32)


@pytest.mark.parametrize("engine", ["fast", "vmap"])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_padded_with_dropout_draws_the_same_records_and_repeats(engine, clip):
    """Dropout masks are drawn in the layout's shape, so the parameters differ from the packed layout's; the records,
    the counts and a rerun do not."""
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10))

    data, spec = _data(), LocalSpec(lr=0.1, sampling="poisson", clip=clip)
    plans = [replace(p, noise_multiplier=0.0) for p in PLANS] if clip is None else PLANS
    w = P.model_params(model())
    runs = [run_local(model(), spec, plans, data, w, seed=3, round_=1, engine=engine, layout=layout)
            for layout in ("packed", "padded", "padded")]
    assert runs[0].records_used == runs[1].records_used and runs[0].empty_batches == runs[1].empty_batches
    assert all(torch.equal(runs[1].params[n], runs[2].params[n]) for n in w)
    assert all(bool(torch.isfinite(runs[1].params[n]).all()) for n in w)


def test_convolution_costs_follow_the_records_device_profile():
    """A convolution's choice between im2col GEMMs and one native convolution per client reads the packing's profile:
    the CPU's gives the old constants' numbers exactly; on CUDA (launch-bound per-client calls) a cohort's native
    per-client convolutions cost more than the GEMM path."""
    import dpfl.engine.per_sample as PS

    conv = PS._Conv2d(nn.Conv2d(16, 32, 5), "c.")
    pk = Packing(torch.arange(24).repeat_interleave(8), 24)
    l = 24 * 24
    gemm, native, im2col, col2im = conv._costs(pk, l)
    flops, floats = 2.0 * pk.s * l * conv.cout * conv.ckk, float(pk.s * l * conv.ckk)
    assert gemm == flops / PS.FLOPS_PER_US + pk.nonempty * PS.CALL_US
    assert native == flops / PS.NATIVE_FLOPS_PER_US + pk.nonempty * PS.NATIVE_CONV_US
    assert im2col == floats * PS.COPY_US_PER_FLOAT[floats > PS.CACHE_FLOATS]
    assert col2im == 2 * im2col + 2 * PS.CALL_US
    pk.costs = PS.cost_profile(torch.device("cuda"))
    c_gemm, c_native, c_im2col, _ = conv._costs(pk, l)
    assert c_gemm + c_im2col < c_native  # on a GPU the batched GEMM path wins
    assert c_gemm < gemm and c_im2col < im2col


def test_the_padded_memory_budget_counts_the_steps_largest_poisson_batch():
    """In the padded layout every client holds as many slots as the step's largest batch, so the memory budget
    counts a high quantile of the largest of K Poisson batches, not the expected batch (packed: the expected
    batch, as before). Checked against draws: over 2,000 steps of 240 clients the quantile for miss = 1e-3 is
    exceeded at about 2 steps in expectation; 10 would be a 1-in-10^4 event (Poisson(2) tail)."""
    plans = [ClientPlan(i, 8, 1) for i in range(240)]
    width = LT.held_width(plans, "poisson", padded=True)
    assert LT.held_width(plans, "poisson", padded=False) == 8 == LT.held_width(plans, "fixed", padded=True)
    g = torch.Generator().manual_seed(0)
    largest = torch.poisson(torch.full((2000, 240), 8.0), generator=g).amax(1)
    assert int((largest > width).sum()) < 10
    assert width - int(largest.max()) < 6  # and not wildly above what a step holds
    assert LT.held_width(plans[:1], "poisson", padded=True) < width  # fewer clients, a lower largest batch

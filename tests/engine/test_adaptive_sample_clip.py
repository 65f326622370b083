"""Sample-level adaptive clipping (Andrew et al. 2021) inside each client's DP-SGD (`LocalSpec.adaptive_clipping`).

Each step of client k clips to its own C_k, adds N(0, (z_Delta,k C_k)^2) with z_Delta,k = (z_k^-2 - (2 sigma_b)^-2)^-1/2
(Theorem 1), releases b~ = (sum_s (1[||g_s|| <= C_k] - 1/2) + sigma_b xi) / m_k + 1/2 (m_k the expected batch; the
centred count has sensitivity 1/2 when the batch size is not public) and moves
C_k <- C_k exp(-eta (b~ - gamma)). The tests recompute that recurrence from per-sample gradients taken here with
autograd, replaying the client's batch, noise and count-noise streams from their keys.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from dpfl.algorithms.client.phased import PhasedProgram
from dpfl.algorithms.client.program import SAMPLE_CLIP, dpsgd, sgd
from dpfl.engine import per_sample
from dpfl.engine.local_training import ClientPlan, LocalSpec, run_local
from dpfl.engine.pooled import PooledData
from dpfl.engine.sampling import BatchStream, NoiseStream
from dpfl.privacy.adaptive_clipping import AdaptiveClipping, update_noise_multiplier
from dpfl.seeding import Purpose, torch_generator

SEED, ROUND = 7, 3


def _data(clients: int = 3, n: int = 40, d: int = 8, classes: int = 3, seed: int = 0) -> PooledData:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, d, generator=g) * (1 + i) for i in range(clients)]  # clients with different norm scales
    ys = [torch.randint(0, classes, (n,), generator=g) for _ in range(clients)]
    return PooledData.from_clients(xs, ys)


def _model(d: int = 8, classes: int = 3) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d, classes))
    return model, {n: p.detach().clone() for n, p in model.named_parameters()}


def _reference(model: nn.Module, start: dict[str, torch.Tensor], data: PooledData, plan: ClientPlan, lr: float,
               adaptive: AdaptiveClipping, sampling: str) -> tuple[list[float], torch.Tensor]:
    """One client's DP-SGD with adaptive clipping, written out: (its clip before each step and after the last, its
    end parameters flattened). Per-sample gradients by autograd, one record at a time."""
    lo, n = int(data.offsets[plan.client]), int(data.sizes[plan.client])
    x, y = data.x[lo: lo + n], data.y[lo: lo + n]
    names = list(start)
    w = {k: v.clone() for k, v in start.items()}
    dim = sum(v.numel() for v in w.values())
    batches = BatchStream(sampling, n, plan.batch_size, torch_generator(SEED, Purpose.BATCH, ROUND, plan.client),
                          plan.steps)
    noise = NoiseStream(dim, plan.steps, torch_generator(SEED, Purpose.NOISE, ROUND, plan.client))
    count_noise = torch.randn(plan.steps, generator=torch_generator(SEED, Purpose.CLIP_COUNT, ROUND, plan.client))
    m = float(min(plan.batch_size, n))
    sigma_b = adaptive.sigma_b(m) if plan.noise_multiplier > 0 else 0.0
    z_delta = update_noise_multiplier(plan.noise_multiplier, adaptive.sigma_b(m))
    clip = float(torch.tensor(plan.clip, dtype=torch.float32))
    clips = [clip]
    for _ in range(plan.steps):
        idx = batches.next()
        total, count = torch.zeros(dim, dtype=torch.float64), 0
        for i in idx.tolist():
            params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
            out = torch.func.functional_call(model, params, (x[i: i + 1],))
            loss = nn.functional.cross_entropy(out, y[i: i + 1])
            grads = torch.autograd.grad(loss, [params[k] for k in names])
            flat = torch.cat([g.reshape(-1) for g in grads]).double()
            norm = float(flat.norm())
            count += int(norm <= clip) - 0.5
            total += flat * min(1.0, clip / (norm + 1e-12))
        xi = noise.next().double()
        if plan.noise_multiplier > 0:
            total += xi * z_delta * clip
        total /= plan.batch_size if sampling == "poisson" else max(1, len(idx))
        offset = 0
        for k in names:
            size = w[k].numel()
            w[k] = w[k] - (lr * total[offset: offset + size]).reshape(w[k].shape).float()
            offset += size
        noised = (count + sigma_b * float(count_noise[len(clips) - 1])) / m + 0.5
        clip = clip * math.exp(-adaptive.learning_rate * (noised - adaptive.target_quantile))
        clips.append(clip)
    return clips, torch.cat([w[k].reshape(-1) for k in names])


@pytest.mark.parametrize("z", [0.0, 1.5], ids=["count-noise-off", "count-noise-seeded"])
@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_each_clients_clip_follows_the_recurrence_on_its_per_sample_norms(z, sampling):
    data = _data()
    model, start = _model()
    adaptive = AdaptiveClipping(target_quantile=0.6, learning_rate=0.5, initial_clip=0.3, count_noise=2.0)
    spec = LocalSpec(lr=0.2, clip=0.3, sampling=sampling, adaptive_clipping=adaptive)
    # the clients start from different clips (their state), take different numbers of steps
    plans = [ClientPlan(c, 12, steps, noise_multiplier=z, clip=clip)
             for c, steps, clip in [(0, 6, 0.3), (1, 4, 1.2), (2, 5, 0.05)]]
    res = run_local(model, spec, plans, data, start, seed=SEED, round_=ROUND, layout="packed")
    flat_end = torch.cat([res.params[k].reshape(len(plans), -1) for k in start], dim=1)
    moved = 0
    for i, plan in enumerate(plans):
        clips, w = _reference(model, start, data, plan, 0.2, adaptive, sampling)
        # float32 engine vs a float64 recurrence over at most 6 steps: 1e-5 relative is ~100 float32 ulps
        assert res.clips[i] == pytest.approx(clips[-1], rel=1e-5), (i, clips)
        torch.testing.assert_close(flat_end[i], w, rtol=1e-4, atol=1e-5)
        moved += clips[-1] != pytest.approx(clips[0], rel=1e-3)
    assert moved == len(plans)  # every clip moved: the test would see a step that forgot the update


def test_the_update_noise_std_is_z_delta_times_the_clients_clip():
    """One step, the same batches with and without noise: the difference is -lr z_Delta,k C_k xi / b exactly, so its
    empirical std over the p = 650 coordinates estimates z_Delta,k C_k lr / b with relative standard error
    1/sqrt(2p) ~ 2.8%; 10% is 3.6 standard errors. z_Delta,k is 1.81 z_k for the first client, 1.07 z_k for the
    second, so the planned z_k would fail by far more than the tolerance."""
    g = torch.Generator().manual_seed(1)
    data = PooledData.from_clients([torch.randn(50, 64, generator=g) for _ in range(2)],
                                   [torch.randint(0, 10, (50,), generator=g) for _ in range(2)])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 10))
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    adaptive = AdaptiveClipping(initial_clip=0.5, count_noise=0.6)
    spec = LocalSpec(lr=1.0, clip=0.5, sampling="fixed", adaptive_clipping=adaptive)
    zs, clips = [1.0, 0.4], [0.5, 2.0]
    noisy = [ClientPlan(c, 20, 1, noise_multiplier=z, clip=clip)
             for c, (z, clip) in enumerate(zip(zs, clips, strict=True))]
    clean = [ClientPlan(c, 20, 1, noise_multiplier=0.0, clip=clip) for c, clip in enumerate(clips)]
    a = run_local(model, spec, noisy, data, start, seed=SEED, round_=ROUND)
    b = run_local(model, spec, clean, data, start, seed=SEED, round_=ROUND)
    diff = torch.cat([(a.params[k] - b.params[k]).reshape(2, -1) for k in start], dim=1)
    for i, (z, clip) in enumerate(zip(zs, clips, strict=True)):
        z_delta = update_noise_multiplier(z, 0.6)
        assert z_delta == pytest.approx((z ** -2 - 1.2 ** -2) ** -0.5)
        expected = z_delta * clip / 20  # lr 1, fixed batch of 20
        assert float(diff[i].std()) == pytest.approx(expected, rel=0.10)
    assert update_noise_multiplier(1.0, 0.6) / 1.0 > 1.5 and update_noise_multiplier(0.4, 0.6) / 0.4 > 1.05


@pytest.mark.parametrize("engine", ["fast", "vmap"])
def test_padding_slots_are_not_counted_padded_equals_packed(engine):
    """Poisson batches of different sizes: the padded layout gives every client the step's largest batch, the rest
    padding slots of weight 0. Counting them would raise b~ by (cap - drawn) / m and move the clips apart."""
    data = _data(clients=4, n=60)
    model, start = _model()
    adaptive = AdaptiveClipping(initial_clip=0.4, learning_rate=1.0, count_noise=3.0)
    spec = LocalSpec(lr=0.3, clip=0.4, sampling="poisson", adaptive_clipping=adaptive)
    plans = [ClientPlan(c, b, 5, noise_multiplier=1.0, clip=0.4) for c, b in enumerate([4, 30, 12, 50])]
    packed = run_local(model, spec, plans, data, start, seed=SEED, round_=ROUND, engine=engine, layout="packed")
    padded = run_local(model, spec, plans, data, start, seed=SEED, round_=ROUND, engine=engine, layout="padded")
    assert padded.clips == pytest.approx(packed.clips, rel=1e-5)
    for k in start:
        torch.testing.assert_close(padded.params[k], packed.params[k], rtol=1e-4, atol=1e-5)
    both = run_local(model, spec, plans, data, start, seed=SEED, round_=ROUND, engine="vmap" if engine == "fast"
                     else "fast", layout="packed")
    assert both.clips == pytest.approx(packed.clips, rel=1e-5)  # the fast and the vmap path agree too


def test_the_fast_paths_count_skips_weight_zero_slots():
    data = _data(clients=2, n=10)
    model, start = _model()
    fast = per_sample.compile_model(model)
    w = {k: v.unsqueeze(0).repeat(2, *([1] * v.dim())) for k, v in start.items()}
    x, y = data.x[:20], data.y[:20]
    owner = torch.arange(2).repeat_interleave(10)
    weight = torch.ones(20)
    weight[5:10] = 0  # client 0's last five slots are padding
    norms = fast.per_sample_norms(w, {}, x, y, owner, _ce)
    clip = torch.tensor([float(norms[:10].median()), float(norms[10:].max()) + 1])
    counts = torch.zeros(2)
    fast.clipped_sum(w, {}, x, y, owner, clip, _ce, weight, 10, counts=counts)
    # centred: each counted sample adds 1/2 if its norm is at most the clip, else -1/2; padding adds nothing
    assert counts.tolist() == [float((norms[:5] <= clip[0]).sum()) - 2.5, 10.0 - 5.0]


def _ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y, reduction="none")


def test_two_budgets_two_update_noises_and_each_client_its_own_clip():
    """Clients with different z_k (different budgets) get their own z_Delta,k, and a client's clip is the same
    whether it trains alone or in a cohort (its streams are its own)."""
    data = _data()
    model, start = _model()
    adaptive = AdaptiveClipping(initial_clip=0.2, learning_rate=0.5, count_noise=1.5)
    spec = LocalSpec(lr=0.2, clip=0.2, sampling="poisson", adaptive_clipping=adaptive)
    plans = [ClientPlan(0, 15, 4, noise_multiplier=0.8, clip=0.2), ClientPlan(1, 15, 4, noise_multiplier=2.5,
                                                                              clip=0.2)]
    from dpfl.engine.local_training import _adaptive_noise
    _, sigma_b, z_delta = _adaptive_noise(adaptive, plans, data)
    assert sigma_b == [1.5, 1.5]
    assert z_delta == pytest.approx([(0.8 ** -2 - 3.0 ** -2) ** -0.5, (2.5 ** -2 - 3.0 ** -2) ** -0.5])
    together = run_local(model, spec, plans, data, start, seed=SEED, round_=ROUND)
    assert together.clips[0] != pytest.approx(together.clips[1], rel=1e-3)
    for i, plan in enumerate(plans):
        alone = run_local(model, spec, [plan], data, start, seed=SEED, round_=ROUND)
        assert alone.clips[0] == pytest.approx(together.clips[i], rel=1e-6)


def test_micro_batches_count_like_one_batch():
    data = _data(n=60)
    model, start = _model()
    adaptive = AdaptiveClipping(initial_clip=0.5, count_noise=3.0)
    spec = LocalSpec(lr=0.2, clip=0.5, sampling="poisson", adaptive_clipping=adaptive)
    plans = [ClientPlan(c, 30, 4, noise_multiplier=1.0, clip=0.5) for c in range(3)]
    one = run_local(model, spec, plans, data, start, seed=SEED, round_=ROUND)
    for layout in ("packed", "padded"):
        micro = run_local(model, LocalSpec(lr=0.2, clip=0.5, sampling="poisson", adaptive_clipping=adaptive,
                                           micro_batch=7), plans, data, start, seed=SEED, round_=ROUND, layout=layout)
        assert micro.clips == pytest.approx(one.clips, rel=1e-5)


def test_refusals_in_one_line():
    adaptive = AdaptiveClipping(initial_clip=0.1)
    with pytest.raises(ValueError, match="clip_mode 'per_example' and clip = its initial_clip"):
        LocalSpec(lr=0.1, clip=0.1, clip_mode="batch", adaptive_clipping=adaptive)
    with pytest.raises(ValueError, match="clip = its initial_clip 0.1"):
        LocalSpec(lr=0.1, clip=0.5, adaptive_clipping=adaptive)
    with pytest.raises(ValueError, match="initial_clip"):
        LocalSpec(lr=0.1, adaptive_clipping=adaptive)
    with pytest.raises(ValueError, match="must be private"):
        from dpfl.algorithms.client.program import LocalProgram
        LocalProgram(LocalSpec(lr=0.1, clip=0.1, sampling="poisson", adaptive_clipping=adaptive), steps=1)
    program = dpsgd(0.1, 0.1, steps=1, adaptive_clipping=adaptive)
    with pytest.raises(ValueError, match="privacy.adaptive_clipping: a phased local program"):
        PhasedProgram((dpsgd(0.1, 0.1, steps=1, trainable=("0.bias",), adaptive_clipping=adaptive), program))
    data = _data()
    model, start = _model()
    with pytest.raises(ValueError, match="a clip of its own is adaptive clipping's state"):
        run_local(model, LocalSpec(lr=0.1, clip=0.1, sampling="poisson"), [ClientPlan(0, 10, 1, clip=0.2)], data,
                  start, seed=0, round_=0)
    # the default sigma_b (expected batch / 20 = 0.5) leaves z = 1 nothing: refused naming the client
    with pytest.raises(ValueError, match=r"client 2: .*sigma_b=0.5 leaves the update no budget at noise multiplier "
                                         r"z=1"):
        run_local(model, LocalSpec(lr=0.1, clip=0.1, sampling="poisson", adaptive_clipping=adaptive),
                  [ClientPlan(2, 10, 1, noise_multiplier=1.0)], data, start, seed=0, round_=0)


def test_the_programs_state_is_one_float32_array_and_run_returns_a_new_one():
    adaptive = AdaptiveClipping(initial_clip=0.25, count_noise=2.0)
    program = dpsgd(0.1, 0.25, steps=2, adaptive_clipping=adaptive)
    state = program.init(1000)
    assert state[SAMPLE_CLIP].dtype == torch.float32 and state[SAMPLE_CLIP].shape == (1000,)
    assert bool((state[SAMPLE_CLIP] == torch.tensor(0.25)).all())
    assert dpsgd(0.1, 0.25, steps=2).init(1000) is None and sgd(0.1, steps=1).init(5) is None
    import numpy as np
    problem = program.adaptive_budget_problem(np.array([0.5, 4.5, 3.0]), np.array([100, 100, 100]),
                                              np.array([10, 10, 10]))
    assert problem.startswith("privacy.adaptive_clipping.count_noise: sigma_b=2 leaves client 1 (noise multiplier "
                              "z=4.5)") and "\n" not in problem
    default = dpsgd(0.1, 0.25, steps=2, adaptive_clipping=AdaptiveClipping(initial_clip=0.25))
    assert default.adaptive_budget_problem(np.array([3.5, 3.5]), np.array([400, 30]), np.array([100, 100])) \
        .startswith("privacy.adaptive_clipping.count_noise: sigma_b=1.5 (null: the expected batch 30 / 20) leaves "
                    "client 1")
    assert default.adaptive_budget_problem(np.array([1.0, 0.0]), np.array([400, 400]), np.array([100, 2])) is None

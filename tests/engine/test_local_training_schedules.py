"""Per-step learning rates (`ClientPlan.step_lrs`), batch clipping (`LocalSpec.clip_mode`) and the
per-example denominator under fixed / shuffle sampling, against hand-written torch autograd.

Tiny linear (softmax-regression) models, so every test runs in milliseconds.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from dpfl.engine import params as P
from dpfl.engine.local_training import ClientPlan, LocalSpec, run_local
from dpfl.engine.pooled import PooledData
from dpfl.engine.sampling import BatchStream
from dpfl.seeding import Purpose, torch_generator

D, C = 5, 3


def linear(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(D, C)


def two_layer(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D, 4), nn.Tanh(), nn.Linear(4, C))


def make_data(sizes=(12, 7, 9), scale: float = 1.0, seed: int = 1) -> PooledData:
    g = torch.Generator().manual_seed(seed)
    xs = [scale * torch.randn(n, D, generator=g) for n in sizes]
    ys = [torch.randint(0, C, (n,), generator=g) for n in sizes]
    return PooledData.from_clients(xs, ys)


def grad_mean(model: nn.Module, w: dict, x: torch.Tensor, y: torch.Tensor, names=None) -> dict:
    """Plain autograd: gradient of the mean cross-entropy over (x, y) at parameters w (w.r.t. `names`)."""
    names = list(w) if names is None else list(names)
    leaves = {n: t.detach().clone().requires_grad_(n in names) for n, t in w.items()}
    loss = nn.functional.cross_entropy(functional_call(model, leaves, (x,)), y)
    return dict(zip(names, torch.autograd.grad(loss, [leaves[n] for n in names]), strict=True))


def norm(g: dict) -> torch.Tensor:
    return torch.sqrt(sum(v.pow(2).sum() for v in g.values()))


def clip_to(g: dict, c: float) -> dict:
    s = min(1.0, c / float(norm(g)))
    return {n: s * v for n, v in g.items()}


def stream(sampling, data, plan, seed, round_):
    return BatchStream(sampling, data.size(plan.client), plan.batch_size,
                       torch_generator(seed, Purpose.BATCH, round_, plan.client), plan.steps)


def assert_bitwise(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for n in a:
        assert torch.equal(a[n], b[n]), n


def assert_close(a: dict, b: dict, **kw) -> None:
    kw = {"atol": 1e-6, "rtol": 1e-5, **kw}
    for n in b:
        torch.testing.assert_close(a[n], b[n], **kw)


# --- (a) step_lrs equal to spec.lr are the old path, bit for bit -----------------------------------------

@pytest.mark.parametrize("kw", [
    dict(lr=0.3, sampling="shuffle"),
    dict(lr=0.3, sampling="shuffle", momentum=0.9, prox_mu=0.2),
    dict(lr=0.3, sampling="poisson", clip=0.5, momentum=0.5, prox_mu=0.1),
    dict(lr=0.3, sampling="fixed", clip=0.5),
    dict(lr=0.3, sampling="shuffle", clip=0.2, clip_mode="batch", prox_mu=0.1),
])
def test_step_lrs_equal_to_spec_lr_are_bitwise_the_default(kw):
    model, data = linear(), make_data()
    spec = LocalSpec(**kw)
    z = 1.1 if kw.get("clip") and kw.get("clip_mode", "per_example") == "per_example" else 0.0
    plans = [ClientPlan(0, 4, 5, z), ClientPlan(1, 3, 2, z), ClientPlan(2, 5, 4, z)]
    scheduled = [ClientPlan(p.client, p.batch_size, p.steps, z, [spec.lr] * p.steps) for p in plans]
    w = P.model_params(model)
    a = run_local(model, spec, plans, data, w, seed=3, round_=2)
    b = run_local(model, spec, scheduled, data, w, seed=3, round_=2)
    assert_bitwise(a.params, b.params)
    assert a.noise_sq_norm == b.noise_sq_norm and a.records_used == b.records_used


# --- (b) two steps with rates (a, b) equal hand-written gradient descent ----------------------------------

def test_two_full_batch_steps_with_step_lrs_equal_hand_gradient_descent():
    model, data = linear(), make_data()
    rates = (0.7, 0.05)
    spec = LocalSpec(lr=123.0, sampling="fixed")  # spec.lr must not be used by a scheduled plan
    plans = [ClientPlan(k, data.size(k), 2, step_lrs=rates) for k in range(3)]
    w = P.model_params(model)
    res = run_local(model, spec, plans, data, w, seed=0, round_=0)
    for k in range(3):
        x, y = data.client(k)
        wk = dict(w)
        for lr in rates:
            g = grad_mean(model, wk, x, y)
            wk = {n: wk[n] - lr * g[n] for n in wk}
        assert_close({n: v[k] for n, v in res.params.items()}, wk)
        # and it is not the constant-rate result
        assert not torch.allclose(res.params["weight"][k], w["weight"] - 123.0 * grad_mean(model, w, x, y)["weight"])


def test_noisy_fedprox_batch_clip_with_schedule_equals_the_spec_recursion():
    """Spec fdp_accounting §1.1: w_{k+1} = w_k - eta_k (clip_V(grad f(w_k)) + alpha (w_k - w_start)),
    full batch, the prox term added after clipping (and never clipped)."""
    model, data = linear(), make_data(scale=10.0)
    rates, clip, alpha = (0.5, 0.25, 0.125), 0.3, 0.8
    spec = LocalSpec(lr=0.1, sampling="fixed", clip=clip, clip_mode="batch", prox_mu=alpha)
    plans = [ClientPlan(k, data.size(k), 3, step_lrs=rates) for k in range(3)]
    w = P.model_params(model)
    res = run_local(model, spec, plans, data, w, seed=0, round_=0)
    for k in range(3):
        x, y = data.client(k)
        wk = dict(w)
        for lr in rates:
            g = grad_mean(model, wk, x, y)
            assert float(norm(g)) > clip  # clipping is active
            g = clip_to(g, clip)
            wk = {n: wk[n] - lr * (g[n] + alpha * (wk[n] - w[n])) for n in wk}
        assert_close({n: v[k] for n, v in res.params.items()}, wk)


def test_step_lrs_scale_the_momentum_buffer_like_torch_sgd():
    """torch.optim.SGD with momentum, its lr changed before every step, on shuffled minibatches."""
    model, data = linear(), make_data()
    rates = (0.4, 0.3, 0.2, 0.1, 0.05)
    spec = LocalSpec(lr=0.1, sampling="shuffle", momentum=0.9, prox_mu=0.0)
    plan = ClientPlan(1, 3, 5, step_lrs=rates)
    res = run_local(model, spec, [plan], data, P.model_params(model), seed=4, round_=1)
    ref = linear()
    x, y = data.client(1)
    s = stream("shuffle", data, plan, 4, 1)
    opt = torch.optim.SGD(ref.parameters(), lr=1.0, momentum=0.9)
    for lr in rates:
        idx = s.next()
        opt.param_groups[0]["lr"] = lr
        opt.zero_grad()
        nn.functional.cross_entropy(ref(x[idx]), y[idx]).backward()
        opt.step()
    assert_close({n: v[0] for n, v in res.params.items()}, P.model_params(ref))


# --- (c) mixed cohorts equal clients alone ---------------------------------------------------------------

@pytest.mark.parametrize("kw", [
    dict(lr=0.2, sampling="shuffle", momentum=0.5, prox_mu=0.1),
    dict(lr=0.2, sampling="poisson", clip=0.5, momentum=0.5, prox_mu=0.1),
    dict(lr=0.2, sampling="shuffle", clip=0.5),
    dict(lr=0.2, sampling="fixed", clip=0.1, clip_mode="batch", prox_mu=0.3),
])
def test_mixed_cohort_equals_clients_alone(kw):
    model, data = linear(), make_data(sizes=(12, 7, 9, 10))
    spec = LocalSpec(**kw)
    z = 0.8 if "poisson" in kw.values() else 0.0
    plans = [
        ClientPlan(0, 4, 3, z, (0.5, 0.1, 0.9)),
        ClientPlan(1, 3, 5, z),
        ClientPlan(2, 5, 1, z, (0.05,)),
        ClientPlan(3, 2, 4, z, (1.0, 0.5, 0.25, 0.125)),
    ]
    w = P.model_params(model)
    together = run_local(model, spec, plans, data, w, seed=6, round_=3)
    chunked = run_local(model, spec, plans, data, w, seed=6, round_=3, max_elements=1)
    for i, p in enumerate(plans):
        alone = run_local(model, spec, [p], data, w, seed=6, round_=3)
        assert alone.records_used[0] == together.records_used[i]
        assert_close({n: v[i] for n, v in together.params.items()}, {n: v[0] for n, v in alone.params.items()})
        assert_close({n: v[i] for n, v in chunked.params.items()}, {n: v[0] for n, v in alone.params.items()})
    # the schedules matter: client 0 with the constant rate lands elsewhere
    const = run_local(model, spec, [ClientPlan(0, 4, 3, z)], data, w, seed=6, round_=3)
    assert not torch.allclose(const.params["weight"][0], together.params["weight"][0])


# --- (d) batch clipping ----------------------------------------------------------------------------------

def test_batch_clip_step_is_minus_lr_times_clipped_mean_gradient():
    model, data = linear(), make_data(scale=20.0)
    lr, clip = 0.5, 0.25
    plans = [ClientPlan(k, data.size(k), 1) for k in range(3)]
    w = P.model_params(model)
    batch = run_local(model, LocalSpec(lr=lr, sampling="fixed", clip=clip, clip_mode="batch"), plans, data, w,
                      seed=0, round_=0)
    per_ex = run_local(model, LocalSpec(lr=lr, sampling="fixed", clip=clip), plans, data, w, seed=0, round_=0)
    for k in range(3):
        x, y = data.client(k)
        g = grad_mean(model, w, x, y)
        assert float(norm(g)) > 4 * clip  # large gradients: clipping is active
        expected = {n: w[n] - lr * v for n, v in clip_to(g, clip).items()}
        got = {n: v[k] for n, v in batch.params.items()}
        assert_close(got, expected)
        step = norm({n: got[n] - w[n] for n in w})
        assert float(step) <= lr * clip * (1 + 1e-5)
        assert float(step) == pytest.approx(lr * clip, rel=1e-4)
        # per-example clipping averages clipped per-sample gradients: a different (shorter) step here
        step_pe = norm({n: per_ex.params[n][k] - w[n] for n in w})
        assert float((step - step_pe).abs()) > 1e-3 * lr * clip


def test_batch_clip_clips_the_mean_not_the_sum():
    """C = 2 ||mean gradient|| < ||sum of gradients||: the mean is below C, so the step is the plain one."""
    model, data = linear(), make_data(sizes=(12,), scale=3.0)
    x, y = data.client(0)
    w = P.model_params(model)
    g = grad_mean(model, w, x, y)
    clip = 2 * float(norm(g))
    res = run_local(model, LocalSpec(lr=0.5, sampling="fixed", clip=clip, clip_mode="batch"), [ClientPlan(0, 12, 1)],
                    data, w, seed=0, round_=0)
    assert_close({n: v[0] for n, v in res.params.items()}, {n: w[n] - 0.5 * g[n] for n in w})


def test_batch_clip_leaves_small_gradients_alone():
    """With C far above the gradient norm, batch clipping is plain minibatch SGD, bit for bit the
    non-clipped path (the factor is exactly 1)."""
    model, data = linear(), make_data()
    plans = [ClientPlan(0, 4, 3), ClientPlan(1, 3, 2)]
    w = P.model_params(model)
    clipped = run_local(model, LocalSpec(lr=0.3, sampling="shuffle", clip=1e6, clip_mode="batch"), plans, data, w,
                        seed=1, round_=0)
    plain = run_local(model, LocalSpec(lr=0.3, sampling="shuffle"), plans, data, w, seed=1, round_=0)
    assert_bitwise(clipped.params, plain.params)


def test_batch_clip_norm_is_over_trainable_coordinates_only():
    model, data = two_layer(), make_data(sizes=(10,), scale=5.0)
    with torch.no_grad():
        model[2].weight.mul_(0.1)  # small trainable gradient next to the frozen layer's
    trainable = ("0.weight", "0.bias")
    lr = 0.5
    w = P.model_params(model)
    x, y = data.client(0)
    g_t = grad_mean(model, w, x, y, trainable)
    g_all = grad_mean(model, w, x, y)
    clip = 0.5 * float(norm(g_t))  # clipping active over the trainable norm; a full norm would clip more
    assert float(norm(g_all)) > 1.5 * float(norm(g_t))
    spec = LocalSpec(lr=lr, sampling="fixed", clip=clip, clip_mode="batch", trainable=trainable)
    res = run_local(model, spec, [ClientPlan(0, 10, 1)], data, w, seed=0, round_=0)
    expected = {n: w[n] - lr * v for n, v in clip_to(g_t, clip).items()}
    assert_close({n: res.params[n][0] for n in trainable}, expected)
    for n in ("2.weight", "2.bias"):
        assert torch.equal(res.params[n][0], w[n])


# --- (e) denominator of the per-example clipped path -----------------------------------------------------

def _per_example_reference(model, w, data, plan, sampling, clip, seed, round_, nominal: bool):
    """Clip each sample's gradient to `clip`, sum, divide by the actual count (or the nominal size), step."""
    x, y = data.client(plan.client)
    s = stream(sampling, data, plan, seed, round_)
    wk = dict(w)
    lrs = plan.step_lrs or (0.5,) * plan.steps
    for lr in lrs:
        idx = s.next()
        total = {n: torch.zeros_like(v) for n, v in wk.items()}
        for r in idx.tolist():
            g = clip_to(grad_mean(model, wk, x[r : r + 1], y[r : r + 1]), clip)
            total = {n: total[n] + g[n] for n in total}
        denom = plan.batch_size if nominal else max(1, len(idx))
        wk = {n: wk[n] - lr * total[n] / denom for n in wk}
    return wk


def test_shuffle_partial_last_batch_averages_over_the_records_drawn():
    """7 records, batch 3: batches of 3, 3, 1. The last step averages its single clipped gradient
    (divides by 1, not by 3)."""
    model, data = linear(), make_data(sizes=(7,), scale=10.0)
    clip = 0.2
    plan = ClientPlan(0, 3, 3)
    s = stream("shuffle", data, plan, 2, 5)
    assert [len(s.next()) for _ in range(3)] == [3, 3, 1]
    w = P.model_params(model)
    res = run_local(model, LocalSpec(lr=0.5, sampling="shuffle", clip=clip), [plan], data, w, seed=2, round_=5)
    got = {n: v[0] for n, v in res.params.items()}
    assert_close(got, _per_example_reference(model, w, data, plan, "shuffle", clip, 2, 5, nominal=False))
    wrong = _per_example_reference(model, w, data, plan, "shuffle", clip, 2, 5, nominal=True)
    assert not torch.allclose(got["weight"], wrong["weight"], atol=1e-4)


def test_fixed_sampling_per_example_average_with_step_lrs():
    model, data = linear(), make_data(sizes=(9,), scale=10.0)
    plan = ClientPlan(0, 4, 3, step_lrs=(0.9, 0.3, 0.1))
    w = P.model_params(model)
    res = run_local(model, LocalSpec(lr=0.5, sampling="fixed", clip=0.2), [plan], data, w, seed=8, round_=0)
    assert_close({n: v[0] for n, v in res.params.items()},
                 _per_example_reference(model, w, data, plan, "fixed", 0.2, 8, 0, nominal=False))


def test_poisson_still_divides_by_the_nominal_batch_size():
    model, data = linear(), make_data(sizes=(20,), scale=10.0)
    plan = ClientPlan(0, 6, 3)
    w = P.model_params(model)
    res = run_local(model, LocalSpec(lr=0.5, sampling="poisson", clip=0.2), [plan], data, w, seed=1, round_=0)
    s = stream("poisson", data, plan, 1, 0)
    assert [len(s.next()) for _ in range(3)] != [6, 6, 6]  # the nominal and actual sizes differ somewhere
    assert_close({n: v[0] for n, v in res.params.items()},
                 _per_example_reference(model, w, data, plan, "poisson", 0.2, 1, 0, nominal=True))


# --- (f) validation --------------------------------------------------------------------------------------

def test_bad_step_lrs_fail_clearly():
    with pytest.raises(ValueError, match="client 4: step_lrs has 2 entries for 3 steps"):
        ClientPlan(4, 2, 3, step_lrs=(0.1, 0.2))
    for bad in (0.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="client 5: step_lrs must be finite and > 0"):
            ClientPlan(5, 2, 2, step_lrs=(0.1, bad))
    plan = ClientPlan(1, 2, 2, step_lrs=[0.1, 0.2])
    assert plan.step_lrs == (0.1, 0.2) and isinstance(plan.step_lrs, tuple)
    assert ClientPlan(1, 2, 0, step_lrs=()).step_lrs == ()
    assert ClientPlan(1, 2, 2).step_lrs is None
    hash(plan)  # still a usable frozen dataclass


def test_bad_clip_modes_fail_clearly():
    with pytest.raises(ValueError, match="clip_mode"):
        LocalSpec(lr=0.1, clip=1.0, clip_mode="per_batch")
    with pytest.raises(ValueError, match="clip"):
        LocalSpec(lr=0.1, clip_mode="batch")
    assert LocalSpec(lr=0.1).clip_mode == "per_example"
    model, data = linear(), make_data()
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=1.0, clip_mode="batch")
    with pytest.raises(ValueError, match="client 2: noise needs per-example clipping"):
        run_local(model, spec, [ClientPlan(0, 3, 1), ClientPlan(2, 3, 1, 1.0)], data, P.model_params(model),
                  seed=0, round_=0)
    run_local(model, spec, [ClientPlan(0, 3, 1)], data, P.model_params(model), seed=0, round_=0)  # no noise: fine

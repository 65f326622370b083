"""The vectorised local trainer against plain per-client PyTorch, and its DP mechanics."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from dpfl.engine import params as P
from dpfl.engine.local_training import (ClientPlan, LocalSpec, _clipped_sum, _per_sample_grad_fn, replay_noise,
                                       run_local)
from dpfl.engine.losses import per_sample_loss
from dpfl.engine.pooled import PooledData
from dpfl.engine.sampling import BatchStream, NoiseStream
from dpfl.seeding import Purpose, torch_generator


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 16), nn.ReLU(),
        nn.Linear(16, 10)
    )


def make_data(sizes=(50, 30, 70), seed=1) -> PooledData:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, 1, 8, 8, generator=g) for n in sizes]
    ys = [torch.randint(0, 10, (n,), generator=g) for n in sizes]
    return PooledData.from_clients(xs, ys)


def plain_sgd_run(model, spec, plan, data, seed, round_):
    """Reference: one client, nn.Module + autograd, the same batches (same generator stream)."""
    model = _copy(model)
    x, y = data.client(plan.client)
    stream = BatchStream(spec.sampling, len(x), plan.batch_size,
                         torch_generator(seed, Purpose.BATCH, round_, plan.client), plan.steps)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr)
    for _ in range(plan.steps):
        idx = stream.next()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return P.model_params(model)


def _copy(model):
    import copy

    return copy.deepcopy(model)


@pytest.mark.parametrize("sampling", ["shuffle", "fixed"])
def test_unclipped_noiseless_step_equals_plain_pytorch(sampling):
    model, data = small_cnn(), make_data()
    spec = LocalSpec(lr=0.1, sampling=sampling)
    plans = [ClientPlan(0, 8, 4), ClientPlan(1, 5, 6), ClientPlan(2, 16, 3)]
    res = run_local(model, spec, plans, data, P.model_params(model), seed=7, round_=2)
    for i, plan in enumerate(plans):
        ref = plain_sgd_run(model, spec, plan, data, seed=7, round_=2)
        for n in ref:
            torch.testing.assert_close(res.params[n][i], ref[n], atol=1e-6, rtol=1e-5)


def test_dpsgd_with_huge_clip_and_no_noise_equals_plain_step():
    """Fixed-size batches divide by the nominal size = the actual size, so DP-SGD without clipping
    effect and without noise is exactly minibatch SGD: this checks the per-sample path end to end."""
    model, data = small_cnn(), make_data()
    spec = LocalSpec(lr=0.05, sampling="fixed", clip=1e9)
    plans = [ClientPlan(0, 8, 3), ClientPlan(2, 12, 3)]
    res = run_local(model, spec, plans, data, P.model_params(model), seed=3, round_=0)
    for i, plan in enumerate(plans):
        ref = plain_sgd_run(model, LocalSpec(lr=0.05, sampling="fixed"), plan, data, seed=3, round_=0)
        for n in ref:
            torch.testing.assert_close(res.params[n][i], ref[n], atol=1e-6, rtol=1e-5)


def test_every_per_sample_contribution_is_clipped_to_C():
    model, data = small_cnn(), make_data(sizes=(20, 20, 20, 20))
    w = P.broadcast(P.model_params(model), 4)
    grads_of = _per_sample_grad_fn(model, per_sample_loss("cross_entropy"))
    for clip in (1e-3, 0.05, 0.5):
        # batch of one record per client: the clipped sum is that record's clipped gradient
        for j in range(5):
            x, y, owner = data.gather_packed(torch.arange(4), [torch.tensor([j])] * 4)
            raw = P.global_norms(grads_of(w, x, y))
            clipped = P.global_norms(_clipped_sum(grads_of, w, x, y, owner, clip))
            assert (clipped <= clip * (1 + 1e-5)).all()
            expected = torch.minimum(raw, torch.full_like(raw, clip))
            torch.testing.assert_close(clipped, expected, rtol=1e-4, atol=1e-9)


def test_clipped_sum_adds_each_clients_own_samples_only():
    model, data = small_cnn(), make_data(sizes=(20, 20, 20))
    w = P.broadcast(P.model_params(model), 3)
    w = {n: v + 0.01 * torch.randn_like(v) for n, v in w.items()}  # clients at different parameters
    grads_of = _per_sample_grad_fn(model, per_sample_loss("cross_entropy"))
    idx = [torch.tensor([0, 3, 5]), torch.tensor([], dtype=torch.int64), torch.tensor([7])]
    x, y, owner = data.gather_packed(torch.arange(3), idx)
    assert owner.tolist() == [0, 0, 0, 2]
    total = _clipped_sum(grads_of, w, x, y, owner, 0.1)
    for k, rows in enumerate(idx):
        expected = {n: torch.zeros_like(v[k]) for n, v in w.items()}
        for r in rows.tolist():
            xi, yi = data.client(k)[0][r : r + 1], data.client(k)[1][r : r + 1]
            g = grads_of({n: v[k : k + 1] for n, v in w.items()}, xi, yi)
            scale = min(1.0, 0.1 / float(P.global_norms(g)[0]))
            expected = {n: expected[n] + scale * g[n][0] for n in expected}
        for n in expected:
            torch.testing.assert_close(total[n][k], expected[n], atol=1e-7, rtol=1e-5)


def test_clipping_uses_one_global_norm_over_all_tensors():
    model, data = small_cnn(), make_data(sizes=(10,))
    w = P.broadcast(P.model_params(model), 1)
    grads_of = _per_sample_grad_fn(model, per_sample_loss("cross_entropy"))
    x, y, owner = data.gather_packed(torch.arange(1), [torch.tensor([0])])
    raw = grads_of(w, x, y)
    clip = 1e-3
    out = _clipped_sum(grads_of, w, x, y, owner, clip)
    scale = clip / float(P.global_norms(raw)[0])
    for n in raw:  # every tensor scaled by the same factor
        torch.testing.assert_close(out[n][0], raw[n][0] * scale, rtol=1e-4, atol=1e-10)


def test_injected_noise_has_configured_std():
    """One step; the parameter change minus the noiseless change is -lr * z * C * xi / b.

    ~2,300 coordinates x 3 clients: the sample std's relative standard error is about 1/sqrt(2n)
    ~ 0.8%, so a 4% tolerance is a > 4 sigma bound with the seed fixed.
    """
    model, data = small_cnn(), make_data()
    lr, clip = 0.5, 0.7
    plans = [ClientPlan(0, 8, 1, 1.3), ClientPlan(1, 5, 1, 0.6), ClientPlan(2, 16, 1, 2.5)]
    quiet = [ClientPlan(p.client, p.batch_size, p.steps, 0.0) for p in plans]
    spec = LocalSpec(lr=lr, sampling="poisson", clip=clip)
    w = P.model_params(model)
    noisy = run_local(model, spec, plans, data, w, seed=11, round_=0)
    clean = run_local(model, spec, quiet, data, w, seed=11, round_=0)
    diff = P.flatten(noisy.params) - P.flatten(clean.params)
    for i, p in enumerate(plans):
        expected = lr * p.noise_multiplier * clip / p.batch_size
        assert abs(float(diff[i].std()) / expected - 1) < 0.04
        assert abs(float(diff[i].mean())) < 4 * expected / diff.shape[1] ** 0.5


def test_cohort_equals_clients_one_by_one():
    model, data = small_cnn(), make_data(sizes=(50, 30, 70, 9))
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=1.0, momentum=0.5, prox_mu=0.1)
    plans = [ClientPlan(0, 8, 5, 1.0), ClientPlan(1, 4, 3, 0.5), ClientPlan(2, 16, 7, 2.0), ClientPlan(3, 3, 1, 1.1)]
    w = P.model_params(model)
    together = run_local(model, spec, plans, data, w, seed=3, round_=4)
    for i, p in enumerate(plans):
        alone = run_local(model, spec, [p], data, w, seed=3, round_=4)
        assert alone.records_used[0] == together.records_used[i]
        for n in w:
            torch.testing.assert_close(together.params[n][i], alone.params[n][0], atol=1e-6, rtol=1e-5)


def test_chunking_the_cohort_changes_nothing():
    model, data = small_cnn(), make_data()
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=1.0)
    plans = [ClientPlan(0, 8, 3, 1.0), ClientPlan(1, 4, 3, 0.5), ClientPlan(2, 16, 2, 2.0)]
    w = P.model_params(model)
    whole = run_local(model, spec, plans, data, w, seed=5, round_=1)
    chunked = run_local(model, spec, plans, data, w, seed=5, round_=1, max_elements=1)
    for n in w:
        torch.testing.assert_close(whole.params[n], chunked.params[n], atol=1e-6, rtol=1e-5)


def test_empty_poisson_batch_takes_a_noise_only_step():
    """A step whose Poisson batch is empty still adds exactly -lr * z * C * xi / b (xi: the client's noise draw)."""
    model, data = small_cnn(), make_data(sizes=(500,))
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=0.8)
    plan = ClientPlan(0, 1, 1, 1.5)  # q = 1/500: the single batch is empty with probability ~ 1/e
    w = P.model_params(model)
    round_ = next(r for r in range(50)
                  if run_local(model, spec, [plan], data, w, seed=0, round_=r).records_used[0] == 0)
    res = run_local(model, spec, [plan], data, w, seed=0, round_=round_)
    assert res.empty_batches[0] == 1
    xi = NoiseStream(P.num_parameters(w), 1, torch_generator(0, Purpose.NOISE, round_, 0)).next()
    torch.testing.assert_close(P.flatten(res.params)[0] - P.flatten(w, leading=0), -0.1 * 1.5 * 0.8 * xi / 1)


def test_poisson_batches_are_never_truncated():
    """The records a client uses equal the sum of its Poisson draws, whatever the other clients draw."""
    data = make_data(sizes=(400, 400))
    model = small_cnn()
    spec = LocalSpec(lr=0.01, sampling="poisson", clip=1.0)
    res = run_local(model, spec, [ClientPlan(0, 40, 10, 1.0), ClientPlan(1, 2, 10, 1.0)], data,
                    P.model_params(model), seed=9, round_=0)
    for i, (client, b) in enumerate([(0, 40), (1, 2)]):
        stream = BatchStream("poisson", 400, b, torch_generator(9, Purpose.BATCH, 0, client), 10)
        assert res.records_used[i] == sum(len(stream.next()) for _ in range(10))


def test_noise_without_clip_is_refused():
    model, data = small_cnn(), make_data()
    with pytest.raises(ValueError, match="clip"):
        run_local(model, LocalSpec(lr=0.1, sampling="poisson"), [ClientPlan(0, 4, 1, 1.0)], data,
                  P.model_params(model), seed=0, round_=0)


def test_bad_specs_fail_clearly():
    with pytest.raises(ValueError, match="sampling"):
        LocalSpec(lr=0.1, sampling="bootstrap")
    with pytest.raises(ValueError, match="lr"):
        LocalSpec(lr=0.0)
    with pytest.raises(ValueError, match="unknown loss"):
        LocalSpec(lr=0.1, loss="hinge")


def test_momentum_and_proximal_term_equal_plain_pytorch():
    """SGD with momentum (torch.optim.SGD semantics) on f(w) + mu/2 ||w - w_start||^2."""
    model, data = small_cnn(), make_data()
    spec = LocalSpec(lr=0.05, sampling="shuffle", momentum=0.9, prox_mu=0.3)
    plan = ClientPlan(1, 6, 8)
    res = run_local(model, spec, [plan, ClientPlan(0, 4, 3)], data, P.model_params(model), seed=2, round_=0)
    ref = _copy(model)
    start = [p.detach().clone() for p in ref.parameters()]
    x, y = data.client(1)
    stream = BatchStream("shuffle", len(x), 6, torch_generator(2, Purpose.BATCH, 0, 1), 8)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for _ in range(8):
        idx = stream.next()
        opt.zero_grad()
        prox = sum((p - s).pow(2).sum() for p, s in zip(ref.parameters(), start, strict=True))
        (nn.functional.cross_entropy(ref(x[idx]), y[idx]) + 0.3 / 2 * prox).backward()
        opt.step()
    for n, t in P.model_params(ref).items():
        torch.testing.assert_close(res.params[n][0], t, atol=1e-6, rtol=1e-5)


def test_recorded_noise_matches_the_oracle_formula():
    """Spec heterogeneous_dp §8.7: over 50 repetitions the mean ||n_i||^2, n_i = -(eta/b) sum_t xi_t (zC),
    equals T eta^2 p C^2 z^2 / b^2 within 3 standard errors."""
    model, data = small_cnn(), make_data(sizes=(60,))
    lr, clip, z, b, steps = 0.1, 0.5, 1.3, 6, 4
    spec = LocalSpec(lr=lr, sampling="poisson", clip=clip)
    w = P.model_params(model)
    p = P.num_parameters(w)
    samples = torch.tensor([
        run_local(model, spec, [ClientPlan(0, b, steps, z)], data, w, seed=0, round_=r).noise_sq_norm[0] * (lr / b) ** 2
        for r in range(50)
    ])
    expected = steps * lr**2 * p * clip**2 * z**2 / b**2
    assert abs(float(samples.mean()) - expected) < 3 * float(samples.std()) / 50**0.5


# --- training a subset of tensors (`LocalSpec.trainable`, CENTAUR's head / representation phases) ---

HEAD = ("6.weight", "6.bias")
BODY = ("0.weight", "0.bias", "4.weight", "4.bias")


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for n in a:
        assert torch.equal(a[n], b[n]), n


@pytest.mark.parametrize("kw", [
    dict(lr=0.1, sampling="shuffle", momentum=0.5),
    dict(lr=0.1, sampling="poisson", clip=0.5, momentum=0.5, prox_mu=0.1),
])
def test_trainable_all_names_is_exactly_the_default(kw):
    """Naming every tensor (in any order) is bit-for-bit the default path, noise included."""
    model, data = small_cnn(), make_data()
    z = 1.2 if "clip" in kw else 0.0
    plans = [ClientPlan(0, 8, 4, z), ClientPlan(1, 5, 2, z), ClientPlan(2, 16, 3, z)]
    w = P.model_params(model)
    default = run_local(model, LocalSpec(**kw), plans, data, w, seed=4, round_=1)
    named = run_local(model, LocalSpec(**kw, trainable=tuple(reversed(list(w)))), plans, data, w, seed=4, round_=1)
    _assert_same(default.params, named.params)
    assert default.noise_sq_norm == named.noise_sq_norm
    assert default.records_used == named.records_used


@pytest.mark.parametrize("kw", [
    dict(lr=0.1, sampling="shuffle"),
    dict(lr=0.1, sampling="shuffle", momentum=0.9, prox_mu=0.3),
    dict(lr=0.1, sampling="poisson", clip=0.5),
    dict(lr=0.1, sampling="poisson", clip=0.5, momentum=0.9, prox_mu=0.3),
])
@pytest.mark.parametrize("trainable", [HEAD, BODY])
def test_frozen_tensors_come_back_bit_identical(kw, trainable):
    model, data = small_cnn(), make_data()
    z = 1.5 if "clip" in kw else 0.0
    plans = [ClientPlan(0, 8, 4, z), ClientPlan(1, 5, 6, z), ClientPlan(2, 16, 2, z)]
    w = P.model_params(model)
    res = run_local(model, LocalSpec(**kw, trainable=trainable), plans, data, w, seed=1, round_=3)
    for n, t in w.items():
        for i in range(len(plans)):
            if n in trainable:
                assert not torch.equal(res.params[n][i], t), f"{n} did not train"
            else:
                assert torch.equal(res.params[n][i], t), f"frozen {n} changed"


def test_sgd_on_a_subset_equals_pytorch_with_frozen_parameters():
    """Momentum SGD on f(w) + mu/2 ||w_T - w_T,start||^2 over the trainable tensors T only, with the
    others requires_grad=False: the batched (non-DP) path with a frozen argument."""
    model, data = small_cnn(), make_data()
    spec = LocalSpec(lr=0.05, sampling="shuffle", momentum=0.9, prox_mu=0.3, trainable=BODY)
    plan = ClientPlan(1, 6, 8)
    res = run_local(model, spec, [plan, ClientPlan(0, 4, 3)], data, P.model_params(model), seed=2, round_=0)
    ref = _copy(model)
    for n, p in ref.named_parameters():
        p.requires_grad_(n in BODY)
    params = [p for p in ref.parameters() if p.requires_grad]
    start = [p.detach().clone() for p in params]
    x, y = data.client(1)
    stream = BatchStream("shuffle", len(x), 6, torch_generator(2, Purpose.BATCH, 0, 1), 8)
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    for _ in range(8):
        idx = stream.next()
        opt.zero_grad()
        prox = sum((p - s).pow(2).sum() for p, s in zip(params, start, strict=True))
        (nn.functional.cross_entropy(ref(x[idx]), y[idx]) + 0.3 / 2 * prox).backward()
        opt.step()
    for n, t in ref.named_parameters():
        torch.testing.assert_close(res.params[n][0], t.detach(), atol=1e-6, rtol=1e-5)


def test_dpsgd_clipping_norm_is_over_trainable_coordinates_only():
    """Frozen second layer scaled by 1e-3 and inputs of size ~30: each sample's gradient norm over the
    trainable first layer is < C = 0.2 but over all tensors > 20 C. With no noise and one fixed-size
    batch of every record, the step must be the *unclipped* mean gradient of the first layer (were the
    frozen tensors in the norm, every sample would be scaled by < 0.05)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3))
    with torch.no_grad():
        model[1].weight.mul_(1e-3)
    g = torch.Generator().manual_seed(0)
    xs = [30 * torch.randn(12, 4, generator=g) for _ in range(2)]
    ys = [torch.randint(0, 3, (12,), generator=g) for _ in range(2)]
    data = PooledData.from_clients(xs, ys)
    trainable, clip, lr = ("0.weight", "0.bias"), 0.2, 1.0
    spec = LocalSpec(lr=lr, sampling="fixed", clip=clip, trainable=trainable)
    w = P.model_params(model)
    res = run_local(model, spec, [ClientPlan(0, 12, 1), ClientPlan(1, 12, 1)], data, w, seed=0, round_=0)
    for k in range(2):
        total = {n: torch.zeros_like(w[n]) for n in trainable}
        for j in range(12):
            model.zero_grad()
            nn.functional.cross_entropy(model(xs[k][j : j + 1]), ys[k][j : j + 1]).backward()
            grads = dict(model.named_parameters())
            t_norm = sum(grads[n].grad.pow(2).sum() for n in trainable).sqrt()
            full = sum(p.grad.pow(2).sum() for p in model.parameters()).sqrt()
            assert t_norm < clip and full > 20 * clip  # the case separates the two norms
            total = {n: total[n] + grads[n].grad for n in trainable}
        for n in trainable:
            torch.testing.assert_close(res.params[n][k], w[n] - lr * total[n] / 12, atol=1e-6, rtol=1e-5)
        for n in ("1.weight", "1.bias"):
            assert torch.equal(res.params[n][k], w[n])


def test_dpsgd_clips_a_large_trainable_gradient_to_C():
    """Complement of the test above: with the trainable tensor's own gradient above C it is clipped to C."""
    model, data = small_cnn(), make_data(sizes=(20, 20))
    grads_of = _per_sample_grad_fn(model, per_sample_loss("cross_entropy"))
    w = P.broadcast(P.model_params(model), 2)
    wt = {n: w[n] for n in HEAD}
    frozen = {n: v for n, v in w.items() if n not in HEAD}
    x, y, owner = data.gather_packed(torch.arange(2), [torch.tensor([0]), torch.tensor([1])])
    raw = grads_of(wt, x, y, frozen=frozen)
    assert raw.keys() == set(HEAD)  # no gradient is computed for frozen tensors
    full = P.global_norms(grads_of(w, x, y))
    torch.testing.assert_close(P.global_norms(raw), P.global_norms({n: grads_of(w, x, y)[n] for n in HEAD}))
    clip = 0.5 * float(P.global_norms(raw).min())
    out = _clipped_sum(grads_of, wt, x, y, owner, clip, frozen)
    torch.testing.assert_close(P.global_norms(out), torch.full((2,), clip), rtol=1e-5, atol=0)
    assert (full > P.global_norms(raw)).all()


def test_replayed_noise_is_the_noise_the_steps_added():
    """replay_noise redraws each client's summed noise from its own generator: bit-identical to the sum run_local
    added (its squared norm times (z C)^2 is the logged noise_sq_norm exactly), for clients with different step
    counts trained together (the longest first, so the active prefix shrinks), zeros for a client without noise,
    and another round or seed draws other noise."""
    model, data = small_cnn(), make_data()
    clip, trainable = 0.7, ("4.weight", "4.bias")
    plans = [ClientPlan(0, 8, 5, 1.3), ClientPlan(1, 5, 2, 0.0), ClientPlan(2, 16, 3, 2.5)]
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=clip, trainable=trainable)
    w = P.model_params(model)
    res = run_local(model, spec, plans, data, w, seed=11, round_=3)
    sums = replay_noise(plans, 592, seed=11, round_=3)
    assert sums.shape == (3, 592) and torch.equal(sums[1], torch.zeros(592))
    scale = torch.tensor([p.noise_multiplier * clip for p in plans])
    assert (sums.pow(2).sum(1) * scale.pow(2)).tolist() == res.noise_sq_norm  # exact: same draws, same additions
    # the sum of five standard-normal vectors: ||.||^2 = 5 chi^2_592, mean 2960, sd 5 sqrt(2 * 592) = 172 (5.8%)
    assert float(sums[0].pow(2).sum()) == pytest.approx(5 * 592, rel=0.25)
    assert not torch.equal(replay_noise(plans, 592, seed=11, round_=4)[0], sums[0])
    assert not torch.equal(replay_noise(plans, 592, seed=12, round_=3)[0], sums[0])


def test_noise_is_drawn_on_trainable_coordinates_only():
    """One step: noisy minus noiseless parameters is exactly -lr z C xi / b on the trainable tensors,
    xi the client's (seed, round, client) noise stream of dimension = trainable scalars (592 here),
    and zero on the frozen ones. The pooled normalised std over 3 x 592 coordinates has relative
    standard error 1/sqrt(2 * 1776) ~ 1.7%, so 7% is a > 4 sigma bound with the seed fixed."""
    model, data = small_cnn(), make_data()
    lr, clip, trainable = 0.5, 0.7, ("4.weight", "4.bias")
    plans = [ClientPlan(0, 8, 1, 1.3), ClientPlan(1, 5, 1, 0.6), ClientPlan(2, 16, 1, 2.5)]
    quiet = [ClientPlan(p.client, p.batch_size, p.steps, 0.0) for p in plans]
    spec = LocalSpec(lr=lr, sampling="poisson", clip=clip, trainable=trainable)
    w = P.model_params(model)
    noisy = run_local(model, spec, plans, data, w, seed=11, round_=0)
    clean = run_local(model, spec, quiet, data, w, seed=11, round_=0)
    dim_t = sum(w[n].numel() for n in trainable)
    assert dim_t == 592
    diff = P.flatten({n: noisy.params[n] for n in trainable}) - P.flatten({n: clean.params[n] for n in trainable})
    normalised = []
    for i, p in enumerate(plans):
        for n in w:
            if n not in trainable:
                assert torch.equal(noisy.params[n][i], w[n])
        xi = NoiseStream(dim_t, 1, torch_generator(11, Purpose.NOISE, 0, p.client)).next()
        scale = lr * p.noise_multiplier * clip / p.batch_size
        torch.testing.assert_close(diff[i], -scale * xi, atol=1e-6, rtol=1e-4)
        assert noisy.noise_sq_norm[i] == pytest.approx(float(xi.pow(2).sum()) * (p.noise_multiplier * clip) ** 2,
                                                       rel=1e-5)
        normalised.append(diff[i] / scale)
    pooled = torch.cat(normalised)
    assert abs(float(pooled.std()) - 1) < 0.07
    assert abs(float(pooled.mean())) < 4 / pooled.numel() ** 0.5


@pytest.mark.parametrize("trainable", [HEAD, BODY])
def test_cohort_equals_clients_one_by_one_with_a_subset(trainable):
    """Each client starts from its own parameters (its own head), as CENTAUR's clients do."""
    model, data = small_cnn(), make_data(sizes=(50, 30, 70, 9))
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=1.0, momentum=0.5, prox_mu=0.1, trainable=trainable)
    plans = [ClientPlan(0, 8, 5, 1.0), ClientPlan(1, 4, 3, 0.5), ClientPlan(2, 16, 7, 2.0), ClientPlan(3, 3, 1, 1.1)]
    g = torch.Generator().manual_seed(5)
    w = {n: v + 0.05 * torch.randn(v.shape, generator=g) for n, v in P.broadcast(P.model_params(model), 4).items()}
    together = run_local(model, spec, plans, data, w, seed=3, round_=4, stacked_start=True)
    chunked = run_local(model, spec, plans, data, w, seed=3, round_=4, stacked_start=True, max_elements=1)
    for i, p in enumerate(plans):
        alone = run_local(model, spec, [p], data, P.select(w, torch.tensor([i])), seed=3, round_=4, stacked_start=True)
        assert alone.records_used[0] == together.records_used[i]
        assert alone.noise_sq_norm[0] == pytest.approx(together.noise_sq_norm[i], rel=1e-6)
        for n in w:
            torch.testing.assert_close(together.params[n][i], alone.params[n][0], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(together.params[n][i], chunked.params[n][i], atol=1e-6, rtol=1e-5)
            if n not in trainable:
                assert torch.equal(together.params[n][i], w[n][i])


def test_bad_trainable_fails_clearly():
    model, data = small_cnn(), make_data()
    w = P.model_params(model)
    with pytest.raises(ValueError, match="fc9.weight") as err:
        run_local(model, LocalSpec(lr=0.1, trainable=("6.weight", "fc9.weight", "head.bias")), [ClientPlan(0, 4, 1)],
                  data, w, seed=0, round_=0)
    assert "head.bias" in str(err.value) and "'6.weight'" not in str(err.value).split("known")[0]
    with pytest.raises(ValueError, match="empty"):
        LocalSpec(lr=0.1, trainable=())
    with pytest.raises(ValueError, match="repeated"):
        LocalSpec(lr=0.1, trainable=("6.bias", "6.bias"))
    with pytest.raises(ValueError, match="sequence"):
        LocalSpec(lr=0.1, trainable="6.bias")
    assert LocalSpec(lr=0.1, trainable=["6.bias"]).trainable == ("6.bias",)


def test_the_prox_term_can_pull_towards_an_anchor_instead_of_the_start():
    """MR-MTL: start from theta_i, pull towards thetabar. After one step the two runs differ by exactly
    lr * mu * (anchor - start) (the data gradient and the noise are the same draws)."""
    model, data = small_cnn(), make_data()
    plans = [ClientPlan(0, 8, 1, 1.0), ClientPlan(1, 4, 1, 0.5)]
    w = P.model_params(model)
    anchor = {n: t + 0.1 for n, t in w.items()}
    base = LocalSpec(lr=0.1, sampling="poisson", clip=1.0, prox_mu=2.0)
    to_start = run_local(model, base, plans, data, w, seed=4, round_=2)
    to_anchor = run_local(model, replace(base, prox_to="anchor"), plans, data, w, seed=4, round_=2, anchor=anchor)
    for n in w:
        torch.testing.assert_close(to_anchor.params[n] - to_start.params[n],
                                   (0.1 * 2.0 * (anchor[n] - w[n])).expand_as(to_start.params[n]), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="go together"):
        run_local(model, base, plans, data, w, seed=4, round_=2, anchor=anchor)


def test_micro_batches_accumulate_to_the_one_shot_step():
    """clustered_dpfl.md §9.7: DP-SGD with gradient accumulation (physical micro-batches of 16) equals the one-shot
    full batch for the same noise draw (float32, relative 1e-5)."""
    model, data = small_cnn(), make_data(sizes=(50, 70))
    plans = [ClientPlan(0, 50, 2, 1.0), ClientPlan(1, 70, 2, 0.7)]  # full batches, Poisson at q = 1
    w = P.model_params(model)
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=0.5)
    one = run_local(model, spec, plans, data, w, seed=9, round_=0)
    for engine in ("auto", "vmap"):
        acc = run_local(model, replace(spec, micro_batch=16), plans, data, w, seed=9, round_=0, engine=engine)
        for n in w:
            torch.testing.assert_close(acc.params[n], one.params[n], atol=1e-6, rtol=1e-5)
        assert acc.records_used == one.records_used
    with pytest.raises(ValueError, match="micro_batch"):
        LocalSpec(lr=0.1, micro_batch=0)


def test_a_step_beyond_the_memory_budget_is_accumulated_automatically(monkeypatch):
    """A client step whose per-sample records alone exceed max_elements (a full-batch round) runs as physical
    micro-batches sized to the budget; within the budget nothing changes (no micro-batches, the same floats)."""
    import dpfl.engine.local_training as lt

    model, data = small_cnn(), make_data(sizes=(50, 70))
    plans = [ClientPlan(0, 50, 2, 1.0), ClientPlan(1, 70, 2, 0.7)]
    w = P.model_params(model)
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=0.5)
    seen = []
    real = lt._accumulated
    monkeypatch.setattr(lt, "_accumulated", lambda *a: seen.append(a[-1]) or real(*a))
    for engine in ("auto", "vmap"):
        seen.clear()
        one = run_local(model, spec, plans, data, w, seed=9, round_=0, engine=engine)
        assert set(seen) == {None}
        seen.clear()
        small = run_local(model, spec, plans, data, w, seed=9, round_=0, engine=engine, max_elements=50_000)
        micro = set(seen)
        assert len(micro) == 1 and 1 <= next(iter(micro)) < 70  # accumulated, in chunks smaller than the batch
        for n in w:
            torch.testing.assert_close(small.params[n], one.params[n], atol=1e-6, rtol=1e-5)
        assert small.records_used == one.records_used

"""The vectorised local trainer against plain per-client PyTorch, and its DP mechanics."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfl.engine import params as P
from dpfl.engine.local_training import ClientPlan, LocalSpec, _clipped_sum, _per_sample_grad_fn, run_local
from dpfl.engine.losses import per_sample_loss
from dpfl.engine.pooled import PooledData
from dpfl.engine.sampling import BatchStream, NoiseStream
from dpfl.seeding import Purpose, torch_generator


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 16), nn.ReLU(), nn.Linear(16, 10)
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
    stream = BatchStream(spec.sampling, len(x), plan.batch_size, torch_generator(seed, Purpose.BATCH, round_, plan.client),
                         plan.steps)
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
    round_ = next(r for r in range(50) if run_local(model, spec, [plan], data, w, seed=0, round_=r).records_used[0] == 0)
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
        prox = sum((p - s).pow(2).sum() for p, s in zip(ref.parameters(), start))
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

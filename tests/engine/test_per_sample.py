"""The fast exact per-sample path (`engine/per_sample.py`) against the materialised per-sample gradients.

Reference: `local_training._clipped_sum` with `_per_sample_grad_fn`, i.e. vmap(grad) per sample at its own
client's parameters, each gradient clipped, then summed per client. The fast path computes norms from
activations and output gradients and the sums as segmented GEMMs; it must give the same sums to 1e-5
relative, for every supported registry model, every strategy the cost model can pick, heterogeneous
and empty batches, frozen tensors and binding clips. Full `run_local` rounds must equal the generic
engine's (engine="vmap") to 1e-5.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpfl.engine import per_sample as PS
from dpfl.engine import params as P
from dpfl.engine.local_training import (
    ClientPlan,
    LocalSpec,
    _batch_gradient,
    _batch_grad_fn,
    _clipped_sum,
    _per_sample_grad_fn,
    run_local,
)
from dpfl.engine.losses import per_sample_loss
from dpfl.engine.pooled import PooledData
from dpfl.models import MODELS, build_model, model_info

FAST = sorted(n for n in MODELS if "resnet" not in n)  # the ResNets are not chains of layers
RTOL = 1e-5

# Cost-model settings that force each strategy: per-client GEMM loops or padded batched GEMMs; convolutions
# through im2col GEMMs (col2im for input gradients) or through oneDNN per client.
STRATEGIES = {
    "auto": {},
    "loop-gemm": {"FORCE_SEGMENTED": "loop", "FORCE_CONV": "gemm"},
    "pad-native": {"FORCE_SEGMENTED": "pad", "FORCE_CONV": "native"},
    "pad-gemm": {"FORCE_SEGMENTED": "pad", "FORCE_CONV": "gemm"},
}


pytestmark = pytest.mark.usefixtures("one_thread")


def _strategy(monkeypatch, name):
    for attr, value in STRATEGIES[name].items():
        monkeypatch.setattr(PS, attr, value)


def _model(name, seed=0):
    info = model_info(name)
    return build_model(name, info.small_shape, 10, seed=seed), info


def _cohort(info, counts, seed=1, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    x = scale * torch.randn(len(owner), *info.small_shape, generator=g, dtype=info.dtype)  # the model's dtype
    y = torch.randint(0, 10, (len(owner),), generator=g)
    return x, y, owner


def _clients(model, k, seed=2, spread=0.05):
    """k clients at different parameters (as after some local steps)."""
    g = torch.Generator().manual_seed(seed)
    return {n: v + spread * v.abs().mean() * torch.randn(v.shape, generator=g)
            for n, v in P.broadcast(P.model_params(model), k).items()}


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def assert_sums_equal(out, ref, counts):
    assert out.keys() == ref.keys()
    for n in ref:
        assert out[n].shape == ref[n].shape, n
        assert _rel(out[n], ref[n]) <= RTOL, (n, _rel(out[n], ref[n]))
        for k, c in enumerate(counts):
            if c == 0:  # an empty batch sums to exactly zero
                assert torch.equal(out[n][k], torch.zeros_like(out[n][k])), n


def test_supported_registry_models_compile_and_resnets_fall_back():
    for name in FAST:
        assert PS.compile_model(_model(name)[0]) is not None, name
    for name in ("resnet18_gn", "resnet_small_gn", "mpdp_resnet"):
        assert PS.compile_model(build_model(name, model_info(name).small_shape, 10, seed=0)) is None


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("name", FAST)
def test_clipped_sums_equal_the_exact_per_sample_path(monkeypatch, name, strategy):
    _strategy(monkeypatch, strategy)
    model, info = _model(name)
    fast = PS.compile_model(model)
    counts = [3, 0, 5, 1, 2]  # heterogeneous, with an empty batch
    x, y, owner = _cohort(info, counts, scale=3.0)
    w = _clients(model, len(counts))
    loss = per_sample_loss(info.loss)
    grads_of = _per_sample_grad_fn(model, loss)
    torch.manual_seed(0)  # dropout models: both paths draw the same masks from here
    raw = P.global_norms(grads_of(P.select(w, owner), x, y))
    for clip in (0.5 * float(raw.median()), 1e9):  # the first binds for half the samples, the second never
        torch.manual_seed(0)
        ref = _clipped_sum(grads_of, w, x, y, owner, clip)
        torch.manual_seed(0)
        out = fast.clipped_sum(w, {}, x, y, owner, clip, loss)
        assert_sums_equal(out, ref, counts)
    torch.manual_seed(0)
    norms = fast.per_sample_norms(w, {}, x, y, owner, loss)
    torch.testing.assert_close(norms, raw, rtol=RTOL, atol=0)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("name", FAST)
def test_gradient_sums_equal_the_vmap_batch_path(monkeypatch, name, strategy):
    """The plain-SGD / batch-clipping path: per-client loss-gradient sums, dropout masks in the padded layout."""
    _strategy(monkeypatch, strategy)
    model, info = _model(name)
    fast = PS.compile_model(model)
    loss = per_sample_loss(info.loss)
    counts = [4, 1, 0, 3]
    x, y, owner = _cohort(info, counts)
    w = _clients(model, len(counts))
    idx = [torch.arange(c) for c in counts]
    data = PooledData.from_clients([x[owner == k] if c else x[:1] for k, c in enumerate(counts)],
                                   [y[owner == k] if c else y[:1] for k, c in enumerate(counts)])
    xp, yp, mask = data.gather(torch.arange(len(counts)), idx)
    torch.manual_seed(0)
    ref = _batch_gradient(_batch_grad_fn(model, loss), w, xp, yp, mask)
    xs, ys, own = data.gather_packed(torch.arange(len(counts)), idx)
    torch.manual_seed(0)
    out = fast.grad_sum(w, {}, xs, ys, own, loss)
    assert_sums_equal(out, ref, counts)


@pytest.mark.parametrize("name", ["cnn_pfa", "lenet5", "mlp2"])
def test_frozen_tensors_take_no_part(name):
    """Trainable subsets: norms and sums over the trainable tensors only (frozen ones only in the forward)."""
    model, info = _model(name)
    fast = PS.compile_model(model)
    loss = per_sample_loss(info.loss)
    names = list(P.model_params(model))
    counts = [2, 4, 0]
    x, y, owner = _cohort(info, counts, scale=3.0)
    w = _clients(model, len(counts))
    grads_of = _per_sample_grad_fn(model, loss)
    # the head only (every layer below frozen: no gradient flows there), a middle subset, a weight without its bias
    for trainable in (names[-2:], names[2:4] or names[1:], [names[0]], names[:1] + names[-1:]):
        wt = {n: v for n, v in w.items() if n in trainable}
        frozen = {n: v for n, v in w.items() if n not in trainable}
        torch.manual_seed(0)
        raw = P.global_norms(grads_of(P.select(wt, owner), x, y, frozen=P.select(frozen, owner)))
        clip = 0.5 * float(raw.median())
        torch.manual_seed(0)
        ref = _clipped_sum(grads_of, wt, x, y, owner, clip, frozen)
        torch.manual_seed(0)
        out = fast.clipped_sum(wt, frozen, x, y, owner, clip, loss)
        assert_sums_equal(out, ref, counts)


def test_clip_binds_for_most_samples_and_each_contribution_is_at_most_C():
    """Inputs scaled up so that nearly every per-sample gradient is far above C: each client's sum of
    single-record batches is then exactly C times the unit gradient, and the fast norms are the true ones."""
    model, info = _model("cnn_pfa")
    fast = PS.compile_model(model)
    loss = per_sample_loss(info.loss)
    counts = [1] * 6
    x, y, owner = _cohort(info, counts, scale=20.0)
    w = _clients(model, len(counts))
    grads_of = _per_sample_grad_fn(model, loss)
    raw = grads_of(P.select(w, owner), x, y)
    norms = P.global_norms(raw)
    clip = 1e-2
    assert (norms > 10 * clip).float().mean() >= 0.8
    out = fast.clipped_sum(w, {}, x, y, owner, clip, loss)
    torch.testing.assert_close(P.global_norms(out), torch.minimum(norms, torch.full_like(norms, clip)),
                               rtol=RTOL, atol=0)
    for n in raw:
        torch.testing.assert_close(out[n], raw[n] * (clip / norms).clamp(max=1).view(-1, *[1] * (raw[n].dim() - 1)),
                                   rtol=1e-4, atol=1e-9)


def test_unsorted_owner_is_packed_first():
    model, info = _model("cnn_digits")
    fast = PS.compile_model(model)
    loss = per_sample_loss(info.loss)
    x, y, owner = _cohort(info, [3, 2, 4])
    w = _clients(model, 3)
    perm = torch.randperm(len(owner), generator=torch.Generator().manual_seed(3))
    ref = fast.clipped_sum(w, {}, x, y, owner, 0.1, loss)
    out = fast.clipped_sum(w, {}, x[perm], y[perm], owner[perm], 0.1, loss)
    for n in ref:
        torch.testing.assert_close(out[n], ref[n], rtol=RTOL, atol=1e-9)


# --- what falls back to the generic path -----------------------------------------------------------------


class _Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.s = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * self.s


class _Custom(nn.Sequential):
    def forward(self, x):  # overrides Sequential.forward: could do anything
        return super().forward(x) * 2


def _unsupported():
    shared = nn.Linear(4, 4)
    return {
        "parameter outside Linear/Conv2d": nn.Sequential(nn.Linear(4, 3), _Scale()),
        "shared layer": nn.Sequential(shared, nn.ReLU(), shared),
        "overridden forward": _Custom(nn.Linear(4, 3)),
        "batch norm": nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)),
        "grouped conv": nn.Sequential(nn.Conv2d(2, 2, 1, groups=2), nn.Flatten(), nn.Linear(2, 3)),
        "same padding": nn.Sequential(nn.Conv2d(2, 2, 3, padding="same"), nn.Flatten(), nn.Linear(2, 3)),
        "in-place activation": nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 3)),
        "not sequential": nn.Linear(4, 3),
    }


@pytest.mark.parametrize("what", sorted(_unsupported()))
def test_unsupported_models_are_not_compiled(what):
    assert PS.compile_model(_unsupported()[what]) is None


def test_unsupported_input_shapes_fall_back_and_engine_fast_refuses():
    """Linear on a sequence input (per-sample shape (2, 4)) is outside the fast path: 'auto' runs vmap."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Flatten(), nn.Linear(10, 3))
    g = torch.Generator().manual_seed(0)
    data = PooledData.from_clients([torch.randn(6, 2, 4, generator=g)], [torch.randint(0, 3, (6,), generator=g)])
    spec = LocalSpec(lr=0.1, clip=1.0, sampling="fixed")
    plans = [ClientPlan(0, 3, 2, 0.5)]
    w = P.model_params(model)
    auto = run_local(model, spec, plans, data, w, seed=0, round_=0)
    vm = run_local(model, spec, plans, data, w, seed=0, round_=0, engine="vmap")
    for n in w:
        assert torch.equal(auto.params[n], vm.params[n])
    with pytest.raises(ValueError, match="engine 'fast' cannot run this model"):
        run_local(model, spec, plans, data, w, seed=0, round_=0, engine="fast")
    with pytest.raises(ValueError, match="engine must be one of"):
        run_local(model, spec, plans, data, w, seed=0, round_=0, engine="jit")


# --- whole rounds: the fast engine against the generic one -------------------------------------------------


def _data(info, sizes, seed=1):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, *info.small_shape, generator=g) for n in sizes]
    ys = [torch.randint(0, 10, (n,), generator=g) for n in sizes]
    return PooledData.from_clients(xs, ys)


def _assert_rounds_equal(a, b):
    assert a.records_used == b.records_used and a.empty_batches == b.empty_batches and a.steps == b.steps
    for n in b.params:
        assert _rel(a.params[n], b.params[n]) <= RTOL, (n, _rel(a.params[n], b.params[n]))
    assert a.noise_sq_norm == pytest.approx(b.noise_sq_norm, rel=1e-12)


ROUNDS = {
    "dpsgd poisson, noise, momentum, prox": dict(spec=dict(sampling="poisson", clip=0.5, momentum=0.5, prox_mu=0.1),
                                                 z=1.0),
    "dpsgd fixed, step rates": dict(spec=dict(sampling="fixed", clip=0.3), z=0.7, rates=True),
    "dpsgd shuffle, trainable head": dict(spec=dict(sampling="shuffle", clip=0.5), z=1.2, trainable="head"),
    "dpsgd poisson, trainable body, momentum": dict(spec=dict(sampling="poisson", clip=0.5, momentum=0.9), z=0.5,
                                                     trainable="body"),
    "sgd shuffle, momentum, prox": dict(spec=dict(sampling="shuffle", momentum=0.5, prox_mu=0.2), z=0.0),
    "batch clip, step rates": dict(spec=dict(sampling="fixed", clip=0.2, clip_mode="batch"), z=0.0, rates=True),
}


@pytest.mark.parametrize("case", sorted(ROUNDS))
@pytest.mark.parametrize("name", ["cnn_pfa", "mlp2", "cnn_mnist_splitting", "relu_mlp", "cnn_digits_nobias"])
def test_full_rounds_equal_the_generic_engine(name, case):
    """Heterogeneous batch sizes and step counts (one client with 0 steps, one whose Poisson batches are
    often empty), per-client starts; noise, prox, momentum, per-step rates and trainable subsets."""
    cfg = ROUNDS[case]
    model, info = _model(name)
    names = list(P.model_params(model))
    trainable = {"head": tuple(names[-2:]) if name != "mlp2" else (names[-1],),
                 "body": tuple(names[:-2]) if name != "mlp2" else (names[0],)}.get(cfg.get("trainable"))
    spec = LocalSpec(lr=0.05, loss=info.loss, trainable=trainable, **cfg["spec"])
    data = _data(info, (30, 12, 40, 300, 9))
    z = cfg["z"]
    steps = [4, 3, 0, 5, 2]
    batch = [6, 3, 8, 1, 4]  # client 3: Poisson q = 1/300, mostly empty batches
    plans = []
    for c in range(5):
        rates = tuple(0.05 * (1 + 0.5 * t) for t in range(steps[c])) if cfg.get("rates") else None
        plans.append(ClientPlan(c, batch[c], steps[c], z, rates))
    w = _clients(model, 5, spread=0.02)
    kw = dict(seed=3, round_=2, stacked_start=True)
    fast = run_local(model, spec, plans, data, w, engine="fast", **kw)
    ref = run_local(model, spec, plans, data, w, engine="vmap", **kw)
    _assert_rounds_equal(fast, ref)
    if cfg["spec"]["sampling"] == "poisson":
        assert fast.empty_batches[3] > 0


def test_full_lenet5_round_equals_the_generic_engine():
    model, info = _model("lenet5")
    data = _data(info, (20, 9, 14))
    spec = LocalSpec(lr=0.05, sampling="poisson", clip=0.5, momentum=0.5)
    plans = [ClientPlan(0, 6, 2, 1.0), ClientPlan(1, 3, 1, 0.5), ClientPlan(2, 4, 0, 1.0)]
    w = P.model_params(model)
    _assert_rounds_equal(run_local(model, spec, plans, data, w, seed=1, round_=0, engine="fast"),
                         run_local(model, spec, plans, data, w, seed=1, round_=0, engine="vmap"))


def test_threaded_groups_equal_one_group():
    """With more than one torch thread the fast path runs groups of clients in threads: same result."""
    model, info = _model("cnn_pfa")
    data = _data(info, (30, 12, 40, 25, 9))
    spec = LocalSpec(lr=0.05, sampling="poisson", clip=0.5, momentum=0.5)
    plans = [ClientPlan(c, 4, 3 + c % 2, 1.0) for c in range(5)]
    w = P.model_params(model)
    one = run_local(model, spec, plans, data, w, seed=1, round_=0)
    torch.set_num_threads(2)
    two = run_local(model, spec, plans, data, w, seed=1, round_=0)
    assert torch.get_num_threads() == 2  # restored after the threaded groups
    _assert_rounds_equal(two, one)


# --- convolution geometry: both im2col column orders, padding, stride, dilation, non-square kernels ----------


def _geometry_case():
    """conv2 and conv3 have <= 4 input channels, so their im2col columns are (C, kh, kw) gathered from NCHW memory
    and their input gradients go through the NCHW col2im; conv4 has 6 (channels-last order). Every conv but the
    first needs an input gradient. Per-sample input (2, 11, 9)."""
    torch.manual_seed(0)
    body = nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1),
        nn.Tanh(),
        nn.Conv2d(3, 4, 3, stride=2, padding=2, dilation=2),
        nn.ReLU(),
        nn.Conv2d(4, 6, (2, 3), padding=(1, 0)),
        nn.ELU(),
        nn.Conv2d(6, 5, (3, 2), stride=(1, 2), padding=(2, 1), dilation=(2, 1)),
        nn.AvgPool2d(2),
        nn.Flatten(),
    )
    return body.append(nn.Linear(body(torch.zeros(1, 2, 11, 9)).shape[1], 10))


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_conv_geometries_equal_the_exact_per_sample_path(monkeypatch, strategy):
    _strategy(monkeypatch, strategy)
    model = _geometry_case()
    fast = PS.compile_model(model)
    assert fast is not None
    shape = (2, 11, 9)
    assert fast.check(shape, list(P.model_params(model))) > 0
    loss = per_sample_loss("cross_entropy")
    counts = [3, 0, 4, 1]
    g = torch.Generator().manual_seed(5)
    owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    x = 2.0 * torch.randn(len(owner), *shape, generator=g)
    y = torch.randint(0, 10, (len(owner),), generator=g)
    w = _clients(model, len(counts))
    grads_of = _per_sample_grad_fn(model, loss)
    raw = grads_of(P.select(w, owner), x, y)
    norms = P.global_norms(raw)
    clip = 0.5 * float(norms.median())
    assert_sums_equal(fast.clipped_sum(w, {}, x, y, owner, clip, loss),
                      _clipped_sum(grads_of, w, x, y, owner, clip), counts)
    torch.testing.assert_close(fast.per_sample_norms(w, {}, x, y, owner, loss), norms, rtol=RTOL, atol=0)
    # unclipped sums (plain SGD) against the raw per-sample gradients summed per client
    out = fast.grad_sum(w, {}, x, y, owner, loss)
    for n in raw:
        ref = torch.zeros_like(w[n]).index_add_(0, owner, raw[n])
        assert _rel(out[n], ref) <= RTOL, (n, _rel(out[n], ref))
    # every conv's input gradient matters: training only the first conv still needs them all
    first = ["0.weight", "0.bias"]
    wt = {n: v for n, v in w.items() if n in first}
    fz = {n: v for n, v in w.items() if n not in first}
    ref = _clipped_sum(grads_of, wt, x, y, owner, clip, fz)
    assert_sums_equal(fast.clipped_sum(wt, fz, x, y, owner, clip, loss), ref, counts)


def test_conv_geometry_round_equals_the_generic_engine():
    model = _geometry_case()
    g = torch.Generator().manual_seed(2)
    sizes = (14, 9, 20)
    data = PooledData.from_clients([torch.randn(n, 2, 11, 9, generator=g) for n in sizes],
                                   [torch.randint(0, 10, (n,), generator=g) for n in sizes])
    spec = LocalSpec(lr=0.05, sampling="poisson", clip=0.3, momentum=0.5, prox_mu=0.1)
    plans = [ClientPlan(0, 4, 3, 1.0), ClientPlan(1, 2, 2, 0.5), ClientPlan(2, 5, 3, 0.8)]
    w = P.model_params(model)
    _assert_rounds_equal(run_local(model, spec, plans, data, w, seed=4, round_=1, engine="fast"),
                         run_local(model, spec, plans, data, w, seed=4, round_=1, engine="vmap"))


# --- threads: results do not depend on torch's thread count --------------------------------------------------


@pytest.mark.parametrize("name", ["cnn_pfa", "mlp2"])
def test_two_torch_threads_equal_one_and_the_generic_engine(name):
    """2 torch threads: cnn_pfa runs its clients in thread groups; mlp2 has active dropout (masks from the
    global RNG in a fixed order), so it stays in one group. Both equal the 1-thread run and the vmap engine."""
    from dpfl.engine.local_training import _workers

    model, info = _model(name)
    data = _data(info, (30, 12, 40, 25, 9, 17))
    spec = LocalSpec(lr=0.05, loss=info.loss, sampling="poisson", clip=0.5, momentum=0.5)
    plans = [ClientPlan(c, 4, 2 + c % 3, 1.0) for c in range(6)]
    w = P.model_params(model)
    one = run_local(model, spec, plans, data, w, seed=1, round_=0)
    ref = run_local(model, spec, plans, data, w, seed=1, round_=0, engine="vmap")
    torch.set_num_threads(2)
    assert _workers(PS.compile_model(model), len(plans)) == (1 if info.stochastic else 2)
    two = run_local(model, spec, plans, data, w, seed=1, round_=0)
    assert torch.get_num_threads() == 2
    _assert_rounds_equal(two, one)
    _assert_rounds_equal(two, ref)

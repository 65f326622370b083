"""MP-DP's registered networks (mpdp_mlp, mpdp_cnn, mpdp_resnet): MP-DP's initial weights bit for bit, float64,
perturbable by MP-DP, and bad options refused by name."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from mpdp_runs import mpdp_config, mpdp_run
from torch import nn

from dpfl.algorithms.secure.mpdp.perturb import FactorPlan, UnsupportedModelError, forward
from dpfl.models import build_model, init_parameters, model_info
from dpfl.models.mpdp_networks import TiedResidual, norm_free_resnet
from dpfl.seeding import Purpose, torch_generator

# (settings of the MP-DP comparison, input shape): each network with and without biases, several seeds and sizes
CASES = [
    (dict(model="mlp", seed=0), (64,)),
    (dict(model="mlp", seed=3, hidden=[16, 12], bias=True), (1, 8, 8)),
    (dict(model="mlp", seed=11, hidden=[5]), (2, 3, 4)),
    (dict(model="cnn", seed=0), (1, 8, 8)),
    (dict(model="cnn", seed=7, bias=True), (3, 9, 9)),
    (dict(model="resnet", seed=0, widths=[3, 4], blocks=1, bias=True), (3, 8, 8)),
    (dict(model="resnet", seed=5, widths=[4, 6, 8], blocks=2), (1, 7, 7)),
    (dict(model="resnet", seed=2), (3, 32, 32)),  # ResNet20's shape
]
REGISTERED = {"mlp": "mpdp_mlp", "cnn": "mpdp_cnn", "resnet": "mpdp_resnet"}
DEFAULTS = dict(seed=0, hidden=[64, 32], widths=[16, 32, 64], blocks=3, bias=False)  # the comparison's defaults


def _cfg(kw: dict) -> SimpleNamespace:
    return SimpleNamespace(**{**DEFAULTS, **kw})


def _registered(cfg: SimpleNamespace, shape: tuple[int, ...], seed: int | None) -> nn.Module:
    options = {"mlp": {"hidden": cfg.hidden, "bias": cfg.bias}, "cnn": {"bias": cfg.bias},
               "resnet": {"widths": cfg.widths, "blocks": cfg.blocks, "bias": cfg.bias}}[cfg.model]
    return build_model(REGISTERED[cfg.model], shape, 10, seed=seed, **options)


def _old_plan(cfg: SimpleNamespace, shape: tuple[int, ...]) -> FactorPlan:
    """The plan the comparison built before its networks were registered (written out here, not taken from dpfl)."""
    if cfg.model == "mlp":
        return FactorPlan((math.prod(shape), *cfg.hidden, 10), bias=cfg.bias)
    c, h, w = shape
    if cfg.model == "resnet":
        return FactorPlan.from_module(norm_free_resnet(c, h, 10, tuple(cfg.widths), cfg.blocks, cfg.bias), shape,
                                      allow_residual=True)
    b = cfg.bias
    return FactorPlan.from_module(nn.Sequential(nn.Conv2d(c, 8, 3, padding=1, bias=b), nn.ReLU(), nn.MaxPool2d(2),
                                                nn.Conv2d(8, 16, 3, padding=1, bias=b), nn.ReLU(), nn.Flatten(),
                                                nn.Linear(16 * (h // 2) * (w // 2), 10, bias=b)), shape)


def _old_initial_weights(plan: FactorPlan, seed: int) -> list[torch.Tensor]:
    """MP-DP's initialisation as the comparison wrote it before its networks were registered (written out here, not
    taken from dpfl): He-normal weights in the plan's order from the seed's INIT stream, zero biases, the last layer's
    weight x 0.1; with tied residual blocks Fixup: each block's last layer zero, its other layers divided by
    sqrt(number of blocks)."""
    g = torch_generator(seed, Purpose.INIT)
    ends = {sk.target for sk in plan.skips}
    inside = {layer for sk in plan.skips for layer in range(sk.source + 1, sk.target)}
    out = []
    for (layer, kind), shape in zip(plan.params(), plan.shapes(), strict=True):
        if kind == "bias":
            out.append(torch.zeros(shape, dtype=torch.float64))
            continue
        w = torch.randn(shape, generator=g, dtype=torch.float64) * math.sqrt(2.0 / math.prod(shape[1:]))
        if layer == plan.layers - 1:
            w = w * 0.1
        elif layer in ends:
            w = torch.zeros_like(w)
        elif layer in inside:
            w = w / math.sqrt(len(plan.skips))
        out.append(w)
    return out


@pytest.mark.parametrize(("kw", "shape"), CASES)
def test_registered_weights_are_mpdp_initial_weights_bit_for_bit(kw, shape):
    cfg = _cfg(kw)
    model = _registered(cfg, shape, cfg.seed)
    params = list(model.parameters())
    assert all(p.dtype == torch.float64 for p in params)
    # the old plan, and the plan MP-DP reads off the network (a run's `algorithm.local.network`)
    for plan in (_old_plan(cfg, shape), FactorPlan.from_module(model, shape, allow_residual=cfg.model == "resnet")):
        expected = _old_initial_weights(plan, cfg.seed)
        assert len(params) == len(expected)
        assert all(torch.equal(p, e) for p, e in zip(params, expected, strict=True))


# the comparison's settings on its digits (1 x 8 x 8): a run of each network
RUNS = [dict(model="mlp", seed=3, hidden=[16, 12], bias=True), dict(model="cnn", seed=1),
        dict(model="resnet", seed=4, widths=[3, 4], blocks=1)]


@pytest.mark.parametrize("kw", RUNS, ids=lambda kw: kw["model"])
def test_an_mpdp_run_starts_from_the_registered_network_at_its_seed(kw):
    """The MP-DP config's run (converted from the comparison's settings) perturbs the registered network, built at the
    run's seed: it starts from MP-DP's initial weights, and its plan is the old plan."""
    cfg = _cfg(kw)
    run = mpdp_run(mpdp_config("mpdp", clients=3, **kw))
    shape = tuple(run.data.input_shape)
    assert shape == (1, 8, 8)
    params = list(run.model.parameters())
    assert all(torch.equal(p, q) for p, q in zip(params, _registered(cfg, shape, cfg.seed).parameters(), strict=True))
    plan = _old_plan(cfg, shape)
    assert run.algorithm.local.network.layer_specs == plan.layer_specs
    assert all(torch.equal(p, e) for p, e in zip(params, _old_initial_weights(plan, cfg.seed), strict=True))


@pytest.mark.parametrize(("kw", "shape"), CASES)
def test_mpdp_accepts_every_registered_network_and_its_plan_computes_it(kw, shape):
    cfg = _cfg(kw)
    model = _registered(cfg, shape, cfg.seed)
    residual = cfg.model == "resnet"
    plan = FactorPlan.from_module(model, shape, allow_residual=residual)
    assert plan.layer_specs == _old_plan(cfg, shape).layer_specs
    assert bool(plan.skips) == residual
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    weights = [p.detach() for p in model.parameters()]
    if residual:  # Fixup starts the blocks at zero: move off it so the shortcuts are not the whole network
        weights = [w + 0.1 * torch.randn(w.shape, generator=torch.Generator().manual_seed(1), dtype=w.dtype)
                   for w in weights]
        with torch.no_grad():
            for p, w in zip(model.parameters(), weights, strict=True):
                p.copy_(w)
    with torch.no_grad():
        torch.testing.assert_close(forward(weights, None, x, plan)[0], model(x), rtol=0, atol=1e-12)
    if residual:
        with pytest.raises(UnsupportedModelError, match="allow_residual"):
            FactorPlan.from_module(model, shape)


def test_fixup_zeroes_each_block_end_and_scales_the_rest():
    model = build_model("mpdp_resnet", (3, 8, 8), 10, seed=4, widths=[4, 6], blocks=2, bias=True)
    blocks = [m for m in model.modules() if isinstance(m, TiedResidual)]
    assert len(blocks) == 4
    for block in blocks:
        first, _, last = block.body
        assert not last.weight.any() and not last.bias.any()
        assert first.weight.any() and not first.bias.any()
    # the draws: He-normal in parameter order, the block's first layer divided by sqrt(4), the head times 0.1
    g = torch_generator(4, Purpose.INIT)
    draws = {name: torch.randn(p.shape, generator=g, dtype=torch.float64) * math.sqrt(2 / math.prod(p.shape[1:]))
             for name, p in model.named_parameters() if name.endswith("weight")}
    assert torch.equal(model.block2_1.body[0].weight, draws["block2_1.body.0.weight"] / 2)
    assert torch.equal(model.fc.weight, draws["fc.weight"] * 0.1)
    assert torch.equal(model.down2.weight, draws["down2.weight"])


def test_info_and_unseeded_builds():
    for name in REGISTERED.values():
        info = model_info(name)
        assert info.dtype == torch.float64 and info.loss == "mse_onehot"
        assert info.default_init == "mpdp" and info.inits == ("default", "mpdp")
        assert info.spec.startswith("bidirectional.md §11")
        torch.manual_seed(9)
        a = build_model(name, info.small_shape, 10)
        torch.manual_seed(9)
        b = build_model(name, info.small_shape, 10, init="mpdp")
        c = build_model(name, info.small_shape, 10)
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
        assert not torch.equal(next(b.parameters()), next(c.parameters()))
        torch.manual_seed(9)  # seed None draws from the global RNG, as init_mpdp with no generator
        fresh = init_parameters(build_model(name, info.small_shape, 10, seed=0), "mpdp")
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), fresh.parameters(), strict=True))


@pytest.mark.parametrize(("name", "shape", "options", "pattern"), [
    ("mpdp_mlp", (64,), {"hidden": []}, r"'mpdp_mlp'.*hidden must be a non-empty list of positive integers"),
    ("mpdp_mlp", (64,), {"hidden": 32}, r"'mpdp_mlp'.*hidden must be a non-empty list"),
    ("mpdp_mlp", (64,), {"hidden": [64, 0]}, r"'mpdp_mlp'.*each of hidden must be a positive integer, got 0"),
    ("mpdp_mlp", (64,), {"bias": "false"}, r"'mpdp_mlp'.*bias must be true or false"),
    ("mpdp_mlp", (64,), {"init": "torch"}, r"'mpdp_mlp'.*unknown init 'torch'.*\['default', 'mpdp'\]"),
    ("mpdp_mlp", (64,), {"widths": [4]}, r"'mpdp_mlp'.*unknown option.*widths"),
    ("mpdp_cnn", (64,), {}, r"'mpdp_cnn' cannot take input shape \(64,\).*\(C, H, W\)"),
    ("mpdp_cnn", (1, 8, 8), {"hidden": [4]}, r"'mpdp_cnn'.*unknown option.*hidden"),
    ("mpdp_resnet", (3, 8, 8), {"widths": []}, r"'mpdp_resnet'.*widths must be a non-empty list"),
    ("mpdp_resnet", (3, 8, 8), {"blocks": 0}, r"'mpdp_resnet'.*blocks must be a positive integer"),
    ("mpdp_resnet", (3, 8, 8), {"init": "keras"}, r"'mpdp_resnet'.*unknown init 'keras'"),
    ("mpdp_resnet", (3, 8, 6), {}, r"'mpdp_resnet' cannot take input shape \(3, 8, 6\): needs square images"),
])
def test_bad_options_and_shapes_are_refused(name, shape, options, pattern):
    with pytest.raises(ValueError, match=pattern):
        build_model(name, shape, 10, **options)

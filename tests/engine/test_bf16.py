"""LocalSpec.precision "bfloat16": the gradients' GEMMs in bfloat16, everything that bounds privacy in float32.

- the default is "float32" and runs no bfloat16 cast at all (so the engine's other tests pin it bit for bit);
- bfloat16 sums and rounds agree with float32 to bf16's rounding: an 8-bit significand rounds each operand and each
  GEMM result to 2^-8 = 3.9e-3 relative at most (about a third of that typically), a product of two rounded operands
  and its rounded result to ~3 x 2^-8 = 1.2e-2 at most; per-sample gradient norms differ by that much: TOL = 2e-2 on
  the median record (measured: below 2.5e-3). Rounding also flips discrete choices now and then: a ReLU input near 0
  changes sign, a max-pool window's two nearly equal inputs swap, and that unit's share of the gradient moves (5% of a
  record's norm in cnn_mnist_splitting's 20-unit layer with Dropout2d). So a single record's norm, and a client's
  clipped sum relative to its records' contributions sum_s min(C, ||g_s||), are allowed FLIP = 0.1 (measured: below
  0.08; a wrong clip factor, a lost layer or a lost record is off by O(1));
- clipping is still enforced: the clip factors come from float32 norms of the very per-sample gradients that are
  summed, so a client with one record sums exactly that record's contribution, of norm <= C to float32 rounding;
- the noise is the same float32 draws in both precisions.
"""

from __future__ import annotations

import pytest
import torch

from dpfl.engine import local_training as LT
from dpfl.engine import params as P
from dpfl.engine import per_sample as PS
from dpfl.engine.local_training import ClientPlan, LocalSpec, _clipped_sum, _per_sample_grad_fn, run_local
from dpfl.engine.losses import per_sample_loss
from dpfl.engine.pooled import PooledData
from dpfl.models import build_model, model_info

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = ["cnn_digits", "mlp2", "cnn_mnist_splitting"]  # convs in both im2col layouts, Linear-only, conv + Linear
STRATEGIES = {"auto": {}, "loop-gemm": {"FORCE_SEGMENTED": "loop", "FORCE_CONV": "gemm"},
              "pad-native": {"FORCE_SEGMENTED": "pad", "FORCE_CONV": "native"}}
TOL, FLIP = 2e-2, 0.1  # see the module docstring


def _model(name):
    info = model_info(name)
    return build_model(name, info.small_shape, 10, seed=0), info


def _data(info, sizes, seed=1):
    g = torch.Generator().manual_seed(seed)
    return PooledData.from_clients([torch.randn(n, *info.small_shape, generator=g) for n in sizes],
                                   [torch.randint(0, 10, (n,), generator=g) for n in sizes])


def _cohort(info, counts, seed=1):
    g = torch.Generator().manual_seed(seed)
    owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    return (torch.randn(len(owner), *info.small_shape, generator=g), torch.randint(0, 10, (len(owner),), generator=g),
            owner)


def _round(name, engine, precision=None, z=1.0, **spec):
    model, info = _model(name)
    kw = {} if precision is None else {"precision": precision}
    plans = [ClientPlan(i, 4, 6, z) for i in range(4)]
    w = P.model_params(model)
    res = run_local(model, LocalSpec(lr=0.1, loss=info.loss, **kw, **spec), plans, _data(info, (30, 12, 40, 20)), w,
                    seed=0, round_=0, engine=engine)
    return res, w


def _seeded(fn, *args, **kwargs):
    """`fn` with torch's global RNG seeded: the same dropout masks in both precisions (mlp2, cnn_mnist_splitting)."""
    torch.manual_seed(5)
    return fn(*args, **kwargs)


def _no_bf16(monkeypatch):
    def refuse(*_, **__):
        raise AssertionError("a float32 run cast to bfloat16")
    monkeypatch.setattr(PS, "_low", refuse)
    monkeypatch.setattr(LT.torch, "autocast", refuse)


@pytest.mark.parametrize("engine", ["fast", "vmap"])
@pytest.mark.parametrize("clip", [0.5, None])
def test_default_precision_is_float32_and_casts_nothing(monkeypatch, engine, clip):
    assert LocalSpec(lr=0.1).precision == "float32"
    _no_bf16(monkeypatch)
    z = 1.0 if clip else 0.0
    default, _ = _round("cnn_digits", engine, None, z, clip=clip, sampling="poisson")
    explicit, _ = _round("cnn_digits", engine, "float32", z, clip=clip, sampling="poisson")
    for n in default.params:
        assert torch.equal(default.params[n], explicit.params[n])
    assert default.noise_sq_norm == explicit.noise_sq_norm


def test_invalid_precision_raises():
    with pytest.raises(ValueError, match="precision must be one of"):
        LocalSpec(lr=0.1, precision="float16")


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("name", MODELS)
def test_bf16_clipped_sums_agree_with_float32(monkeypatch, name, strategy):
    """Per-sample norms float32, within TOL (median) and FLIP (each); each client's sum within FLIP x its records'
    clipped norms (binding and non-binding clips), and so the unclipped sums."""
    for attr, value in STRATEGIES[strategy].items():
        monkeypatch.setattr(PS, attr, value)
    model, info = _model(name)
    fast = PS.compile_model(model)
    loss = per_sample_loss(info.loss)
    counts = [3, 0, 5, 1, 2]
    x, y, owner = _cohort(info, counts)
    w = P.broadcast(P.model_params(model), len(counts))
    norms32 = _seeded(fast.per_sample_norms, w, {}, x, y, owner, loss)
    norms16 = _seeded(fast.per_sample_norms, w, {}, x, y, owner, loss, bf16=True)
    assert norms16.dtype == torch.float32
    rel = (norms16 - norms32).abs() / norms32
    assert float(rel.median()) < TOL and float(rel.max()) < FLIP, rel.tolist()
    clip = float(norms32.median())  # about half the records clipped
    scale = PS.segment_sum(norms32.clamp(max=clip), owner, len(counts))  # sum_s min(C, ||g_s||) per client
    ref = _seeded(fast.clipped_sum, w, {}, x, y, owner, clip, loss)
    out = _seeded(fast.clipped_sum, w, {}, x, y, owner, clip, loss, bf16=True)
    diff = P.global_norms({n: out[n] - ref[n] for n in ref})
    assert all(out[n].dtype == torch.float32 for n in out)
    assert bool((diff <= FLIP * scale).all()), (diff / scale.clamp(min=1e-30)).tolist()
    unclipped = _seeded(fast.grad_sum, w, {}, x, y, owner, loss, bf16=True)
    ref = _seeded(fast.grad_sum, w, {}, x, y, owner, loss)
    assert float(P.global_norms({n: unclipped[n] - ref[n] for n in ref}).max()) <= FLIP * float(
        PS.segment_sum(norms32, owner, len(counts)).max())


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("name", MODELS)
def test_bf16_clipping_bounds_every_records_contribution(monkeypatch, name, strategy):
    """One record per client, every clip binding: each client's sum is its record's contribution, norm <= C."""
    for attr, value in STRATEGIES[strategy].items():
        monkeypatch.setattr(PS, attr, value)
    model, info = _model(name)
    loss = per_sample_loss(info.loss)
    x, y, owner = _cohort(info, [1] * 6, seed=3)
    w = P.broadcast(P.model_params(model), 6)
    clip = 1e-3  # far below every gradient norm
    fast = PS.compile_model(model)
    sums = [fast.clipped_sum(w, {}, x, y, owner, clip, loss, bf16=True),
            _clipped_sum(_per_sample_grad_fn(model, loss, bf16=True), w, x, y, owner, clip)]
    for out in sums:
        norms = P.global_norms({n: v.double() for n, v in out.items()})
        assert bool((norms <= clip * (1 + 1e-5)).all()), (norms / clip).tolist()
        assert bool((norms >= clip * (1 - 1e-5)).all())  # binding: every record at C exactly


@pytest.mark.parametrize("engine", ["fast", "vmap"])
@pytest.mark.parametrize("name", MODELS)
def test_bf16_round_agrees_with_float32_and_draws_the_same_noise(name, engine):
    """A DP-SGD round (Poisson, noise): the same noise draws, the updates within TOL (dominated by the noise, which is
    identical: measured below 2e-3); a round without noise: the end parameters within TOL (measured below 1e-3)."""
    r32, w = _round(name, engine, "float32", 1.0, clip=0.5, sampling="poisson")
    r16, _ = _round(name, engine, "bfloat16", 1.0, clip=0.5, sampling="poisson")
    assert r16.noise_sq_norm == r32.noise_sq_norm and r16.records_used == r32.records_used
    upd = {p: P.flatten({n: r.params[n] - w[n] for n in w}, leading=1) for p, r in (("32", r32), ("16", r16))}
    assert float((upd["16"] - upd["32"]).norm() / upd["32"].norm()) < TOL
    assert all(v.dtype == torch.float32 for v in r16.params.values())
    r32, _ = _round(name, engine, "float32", 0.0, clip=0.5, sampling="fixed")
    r16, _ = _round(name, engine, "bfloat16", 0.0, clip=0.5, sampling="fixed")
    end32, end16 = P.flatten(r32.params, leading=1), P.flatten(r16.params, leading=1)
    assert float((end16 - end32).norm() / end32.norm()) < TOL


def test_training_precision_in_a_config_reaches_the_local_spec():
    """`training.precision` sets the built-in local program's LocalSpec.precision; another value is a one-line
    ConfigError naming the key."""
    from pathlib import Path

    from dpfl.experiment.algorithm_bundle import run_facts
    from dpfl.experiment.config import ConfigError, apply_overrides, parse_yaml, validate_config

    demo = parse_yaml((Path(__file__).resolve().parents[2] / "configs" / "demo.yaml").read_text())
    for value, expected in (([], "float32"), (["training.precision=bfloat16"], "bfloat16")):
        cfg = validate_config(apply_overrides(demo, value))
        assert cfg.training.precision == expected
        assert run_facts(cfg).local_program(private=True).spec.precision == expected
    with pytest.raises(ConfigError) as info:
        validate_config(apply_overrides(demo, ["training.precision=float16"]))
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and "training.precision" in msg, msg


def test_an_algorithm_that_builds_its_own_local_training_refuses_bfloat16():
    """Noisy-FedAvg builds its own LocalSpec (clipped SGD on parameter noise): bfloat16 would be silently dropped, so
    the config is refused naming the key; the built-in programs (dp_fedavg_local, PFA) take it."""
    from pathlib import Path

    from dpfl.experiment.build import build_algorithm
    from dpfl.experiment.config import ConfigError, apply_overrides, parse_yaml, validate_config

    demo = parse_yaml((Path(__file__).resolve().parents[2] / "configs" / "demo.yaml").read_text())
    for name in ("dp_fedavg_local", "pfa"):
        cfg = validate_config(apply_overrides(demo, [f"algorithm.name={name}", "training.precision=bfloat16"]))
        assert all(phase.spec.precision == "bfloat16" for phase in build_algorithm(cfg).local.phases)
    noisy = parse_yaml((Path(__file__).resolve().parents[2] / "configs" / "fdp" / "digits_noisy_fedavg.yaml")
                       .read_text())
    build_algorithm(validate_config(noisy))  # float32: fine
    with pytest.raises(ConfigError) as info:
        build_algorithm(validate_config(apply_overrides(noisy, ["training.precision=bfloat16"])))
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and "training.precision" in msg and "noisy_fedavg" in msg, msg

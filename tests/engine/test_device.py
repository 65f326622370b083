"""The device plumbing, checked on the CPU (tests/gpu/ checks CUDA itself where a GPU is present).

`device` in the config (cpu | cuda | cuda:N, refused in one line where the machine lacks it), `--device` on
`dpfl run` and `device=` in `dpfl.run`, a run with `device: cpu` written out equal to the default, checkpoints with
their tensors on the CPU and resumable under another device, and the CUDA code paths of the engine that can run on
the CPU: the fixed-order record sums (padded per-client sums, F.fold's col2im) that keep a CUDA run repeatable, and
batch and noise streams drawn by generators on another device than the records.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import nn

import dpfl
from cli_runner import cli
from dpfl.experiment.config import device_override
from dpfl.engine import params as P
from dpfl.engine import per_sample as PS
from dpfl.engine.local_training import ClientPlan, LocalSpec, run_local
from dpfl.engine.pooled import PooledData
from dpfl.engine.sampling import BatchStream, NoiseStream
from dpfl.experiment.build import build_run
from dpfl.experiment.config import ConfigError, load_config
from dpfl.experiment.federated_run import _state_on
from dpfl.experiment.run_directory import load_checkpoint
from dpfl.experiment.run_records import RunState
from dpfl.seeding import Purpose, torch_generator

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"
SHORT = ["training.rounds=2", "evaluation.every=1"]


def _error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(DEMO, overrides)
    return str(info.value)


# ---- config, CLI, Python API --------------------------------------------------------------------------------


def test_cpu_is_the_default_and_names_that_are_no_device_are_refused():
    assert load_config(DEMO).device == "cpu"
    assert load_config(DEMO, ["device=cpu"]).device == "cpu"
    for name in ("gpu", "CUDA", "cuda:01", "cuda:-1", "cuda:x", "cpu:0", "mps"):
        assert _error([f"device={name}"]) == (f"device: not a device (got {name!r}; allowed: 'cpu', 'cuda' or "
                                              "'cuda:N' (N a GPU index))"), name
    assert _error(["device=7"]).startswith("device: wrong type (got 7; allowed: a string")


def test_cuda_is_refused_where_torch_sees_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("cuda", "cuda:0", "cuda:3"):
        assert _error([f"device={name}"]) == (
            f"device: cuda is not available on this machine (no CUDA GPU, or a CPU-only PyTorch build) (got "
            f"{name!r}; allowed: 'cpu')")


def test_a_gpu_index_is_checked_against_the_gpus_there_are(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name in ("cuda", "cuda:0", "cuda:1"):
        assert load_config(DEMO, [f"device={name}"]).device == name
    assert _error(["device=cuda:2"]) == ("device: this machine has 2 CUDA GPUs (got 'cuda:2'; allowed: 'cpu', 'cuda' "
                                         "or 'cuda:0' to 'cuda:1')")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert _error(["device=cuda:1"]).endswith("(got 'cuda:1'; allowed: 'cpu', 'cuda' or 'cuda:0')")


def test_the_device_option_is_the_device_override(tmp_path):
    assert device_override(None) == []
    assert device_override("cuda:1") == ["device=cuda:1"]
    code, _, err = cli("run", DEMO, "--device", "gpu", "--out", tmp_path / "refused")
    assert code != 0 and "device: not a device (got 'gpu'" in " ".join(err.split())
    assert not (tmp_path / "refused").exists()  # refused before anything is written
    # --device comes after --set, so it wins
    code, _, err = cli("run", DEMO, "--set", "device=gpu", "--device", "cpu", "--set", "training.rounds=1",
                       "--out", tmp_path / "run")
    assert code == 0, err
    assert load_config(tmp_path / "run" / "config.yaml").device == "cpu"


def _same_rows(a: list[dict], b: list[dict]) -> None:
    timing = {"seconds", "cpu_seconds"}
    assert [{k: v for k, v in r.items() if k not in timing} for r in a] == \
        [{k: v for k, v in r.items() if k not in timing} for r in b]


def test_a_run_with_device_cpu_equals_the_default(tmp_path):
    default = dpfl.run(DEMO, overrides=SHORT, out=tmp_path / "default")
    explicit = dpfl.run(DEMO, overrides=SHORT, out=tmp_path / "explicit", device="cpu")
    assert explicit.config.device == "cpu"
    _same_rows(explicit.metrics, default.metrics)
    assert explicit.privacy.to_dict() == default.privacy.to_dict()
    assert all(torch.equal(explicit.params[n], default.params[n]) for n in default.params)
    with pytest.raises(ConfigError, match="device: not a device"):
        dpfl.run(DEMO, overrides=SHORT, out=tmp_path / "bad", device="gpu")


# ---- checkpoints --------------------------------------------------------------------------------------------


class _Pair(NamedTuple):
    a: torch.Tensor
    b: int


@dataclasses.dataclass(frozen=True)
class _Held:
    t: torch.Tensor
    note: str


def test_move_reaches_every_tensor_of_a_nested_state_and_keeps_its_shape():
    state = {"a": torch.ones(2), "nested": [(torch.zeros(1), 3), _Pair(torch.ones(1), 4)],
             "ordered": OrderedDict(x=torch.ones(3)), "held": _Held(torch.ones(2), "kept"), "n": 1.5, "none": None}
    moved = P.move(state, "meta")
    assert moved["a"].device.type == "meta" and moved["nested"][0][0].device.type == "meta"
    assert isinstance(moved["nested"][1], _Pair) and moved["nested"][1].a.device.type == "meta"
    assert moved["nested"][1].b == 4 and moved["nested"][0][1] == 3
    assert type(moved["ordered"]) is OrderedDict and moved["ordered"]["x"].device.type == "meta"
    assert isinstance(moved["held"], _Held) and moved["held"].t.device.type == "meta" and moved["held"].note == "kept"
    assert moved["n"] == 1.5 and moved["none"] is None
    assert state["a"].device.type == "cpu"  # the original is untouched
    same = P.move(state, "cpu")  # tensors already there are the same tensors, not copies
    assert same["a"] is state["a"] and same["held"].t is state["held"].t


def test_a_state_goes_to_a_device_whole():
    state = RunState(2, {"w": torch.ones(3)}, [1], None, [], None, [0, 0], {"u": [torch.ones(2)]},
                     {0: {"v": torch.ones(1)}}, (torch.zeros(1), "x"))
    moved = _state_on(state, torch.device("meta"))
    assert moved.params["w"].device.type == "meta" and moved.aggregator_state["u"][0].device.type == "meta"
    assert moved.client_state[0]["v"].device.type == "meta" and moved.mechanism_state[0].device.type == "meta"
    assert (moved.round, moved.retired, moved.steps_done, moved.mechanism_state[1]) == (2, [1], [0, 0], "x")


def test_a_checkpoint_is_read_onto_the_cpu(tmp_path, monkeypatch):
    """load_checkpoint maps every tensor to the CPU: a checkpoint a CUDA run wrote (its tensors would otherwise be
    restored onto the GPU they were saved from) loads on a machine without one."""
    run = dpfl.run(DEMO, overrides=SHORT, out=tmp_path / "run")
    seen = {}
    real = torch.load

    def load(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    data = load_checkpoint(run.run_dir / "checkpoint.pt")
    assert seen.get("map_location") == "cpu"
    assert all(t.device.type == "cpu" for t in data["params"].values())


def test_a_run_may_resume_under_another_device_setting(monkeypatch):
    """device, like backend, is where a run runs: `--resume` with another device passes the config check
    (config.yaml keeps the one it started with); any other field still counts. The GPUs are pretended: nothing
    is built."""
    from dpfl.experiment.run_directory import _placed_alike

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cpu = load_config(DEMO)
    assert _placed_alike(load_config(DEMO, ["device=cuda:1"])) == _placed_alike(cpu)
    assert _placed_alike(load_config(DEMO, ["device=cuda", "seed=1"])) != _placed_alike(cpu)


# ---- the engine's device-generic paths, on the CPU ----------------------------------------------------------


def _conv_model() -> nn.Sequential:
    torch.manual_seed(0)
    # conv1: 1 input channel, the (C, kh, kw) im2col layout; conv2: 6 channels, the channels-last (kh, kw, C) one;
    # stride and padding so that col2im's windows overlap and fall off the edge
    return nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 5, 3, stride=2, padding=1), nn.Tanh(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(5 * 2 * 2, 4))


def _pooled(counts, shape=(1, 8, 8), classes=4, seed=3) -> PooledData:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, *shape, generator=g) for n in counts]
    ys = [torch.randint(0, classes, (n,), generator=g) for n in counts]
    return PooledData.from_clients(xs, ys)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


@pytest.mark.parametrize("engine", ["fast", "vmap"])
@pytest.mark.parametrize("conv", ["gemm", "native"])
def test_the_fixed_order_sums_a_cuda_run_uses_equal_index_add(monkeypatch, engine, conv):
    """CUDA sums a client's records with a padded sum and col2im with F.fold (index_add_ adds in no fixed order
    there); forced on the CPU, they give index_add_'s round to float rounding (1e-5 relative, as the fast path
    against vmap), for both im2col layouts, a binding clip and Poisson batches with empty ones."""
    monkeypatch.setattr(PS, "FORCE_CONV", conv)
    model = _conv_model()
    data = _pooled([7, 3, 12, 5])
    spec = LocalSpec(lr=0.1, sampling="poisson", clip=0.05)
    plans = [ClientPlan(c, 3, 3, 1.0) for c in range(4)]
    w = P.model_params(model)
    ref = run_local(model, spec, plans, data, w, seed=5, round_=1, engine=engine)
    monkeypatch.setattr(PS, "FORCE_ORDERED_SUMS", True)
    out = run_local(model, spec, plans, data, w, seed=5, round_=1, engine=engine)
    for n in w:
        delta_out, delta_ref = out.params[n] - w[n], ref.params[n] - w[n]
        assert _rel(delta_out, delta_ref) <= 1e-5, (n, _rel(delta_out, delta_ref))
    assert out.records_used == ref.records_used


def test_plain_sgd_sums_in_fixed_order_too(monkeypatch):
    model = _conv_model()
    data = _pooled([6, 9, 4])
    spec = LocalSpec(lr=0.1, sampling="shuffle")
    plans = [ClientPlan(c, 4, 2) for c in range(3)]
    w = P.model_params(model)
    ref = run_local(model, spec, plans, data, w, seed=2, round_=0, engine="fast")
    monkeypatch.setattr(PS, "FORCE_ORDERED_SUMS", True)
    out = run_local(model, spec, plans, data, w, seed=2, round_=0, engine="fast")
    for n in w:
        assert _rel(out.params[n] - w[n], ref.params[n] - w[n]) <= 1e-5, n


def test_segment_sum_takes_owners_in_any_order(monkeypatch):
    monkeypatch.setattr(PS, "FORCE_ORDERED_SUMS", True)
    v = torch.arange(12.0).view(6, 2)
    owner = torch.tensor([2, 0, 2, 3, 0, 2])
    expected = torch.zeros(5, 2).index_add_(0, owner, v)
    assert torch.equal(PS.segment_sum(v, owner, 5), expected)  # client 1 and 4 empty: zeros
    assert torch.equal(PS.segment_sum(v[:0], owner[:0], 3), torch.zeros(3, 2))


def test_generators_are_made_on_the_device_asked_and_streams_draw_there():
    g = torch_generator(7, Purpose.NOISE, 2, 3, "cpu")
    assert g.device.type == "cpu"
    assert torch.equal(torch.randn(5, generator=g), torch.randn(5, generator=torch_generator(7, Purpose.NOISE, 2, 3)))
    stream = NoiseStream(4, 2, torch_generator(1, Purpose.NOISE, device="cpu"))
    assert stream.next().device.type == "cpu"
    batch = BatchStream("fixed", 10, 3, torch_generator(1, Purpose.BATCH), 1).next()
    assert batch.device.type == "cpu" and len(batch) == 3


def test_the_pooled_records_move_with_their_offsets_and_keep_their_sizes_on_the_cpu():
    data = _pooled([2, 3])
    assert data.to("cpu") is data and data.device.type == "cpu"
    meta = data.to("meta")
    assert meta.x.device.type == meta.y.device.type == meta.offsets.device.type == "meta"
    assert meta.sizes.device.type == "cpu" and meta.size(1) == 3


def test_a_run_keeps_its_model_and_records_on_its_device():
    cfg = load_config(DEMO, ["training.rounds=1", "device=cpu"])
    run = build_run(cfg)
    assert run.device == torch.device("cpu") and run.pooled.device == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in run.model.parameters())


# ---- Ray actors and Flower nodes ----------------------------------------------------------------------------


def test_gpus_per_actor_defaults_to_zero_and_reaches_the_backend():
    pytest.importorskip("ray")
    from dpfl.experiment.build import build_backend

    assert load_config(DEMO, ["backend=ray"]).ray.gpus_per_actor == 0
    backend = build_backend(load_config(DEMO, ["backend=ray", "ray.gpus_per_actor=0.5", "ray.actors=4"]))
    assert backend.gpus == 0.5 and backend.describe()["gpus_per_actor"] == 0.5
    assert "gpus_per_actor" not in build_backend(load_config(DEMO, ["backend=ray"])).describe()  # as before
    assert _error(["backend=ray", "ray.gpus_per_actor=-1"]).startswith("ray.gpus_per_actor: out of range")


def test_a_shard_worker_trains_on_its_device_and_answers_on_the_cpu():
    """What an actor runs (without Ray): the records and model it is given, on its device (the CPU here), the
    result on the CPU, equal to training in process."""
    from dpfl.engine.backends.ray import ShardWorker

    model, data = _conv_model(), _pooled([5, 4])
    spec, plans, w = LocalSpec(lr=0.1, sampling="poisson", clip=1.0), [ClientPlan(1, 2, 2, 0.5)], P.model_params(model)
    worker = ShardWorker(model, data, threads=1, gpu=False)
    assert worker.device == torch.device("cpu")
    got = worker.train(spec, plans, w, 3, 0, False, 1 << 26, None)
    ref = run_local(model, spec, plans, data, w, seed=3, round_=0)
    assert all(torch.equal(got.params[n], ref.params[n]) for n in w)


def test_a_flower_node_trains_on_its_own_device():
    pytest.importorskip("flwr")
    from dpfl.experiment.config import config_to_yaml
    from dpfl.flower.client_app import client_side, node_device

    assert node_device({"device": "cuda:1", "partition-id": 0}) == "cuda:1"
    assert node_device({"partition-id": 0}) is None and node_device({"device": ""}) is None
    text = config_to_yaml(load_config(DEMO))
    side = client_side(text, 2, device="cpu")
    assert side.device == torch.device("cpu") and side.x.device.type == "cpu"
    with pytest.raises(ConfigError, match="device: not a device"):
        client_side(text, 2, device="gpu")

"""backend: ray shards the cohort across Ray actors; the run is bit for bit the in-process run (DESIGN.md: all
randomness is keyed by (seed, round, client)), survives one actor death per shard and round, and fails a round
cleanly (resumable) otherwise."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from cli_runner import cli
from dpfl.engine.backends.errors import BackendError
from dpfl.engine.backends.ray import deal
from dpfl.engine.local_training import ClientPlan
from dpfl.experiment.build import build_run
from dpfl.experiment.config.errors import ConfigError
from dpfl.experiment.config.loading import load_config

DEMO = "configs/demo.yaml"
SMALL = ["training.rounds=3", "model.name=cnn_digits", "evaluation.every=1"]


def test_deal_balances_by_records_and_keeps_every_plan_once():
    plans = [ClientPlan(i, b, s) for i, (b, s) in enumerate([(32, 10), (8, 2), (8, 2), (16, 5), (4, 1), (32, 10)])]
    shards = deal(plans, 2)
    assert sorted(i for rows in shards for i in rows) == list(range(6))
    loads = [sum(plans[i].steps * plans[i].batch_size for i in rows) for rows in shards]
    assert loads == [320 + 80, 320 + 16 + 16 + 4]  # the two heaviest clients on different actors
    assert deal(plans[:1], 4) == [[0]]  # no empty shards


def test_ray_section_goes_with_backend_ray_only():
    with pytest.raises(ConfigError, match="ray section configures backend 'ray'"):
        load_config(DEMO, ["ray.actors=3"])
    cfg = load_config(DEMO, ["backend=ray"])
    assert cfg.ray is not None and cfg.ray.actors == 2 and cfg.ray.address is None


def test_missing_ray_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'dpfl\[ray\]'"):
        build_run(load_config(DEMO, ["backend=ray", *SMALL]))


ray = pytest.importorskip("ray")
# The tests below start Ray (a session of actors, some killed): the integration tier; the three above stay in the
# default tier.


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray instance for the module (the backend then uses it and does not shut it down)."""
    with warnings.catch_warnings():  # Ray's notice about GPU environment variables
        warnings.simplefilter("ignore", FutureWarning)
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def _same(a, b) -> None:
    assert a.params.keys() == b.params.keys()
    for n in a.params:
        assert torch.equal(a.params[n], b.params[n]), n
    assert [r.get("test_accuracy") for r in a.history] == [r.get("test_accuracy") for r in b.history]
    assert a.spent() == b.spent()


@pytest.mark.integration
@pytest.mark.parametrize("path, sets", [
    (DEMO, SMALL),  # sample-level: DP-SGD, per-client budgets
    ("configs/digits_udp.yaml", ["training.rounds=3"]),  # client-level: local SGD, clipped noisy uploads
])
def test_two_actors_give_the_local_run_bit_for_bit(ray_session, path, sets):
    local = build_run(load_config(path, sets)).run()
    run = build_run(load_config(path, ["backend=ray", "ray.actors=2", *sets]))
    assert run.backend.name == "ray"
    _same(local, run.run())
    assert run.backend.actors == []  # stopped with the run


@pytest.mark.integration
def test_an_actor_killed_mid_run_is_replaced_and_its_shard_retried(ray_session):
    local = build_run(load_config(DEMO, SMALL)).run()
    run = build_run(load_config(DEMO, ["backend=ray", *SMALL]))
    backend = run.backend

    def kill_first_actor(row):
        if row["round"] == 1:
            ray.kill(backend.actors[0])

    _same(local, run.run(kill_first_actor))
    assert backend.retries == 1


@pytest.mark.integration
def test_an_actor_lost_twice_fails_the_round(ray_session):
    run = build_run(load_config(DEMO, ["backend=ray", *SMALL]))
    backend = run.backend
    spawn = backend._spawn

    def dead_on_arrival():
        actor = spawn()
        ray.kill(actor)
        return actor

    def kill_and_break_spawning(row):
        if row["round"] == 1:
            backend._spawn = dead_on_arrival
            ray.kill(backend.actors[0])

    with pytest.raises(BackendError, match="round 2: shard 0 failed twice"):
        run.run(kill_and_break_spawning)
    assert backend.actors == []  # closed on failure too


@pytest.mark.integration
def test_a_failed_round_leaves_a_run_that_resumes_to_the_same_result(ray_session, tmp_path, monkeypatch):
    """The CLI says what failed in one line; --resume (here on the local backend) finishes the run as if nothing
    had happened."""
    from dpfl.engine.backends import ray as ray_backend

    config = tmp_path / "demo.yaml"
    config.write_text(open(DEMO).read())
    sets = [f"--set={s}" for s in ["backend=ray", "checkpoint.every=1", *SMALL]]
    calls = {"n": 0}
    train = ray_backend.RayBackend.train

    def fail_in_round_two(self, *args, **kw):
        calls["n"] += 1
        if kw["round_"] == 1:
            raise BackendError("round 2: shard 0 failed twice (its actor died: ActorDiedError); "
                               "the round was not applied")
        return train(self, *args, **kw)

    monkeypatch.setattr(ray_backend.RayBackend, "train", fail_in_round_two)
    code, _, err = cli("run", config, "--out", tmp_path / "run", *sets)
    assert code != 0 and "shard 0 failed twice" in err and "--resume" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    monkeypatch.setattr(ray_backend.RayBackend, "train", train)
    local_sets = [f"--set={s}" for s in ["checkpoint.every=1", *SMALL]]
    code, _, err = cli("run", config, "--out", tmp_path / "run", "--resume", *local_sets)
    assert code == 0, err
    code, _, err = cli("run", config, "--out", tmp_path / "ref", *local_sets)
    assert code == 0, err
    import json

    finished = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    reference = [json.loads(line) for line in (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()]
    assert [r["test_accuracy"] for r in finished] == [r["test_accuracy"] for r in reference]
    assert [r["epsilon"] for r in finished] == [r["epsilon"] for r in reference]


@pytest.mark.integration
def test_a_model_with_dropout_is_refused(ray_session):
    from torch import nn

    from dpfl.engine.backends.ray import RayBackend
    from dpfl.engine.local_training import LocalSpec
    from dpfl.engine.pooled import PooledData

    model = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(4, 2))
    data = PooledData.from_clients([torch.zeros(3, 4)], [torch.zeros(3, dtype=torch.int64)])
    with pytest.raises(BackendError, match="dropout"):
        RayBackend(actors=1).train(model, LocalSpec(lr=0.1), [ClientPlan(0, 2, 1)], data,
                                   dict(model.named_parameters()), seed=0, round_=0, stacked_start=False,
                                   max_elements=1 << 20, anchor=None)

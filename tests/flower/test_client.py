"""The ClientApp's computation equals the simulation's clients; unsupported algorithms are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

import torch  # noqa: E402

from cli_runner import cli  # noqa: E402
from dpfl.engine import params as P  # noqa: E402
from dpfl.experiment.build import build_run  # noqa: E402
from dpfl.experiment.config import config_to_yaml, load_config  # noqa: E402
from dpfl.flower.client_app import client_side, client_upload  # noqa: E402
from dpfl.flower.protocol import TrainPlan  # noqa: E402
from dpfl.flower.strategy import DpflStrategy  # noqa: E402

from .helpers import CONFIG, ROOT  # noqa: E402

UDP = ["data.clients=3", "training.rounds=3"]  # configs/digits_udp.yaml: update clipping + noise, calibrated noise


def _plan(run, cid: int, r: int, yaml_text: str, seed: int) -> TrainPlan:
    upload_noise = getattr(run.algorithm.upload, "noise_multiplier", None)
    return TrainPlan(r, cid, int(run.n_records[cid]), int(run.batch_sizes[cid]), float(run.noise[cid]),
                     -1.0 if upload_noise is None else float(upload_noise), seed, run.max_elements, yaml_text)


@pytest.mark.parametrize("config, overrides", [(CONFIG, []), (ROOT / "configs" / "digits_udp.yaml", UDP)],
                         ids=["dpsgd", "udp"])
def test_client_upload_is_the_simulations_row(config: Path, overrides: list[str]):
    """FederatedRun.local_round's row, in round 1 and from a trained model in round 2: the same batches and noise (the
    noise norm), and the same upload to float tolerance. Bitwise at one torch thread (measured); with more, the
    in-process engine runs a cohort in thread groups of one thread each while a lone client uses them all, so the
    reductions round differently (the engine's own "alone vs in a cohort" tolerance, 1e-6)."""
    cfg = load_config(config, overrides)
    run = build_run(cfg)
    yaml_text = config_to_yaml(cfg)
    w = P.model_params(run.model)
    for r in (0, 1):
        local = run.local_round(r, w, np.arange(3), 3.0)
        for cid in range(3):
            upload, steps, noise_sq = client_upload(client_side(yaml_text, cid),
                                                    _plan(run, cid, r, yaml_text, run.seed), w, run.seed)
            for name in w:
                torch.testing.assert_close(upload[name][0], local.uploads[name][cid], atol=1e-6, rtol=1e-5,
                                           msg=f"round {r}, client {cid}, {name}")
                if torch.get_num_threads() == 1:
                    assert torch.equal(upload[name][0], local.uploads[name][cid]), (r, cid, name)
            assert noise_sq == pytest.approx(local.noise_sq_norm[cid], rel=1e-6)
            assert steps == run.algorithm.local.steps_for(int(run.n_records[cid]), int(run.batch_sizes[cid]))
        w = {n: t + local.uploads[n].mean(0) for n, t in w.items()}


def test_secret_seed_draws_other_noise():
    """A node's own seed gives another upload than the run seed (the server cannot know the noise)."""
    cfg = load_config(CONFIG)
    run = build_run(cfg)
    yaml_text = config_to_yaml(cfg)
    w = P.model_params(run.model)
    side = client_side(yaml_text, 0)
    shared, _, _ = client_upload(side, _plan(run, 0, 0, yaml_text, run.seed), w, run.seed)
    secret, _, _ = client_upload(side, _plan(run, 0, 0, yaml_text, -1), w, 123456789)
    assert not torch.equal(shared["fc.weight"], secret["fc.weight"])


def test_wrong_record_count_is_refused():
    cfg = load_config(CONFIG)
    run = build_run(cfg)
    yaml_text = config_to_yaml(cfg)
    plan = _plan(run, 0, 0, yaml_text, run.seed)
    plan = TrainPlan(**{**plan.to_config(), "records": plan.records + 1})
    with pytest.raises(ValueError, match="the server calibrated for"):
        client_upload(client_side(yaml_text, 0), plan, P.model_params(run.model), run.seed)


def test_secure_aggregation_is_refused(tmp_path: Path):
    cfg = load_config(ROOT / "configs" / "secure" / "digits_distributed.yaml", ["training.rounds=2"])
    with pytest.raises(ValueError, match="cannot run on Flower: secure aggregation"):
        DpflStrategy(cfg, tmp_path / "out").build()


def test_guide_prints_each_side(tmp_path: Path, monkeypatch):
    """One flag for both sides; absolute paths only (any directory); the last command is the check."""
    from dpfl.flower.guide import PROJECT

    monkeypatch.chdir(tmp_path)  # not the repository
    code, out, err = cli("flower", "guide", "--nodes", "2", "--port", "19000")
    assert code == 0, err
    assert "flower-superlink --insecure --port 19000" in out
    assert out.count("flower-supernode --insecure --superlink 127.0.0.1:19000") == 2
    assert "--node-config 'partition-id=1'" in out and "partition-id=2" not in out
    commands = [line for line in out.splitlines() if line and not line.startswith("#")]
    run = next(line for line in commands if line.startswith("flwr run "))
    assert run.startswith(f"flwr run {PROJECT} dpfl-local --stream") and '"nodes=2 out=' in run
    assert f"export FLWR_HOME={tmp_path / 'dpfl-flower' / 'flwr'}" in commands
    assert commands[-1] == 'dpfl flower check "$OUT"'
    assert (PROJECT / "pyproject.toml").is_file() and (PROJECT / "dpfl_config.yaml").is_file()
    assert "run_simulation" not in out


def test_the_shipped_project_is_the_example():
    """The Flower project the guide runs (in the package, so that it works from any directory) is examples/flower."""
    from dpfl.flower.guide import PROJECT

    for name in ("pyproject.toml", "dpfl_config.yaml"):
        assert (PROJECT / name).read_text() == (ROOT / "examples" / "flower" / name).read_text(), name


def test_nodes_sets_the_runs_clients():
    from dpfl.flower.server_app import strategy_from

    assert strategy_from({"config": str(CONFIG)}).cfg.data.clients == 3
    assert strategy_from({"config": str(CONFIG), "nodes": 2}).cfg.data.clients == 2
    with pytest.raises(ValueError, match="`nodes` must be >= 0"):
        strategy_from({"config": str(CONFIG), "nodes": -1})


def test_discovery_says_when_nodes_did_not_answer_in_time(monkeypatch):
    """A node that has not answered the partition-id query (its ClientApp still starting) is named as such, not as a
    missing partition."""
    from dpfl.flower import clients
    from dpfl.flower.clients import FederationError, discover

    monkeypatch.setattr(clients, "Message", lambda *a, **kw: (a, kw))  # Flower's needs a running federation
    class SlowGrid:
        def get_node_ids(self):
            return [11, 12, 13]

        def send_and_receive(self, messages, timeout):
            assert timeout == 7.0 and len(messages) == 3
            return []  # nobody answered within the timeout

    with pytest.raises(FederationError, match=r"0 of 3 SuperNodes answered the partition-id query in 7 s"):
        discover(SlowGrid(), 3, timeout=1.0, reply_timeout=7.0)


def test_start_refuses_a_used_directory_but_not_a_lone_lock_file(tmp_path: Path):
    """The strategy's early check (before any node is asked) calls empty what `execute` does: the lock file alone,
    left by a run that died before writing its config, does not block a new run there."""
    from dpfl.experiment.run_lock import LOCK_FILE
    from dpfl.flower.clients import FederationError

    class NoNodes:
        def get_node_ids(self):
            return []

    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text("")
    strategy = DpflStrategy(load_config(CONFIG, ["training.rounds=1"]), out, node_timeout=0.0)
    with pytest.raises(ValueError, match="already exists and is not empty"):
        strategy.start(NoNodes())
    (out / "metrics.jsonl").unlink()
    (out / LOCK_FILE).write_text("pid 1 on elsewhere\n")
    with pytest.raises(FederationError, match="0 of 3 SuperNodes connected in 0 s"):  # past the check: nodes asked
        strategy.start(NoNodes())

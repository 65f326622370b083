"""Sample-level adaptive clipping in whole runs (config `privacy.adaptive_clipping` with mechanism dpsgd): the clips
move toward the target quantile, the ledger is the fixed-clip run's (Theorem 1: each client is still charged its z),
the clips are client-side state that a stopped or SIGKILLed run resumes with, and a sigma_b that leaves some client
no budget is refused before round 1."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cli_runner import cli
from dpfl.algorithms.client.program import SAMPLE_CLIP
from dpfl.experiment.build import build_run
from dpfl.experiment.config import ConfigError, load_config
from dpfl.experiment.run_directory import execute
from dpfl.experiment.run_records import RunState
from stopped_run import stop_in_round
from untimed import untimed

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"
# digits, 10 clients with budgets {1, 2, 4, 8} calibrated (z from 1.2 to 3.4: count_noise 2 leaves each of them
# budget; the default 32 / 20 = 1.6 would not), 3 local steps of Poisson batches of 32, all clients every round
SETS = ["name=adaptive_sample", "training.rounds=4", "training.local_epochs=null", "training.local_steps=3",
        "evaluation.every=2", "checkpoint.every=1", "privacy.clip=null", "data.max_train_samples=800"]


def _config(initial: float, *more: str):
    return load_config(DEMO, [*SETS, f"privacy.adaptive_clipping={{initial_clip: {initial}, count_noise: 2.0}}", *more])


def _rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_clips_move_toward_the_target_quantile_and_the_ledger_is_the_fixed_clip_runs():
    low = build_run(_config(0.01)).run()
    high = build_run(_config(50.0)).run()
    lows = [row["sample_clip_mean"] for row in low.history]
    highs = [row["sample_clip_mean"] for row in high.history]
    assert lows == sorted(lows) and lows[0] > 0.01  # every clip starts far below the median norm: they all grow
    assert highs == sorted(highs, reverse=True) and highs[0] < 50.0  # ... and far above it: they all shrink
    assert highs[-1] / lows[-1] < 50.0 / 0.01 / 10  # the two runs' clips come ten times closer (and keep coming)
    for row in low.history:
        assert row["sample_clip_min"] <= row["sample_clip_mean"] <= row["sample_clip_max"]
    fixed = build_run(load_config(DEMO, [*SETS[:-2], "data.max_train_samples=800", "privacy.clip=0.01"]))
    fixed_result = fixed.run()
    assert list(fixed.noise) == list(low.noise_multipliers)  # the same calibration
    assert fixed_result.spent() == low.spent()  # and the same ledger: the count's cost is inside z (Theorem 1)
    assert "adaptive per-sample clip" in low.privacy.to_dict()["mechanism"]


def test_a_stopped_run_resumes_with_every_clients_clip(tmp_path):
    execute(_config(0.05), tmp_path / "whole")
    stop_in_round(_config(0.05), tmp_path / "stopped", 3)
    state = torch.load(tmp_path / "stopped" / "checkpoint.pt", weights_only=True)
    assert state["round"] == 2 and state["local_state"][SAMPLE_CLIP].shape == (10,)
    assert not bool((state["local_state"][SAMPLE_CLIP] == torch.tensor(0.05)).all())  # moved, not the init
    execute(_config(0.05), tmp_path / "stopped", resume=True)
    assert untimed(_rows(tmp_path / "stopped")) == untimed(_rows(tmp_path / "whole"))
    done = [torch.load(tmp_path / d / "checkpoint.pt", weights_only=True) for d in ("stopped", "whole")]
    assert torch.equal(done[0]["local_state"][SAMPLE_CLIP], done[1]["local_state"][SAMPLE_CLIP])


def test_a_checkpoint_without_the_clips_is_refused():
    run = build_run(_config(0.05, "training.rounds=2"))
    states: list[RunState] = []
    run.run(on_checkpoint=states.append)
    forgetful = RunState.from_dict({**states[0].to_dict(), "local_state": None})
    with pytest.raises(ValueError, match="no state for the local program"):
        build_run(_config(0.05, "training.rounds=2")).run(state=forgetful)


def test_a_count_noise_that_leaves_a_client_no_budget_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"privacy.adaptive_clipping.count_noise: sigma_b=0.5 leaves client \d+ "
                                          r"\(noise multiplier z=[0-9.]+\) no budget"):
        build_run(_config(0.05, "privacy.adaptive_clipping.count_noise=0.5"))


@pytest.mark.integration  # SIGKILLed subprocess
def test_a_killed_run_resumes_with_its_clips(tmp_path):
    sets = [*SETS, "privacy.adaptive_clipping={initial_clip: 0.05, count_noise: 2.0}"]
    args = ["run", str(DEMO), *[a for s in sets for a in ("--set", s)]]
    execute(_config(0.05), tmp_path / "whole")
    wrapper = ROOT / "tests" / "kill_points.py"
    victim = tmp_path / "victim"
    # the 3 x 10 = 30 local steps of a round: step 70 is inside round 3, after round 2's checkpoint
    killed = subprocess.run([sys.executable, str(wrapper), "train", "70", "--", *args, "--out", str(victim)],
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert torch.load(victim / "checkpoint.pt", weights_only=True)["round"] == 2
    code, _, err = cli(*args, "--out", str(victim), "--resume")
    assert code == 0, err
    assert untimed(_rows(victim)) == untimed(_rows(tmp_path / "whole"))
    done = [torch.load(d / "checkpoint.pt", weights_only=True) for d in (victim, tmp_path / "whole")]
    assert torch.equal(done[0]["local_state"][SAMPLE_CLIP], done[1]["local_state"][SAMPLE_CLIP])

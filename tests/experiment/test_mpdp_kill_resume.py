"""MP-DP's family SIGKILLed mid-run, then resumed with `dpfl run ... --resume`, ends exactly as the uninterrupted run.

What must survive the kill is in the checkpoint, never recomputed from the process's memory: MP-DP draws its per-round
secrets from the run seed, round and attempt (a resumed round draws the same), and its server step's state holds the
last broadcast (a curious client's attacks on the final model read it); MP-CDP's server step's state is its noise
generator's state (a resumed round draws the noise the uninterrupted one drew). The kills are real (`SIGKILL` in a
subprocess, tests/kill_points.py), as in tests/experiment/test_kill_resume.py: while round 3's metrics row is written
(the checkpoint holds round 2), and, for MP-DP, after the last round's checkpoint, while privacy.json is written (the
resumed run trains nothing: the attacks then read the last broadcast from the checkpoint).

Integration tier (real subprocesses, ~1 min): `make test-integration`.
"""

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
from untimed import untimed

from dpfl.seeding import Purpose, torch_generator

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "mpdp" / "ci_digits_mlp.yaml"
WRAPPER = ROOT / "tests" / "kill_points.py"
# 4 rounds of the ci MLP with one small hidden layer, evaluated every round, a checkpoint every round (the default)
SETS = ["training.rounds=4", "model.options.hidden=[16]", "evaluation.every=1"]
SERVER_STATE = {"mpdp": {"secrets", "view"}, "mp_cdp": {"noise"}}

pytestmark = pytest.mark.integration  # real SIGKILLed subprocesses


def _args(algorithm: str, out: Path, *extra: str) -> list[str]:
    return ["run", str(CONFIG), "--out", str(out),
            *[a for s in [*SETS, f"algorithm.name={algorithm}"] for a in ("--set", s)], *extra]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """reference(algorithm): the directory of its uninterrupted run (run once per module, in process)."""
    done: dict[str, Path] = {}

    def get(algorithm: str) -> Path:
        if algorithm not in done:
            out = tmp_path_factory.mktemp("reference") / algorithm
            code, _, err = cli(*_args(algorithm, out))
            assert code == 0, err
            done[algorithm] = out
        return done[algorithm]

    return get


def _metrics(out: Path) -> list[dict[str, Any]]:
    text = (out / "metrics.jsonl").read_text()
    assert text.endswith("\n"), "metrics.jsonl ends with a partial line"
    return [json.loads(line) for line in text.splitlines()]


def _checkpoint(out: Path) -> dict[str, Any]:
    return torch.load(out / "checkpoint.pt", weights_only=True)


def _started_rounds(out: Path) -> list[int]:
    return [json.loads(line)["started_round"] for line in (out / "environment.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algorithm, point, n, round_", [
    ("mpdp", "metrics", 3, 2),  # killed writing round 3's row: the checkpoint holds round 2
    ("mp_cdp", "metrics", 3, 2),
    ("mpdp", "rename:privacy.json", 1, 4),  # killed after the last checkpoint, privacy.json not yet in place
])
def test_killed_then_resumed_ends_as_the_uninterrupted_run(tmp_path, reference, algorithm, point, n, round_):
    ref = reference(algorithm)
    out = tmp_path / "victim"
    proc = subprocess.run([sys.executable, str(WRAPPER), point, str(n), "--", *_args(algorithm, out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
    state = _checkpoint(out)
    assert state["round"] == round_ and not (out / "privacy.json").exists() and not (out / "summary.json").exists()
    server = state["aggregator_state"]
    assert set(server) == SERVER_STATE[algorithm]
    if algorithm == "mpdp":  # the last broadcast (rounds are 0-based inside the loop), never its secrets
        assert server["secrets"] is None and server["view"]["round_id"] == round_ - 1
    else:  # the noise generator after round_ rounds' draws: a resume from its initial state would draw other noise
        assert not torch.equal(server["noise"], torch_generator(0, Purpose.SERVER_NOISE).get_state())

    code, stdout, err = cli(*_args(algorithm, out, "--resume"))
    assert code == 0, err
    assert _started_rounds(out) == [0, round_]  # resumed from the checkpoint, not run again from the start
    got, want = _checkpoint(out)["params"], _checkpoint(ref)["params"]
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert untimed(_metrics(out)) == untimed(_metrics(ref))
    privacy, ref_privacy = (json.loads((d / "privacy.json").read_text()) for d in (out, ref))
    assert privacy["stage"] == ref_privacy["stage"]
    attacks = ("model_hiding", "membership") if algorithm == "mpdp" else ("membership",)
    for block in attacks:  # what a curious client's attacks measured on the model it last received
        assert ref_privacy[block] and privacy[block] == ref_privacy[block], block
    assert untimed(privacy) == untimed(ref_privacy)
    summary, ref_summary = (json.loads((d / "summary.json").read_text()) for d in (out, ref))
    assert untimed(summary) == untimed(ref_summary)

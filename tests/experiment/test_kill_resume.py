"""A run SIGKILLed at a random point, then resumed (perhaps killed again), ends exactly as an uninterrupted run.

The user's view: `dpfl run CONFIG --out DIR` dies (OOM killer, power cut, ^C twice) at an arbitrary
instruction; `dpfl run CONFIG --out DIR --resume` must then produce the directory an uninterrupted run
produces: the same metrics rows (timing aside), the same privacy.json with its per-client ledgers, the
same summary (timing aside), the same final model, report and plots, and no leftovers. The kills are
real (`SIGKILL` in a subprocess, no cleanup runs) and injected from the test side only, through
`tests/kill_points.py`, at points drawn with a seeded `random.Random`:
inside local training, between a checkpoint's temp file and its rename, in the middle of a metrics line,
after privacy.json / before summary.json, after summary.json / before report.md and the plots, and during
the report's own writes.

The whole file is in the integration tier (`make test-integration`: every test starts and SIGKILLs real
subprocesses, ~1 min without the random chains, ~6 min with them); the default tier's kill-and-resume runs in
process (tests/experiment/test_fdp_resume.py and test_federated_run.py's resume test; tests/stopped_run.py).
One chain hits every kind of point in turn on a DP-SGD run where clients retire on budget mid-run, plus one kill
in each stateful-aggregator run (Robust-HDP with its round-1 weights kept, FedCEO with held-out splits, ...); then
random chains over every config and three seeds.
"""

from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import kill_points
from cli_runner import cli
from untimed import untimed
from dpfl.results.environment import changed_keys

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"
WRAPPER = ROOT / "tests" / "kill_points.py"
KILLED, FINISHED = -signal.SIGKILL, 0

pytestmark = pytest.mark.integration  # real SIGKILLed subprocesses: see the module docstring

# Small digits runs (seconds each): a fixed noise multiplier (no calibration), per-client budgets.
_BASE = ["training.rounds=6", "evaluation.every=1", "checkpoint.every=2", "privacy.noise_multiplier=1.5"]
_EVEN = "privacy.budgets=[5,5,5,5,5,8,8,8,8,30]"
_SPLIT = ["training.rounds=5", "evaluation.every=1", "checkpoint.every=1", "privacy={mechanism: none}",
          "training.optimizer.momentum=0.5"]
CONFIGS = {
    # sample-level DP-SGD, everyone every round; client 0 never fits its budget, client 1 retires after
    # round 1 and client 2 after round 3, the others run all 6 rounds; checkpoints every 2 rounds
    "retire": ["name=kill_retire", *_BASE, "privacy.budgets=[2,3,4,6,8,10,12,16,20,30]"],
    # Robust-HDP computing its weights once, in round 1: aggregator state that must survive a resume
    "rhdp_once": ["name=kill_rhdp", *_BASE, "training.rounds=4", "checkpoint.every=1", _EVEN,
                  "algorithm={name: robust_hdp, params: {schedule: once}}"],
    # FedCEO (smoothing every 2 rounds, personal models) with a held-out split per client, 5 of 10 per round
    "fedceo": ["name=kill_fedceo", *_BASE, "training.rounds=4", "data.client_test_fraction=0.2", _EVEN,
               "training.selection={kind: fixed, k: 5}",
               "algorithm={name: fedceo, params: {lam: 0.5, theta: 1.04, interval: 2}}"],
    # PFA+ (subspace state, code uploads) with held-out splits, 6 of 10 per round
    "pfa_plus": ["name=kill_pfa_plus", *_BASE, "training.rounds=4", "checkpoint.every=1",
                 "data.client_test_fraction=0.2", _EVEN, "training.selection={kind: fixed, k: 6}",
                 "algorithm={name: pfa_plus, params: {warmup_rounds: 1}}"],
    # the splitting server (operator_splitting.md) with Anderson memory 2: u, z, xbar and the Anderson window must
    # survive a resume; non-private, with momentum, as the splitting CNN runs
    "split_aa": ["name=kill_split_aa", *_SPLIT, "algorithm={name: fedavg, params: {anderson: {memory: 2}}}"],
    "split_fedsplit": ["name=kill_split_fs", *_SPLIT,
                       "algorithm={name: fedsplit, params: {eta: 1.0, anderson: {memory: 2}}}"],
    # R-DPCFL (ci_digits_rotation's setting): round 1's GMM posteriors and cluster models must survive a resume
    "rdpcfl": ["name=kill_rdpcfl", "training.rounds=4", "evaluation.every=1", "checkpoint.every=1",
               "data={dataset: digits, clients: 11, partition: clustered, clustered: {clusters: 4, shift: rotation, "
               "minority_ratio: 0.2, train_per_client: 300, val_fraction: 0.2}}", "model={name: cnn_digits}",
               "training.batch_size=16", "training.optimizer.lr=0.05", "privacy.budgets=10.0", "privacy.delta=1e-4",
               "algorithm={name: rdpcfl, params: {clusters: 4}}"],
}


def _sets(name: str) -> list[str]:
    return [arg for s in CONFIGS[name] for arg in ("--set", s)]


def _run_args(name: str, out: Path, resume: bool) -> list[str]:
    return ["run", str(DEMO), "--out", str(out), *_sets(name), *(["--resume"] if resume else [])]


@dataclass
class Reference:
    """An uninterrupted run and how often it reached each kill point."""

    out: Path
    counts: Counter = field(default_factory=Counter)
    train_by_round: list[int] = field(default_factory=list)  # cumulative `train` points at the end of each round

    @property
    def rounds_done(self) -> int:
        return len(self.train_by_round)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """reference(name): the uninterrupted run of CONFIGS[name] (run once per module, in-process)."""
    done: dict[str, Reference] = {}

    def get(name: str) -> Reference:
        if name not in done:
            ref = Reference(tmp_path_factory.mktemp("reference") / name)

            def count(point: str, context: dict[str, Any]) -> None:
                ref.counts[point] += 1
                if point == "metrics":
                    ref.train_by_round.append(ref.counts["train"])

            with pytest.MonkeyPatch.context() as mp:
                kill_points.install(count, mp.setattr)
                code, _, err = cli(*_run_args(name, ref.out, resume=False))
            assert code == 0, err
            done[name] = ref
        return done[name]

    return get


def _killed(name: str, out: Path, point: str, n: int) -> int:
    """Run (or resume, when `out` exists) through the kill wrapper; KILLED or FINISHED."""
    proc = subprocess.run([sys.executable, str(WRAPPER), point, str(n), "--", *_run_args(name, out, out.exists())],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode in (KILLED, FINISHED), (point, n, proc.returncode, proc.stderr)
    return proc.returncode


def _resume(name: str, out: Path) -> None:
    code, _, err = cli(*_run_args(name, out, resume=True))
    assert code == 0, err


def _checkpoint(out: Path) -> dict[str, Any] | None:
    path = out / "checkpoint.pt"
    return torch.load(path, weights_only=True) if path.exists() else None


# ---- what "the same run" means -----------------------------------------------------------------------
def _same(a: Any, b: Any, where: str = "") -> None:
    """Exact equality, tensors included (bit for bit), NaN equal to NaN."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), (where, list(a), list(b) if isinstance(b, dict) else b)
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, (where, a, b)


def _rows(out: Path) -> list[dict[str, Any]]:
    text = (out / "metrics.jsonl").read_text()
    assert text.endswith("\n"), "metrics.jsonl ends with a partial line"
    return [json.loads(line) for line in text.splitlines()]


def _files(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def _executions(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "environment.jsonl").read_text().splitlines()]


def assert_same_run(got: Path, ref: Path) -> None:
    assert _files(got) == _files(ref)  # no temp file left over, every plot there
    # one environment line per execution that trained, from the round it resumed at, all in this environment
    starts = [e["started_round"] for e in _executions(got)]
    assert [e["started_round"] for e in _executions(ref)] == [0] and starts[0] == 0 and starts == sorted(starts)
    assert changed_keys(_executions(got) + _executions(ref)) == []
    _same(untimed(_rows(got)), untimed(_rows(ref)), "metrics")
    _same(json.loads((got / "privacy.json").read_text()), json.loads((ref / "privacy.json").read_text()), "privacy")
    _same(untimed(json.loads((got / "summary.json").read_text())),
          untimed(json.loads((ref / "summary.json").read_text())), "summary")
    _same(untimed(_checkpoint(got)), untimed(_checkpoint(ref)), "checkpoint")  # final model, ledger, agg. state
    report = (got / "report.md").read_text()
    assert "incomplete" not in report and "plots/accuracy.png" in report


# ---- default suite -----------------------------------------------------------------------------------
def test_killed_at_every_kind_of_point_in_turn_then_resumed_equals_the_uninterrupted_run(tmp_path, reference):
    ref = reference("retire")
    rows = _rows(ref.out)
    assert rows[0]["selected"] != rows[-1]["selected"] and ref.rounds_done == 6  # clients retire mid-run
    rng = random.Random(1)
    out = tmp_path / "victim"

    # 1. inside local training, anywhere in the run (rows after the last checkpoint must be cut back)
    assert _killed("retire", out, "train", rng.randint(1, ref.counts["train"])) == KILLED
    assert not (out / "summary.json").exists()
    # 2. while the next checkpoint is written: its temp file is complete, the rename never happens
    before = _checkpoint(out)
    assert _killed("retire", out, "rename:checkpoint.pt", 1) == KILLED
    assert list(out.glob(".checkpoint.pt.*.tmp"))
    _same(_checkpoint(out), before, "the old checkpoint is intact")
    # 3. in the middle of appending a metrics row: the file ends with a truncated line
    done = before["round"] if before is not None else 0
    assert _killed("retire", out, "metrics", rng.randint(1, ref.rounds_done - done)) == KILLED
    assert not (out / "metrics.jsonl").read_bytes().endswith(b"\n")
    # 4. after privacy.json, before summary.json
    assert _killed("retire", out, "summary", 1) == KILLED
    assert (out / "privacy.json").exists() and not (out / "summary.json").exists()
    # 5. after summary.json (training complete), before report.md and the plots
    assert _killed("retire", out, "report", 1) == KILLED
    assert (out / "summary.json").exists() and not (out / "report.md").exists()
    # 6. the report's own write (plots done, report.md's temp file written, not renamed)
    assert _killed("retire", out, "rename:report.md", 1) == KILLED
    assert not (out / "report.md").exists() and list(out.glob(".report.md.*.tmp"))

    _resume("retire", out)
    assert_same_run(out, ref.out)
    assert len(_executions(out)) == 5  # kills 1-4 and the resume killed at 5 trained; 6 and the last did not
    _resume("retire", out)  # resuming a finished run changes nothing but rewriting its report
    assert_same_run(out, ref.out)


@pytest.mark.parametrize("name", ["rhdp_once", "fedceo", "rdpcfl", "split_aa", "split_fedsplit"])
def test_stateful_aggregator_killed_in_training_resumes_exactly(tmp_path, reference, name):
    ref = reference(name)
    every = 1 if "checkpoint.every=1" in CONFIGS[name] else 2
    rng = random.Random(f"stateful-{name}")
    out = tmp_path / "victim"
    # a step after the first checkpoint, so that the resume starts from saved aggregator state
    n = rng.randint(ref.train_by_round[every - 1] + 1, ref.counts["train"])
    assert _killed(name, out, "train", n) == KILLED
    state = _checkpoint(out)
    assert state is not None and state["round"] >= every and state["aggregator_state"] is not None
    if name == "rhdp_once":
        assert state["aggregator_state"]["once"]  # the round-1 weights, reused by every later round
    if name == "rdpcfl":  # the round-1 clustering, which later rounds draw from
        assert state["aggregator_state"]["posteriors"] is not None
    _resume(name, out)
    assert_same_run(out, ref.out)


# ---- the larger matrix ---------------------------------------------------------------------------------
_POINTS = ["train", "train", "rename:checkpoint.pt", "metrics", "summary", "report", "rename:privacy.json",
           "rename:summary.json", "rename:report.md", "rename:accuracy.png"]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", list(CONFIGS))
def test_random_chains_of_kills_then_resume_equal_the_uninterrupted_run(tmp_path, reference, name, seed):
    ref = reference(name)
    rng = random.Random(f"{name}-{seed}")
    out = tmp_path / "victim"
    outcomes = []
    for _ in range(rng.randint(2, 4)):
        point = rng.choice(_POINTS)
        n = rng.randint(1, max(1, ref.counts[point]))
        outcomes.append((point, n, _killed(name, out, point, n)))
    _resume(name, out)
    print("kills:", outcomes)
    assert_same_run(out, ref.out)

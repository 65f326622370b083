"""metrics.jsonl's aggregation diagnostics (spec heterogeneous_dp §5), from real runs: `pfa_noise_passthrough` (the
clients' own DP noise, redrawn from their generators, pushed through the round's PFA projection), PFA's group
labels, and every private weighted mean against the oracle's weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cli_runner import cli
from dpfl.engine.local_training import replay_noise
from dpfl.experiment.build import build_run
from dpfl.experiment.config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "hdp" / "rhdp" / "ci_fmnist.yaml"
ALL_PUBLIC = "algorithm={name: pfa, params: {split: explicit, public_clients: [0, 1, 2, 3, 4, 5]}}"

# Real runs of the ci-scale thesis CNN (two to three per test, ~10-20 s a test): the integration tier; the default tier
# runs the heterogeneous-budget aggregators end to end in tests/experiment/test_federated_run.py and test_build.py.
pytestmark = pytest.mark.integration


def _rounds(out: Path, algorithm: str, *extra: str, rounds: int = 1) -> list[dict]:
    assert cli("run", CONFIG, "--out", out, "--set", algorithm, "--set", f"training.rounds={rounds}", *extra)[0] == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_with_every_client_public_it_is_the_epsilon_weighted_noise_of_the_round(tmp_path):
    rows = _rounds(tmp_path / "pfa", ALL_PUBLIC, rounds=2)
    run = build_run(load_config(tmp_path / "pfa" / "config.yaml"))
    spec, eps = run.algorithm.local.spec, torch.as_tensor(run.eps_reported, dtype=torch.float64)
    p = sum(t.numel() for t in run.model.parameters())
    for r, row in enumerate(rows):
        plans = [run.algorithm.local.plan(i, int(run.n_records[i]), int(run.batch_sizes[i]), float(run.noise[i]), r)
                 for i in row["selected"]]
        sums = replay_noise(plans, p, run.seed, r).to(torch.float64)
        scale = torch.tensor([spec.lr * q.noise_multiplier * spec.clip / q.batch_size for q in plans],
                             dtype=torch.float64)
        aggregate = (eps / eps.sum()) @ (sums * scale[:, None])  # WeiAvg of the noise, cross terms included
        assert row["pfa_noise_passthrough"] == pytest.approx(float(aggregate.pow(2).sum()) / (p * spec.lr ** 2),
                                                             rel=1e-9)
    assert rows[0]["pfa_noise_passthrough"] != rows[1]["pfa_noise_passthrough"]  # each round's own noise


def test_logged_for_pfa_only_and_lower_with_one_public_client(tmp_path):
    everyone = _rounds(tmp_path / "all", ALL_PUBLIC)
    one = _rounds(tmp_path / "one", "algorithm={name: pfa, params: {split: explicit, public_clients: [1]}}")
    # one public client: no centre, the private mean keeps one direction, so nearly only (eps_1 / E) n_1 is left
    assert all(r["pfa_noise_passthrough"] < 0.5 * a["pfa_noise_passthrough"] for r, a in zip(one, everyone,
                                                                                             strict=True))
    for algorithm, extra in (("algorithm={name: weiavg}", ()), ("algorithm={name: pfa_plus}", ()),
                             (ALL_PUBLIC, ("--set", "training.optimizer.momentum=0.5"))):
        rows = _rounds(tmp_path / f"other{len(list(tmp_path.iterdir()))}", algorithm, *extra)
        assert all("pfa_noise_passthrough" not in r for r in rows), algorithm


def test_weights_are_compared_with_the_oracles(tmp_path):
    """The oracle run's own weights are w* (distance 0, ratio 1); WeiAvg's ratio is its analytic noise statistic over
    the oracle's on the same round (same calibration, so the same sigma_i), at least 1; PFA logs its group labels and
    the distance but no ratio (its aggregate is not a weighted sum)."""
    oracle = _rounds(tmp_path / "oracle", "algorithm={name: oracle}")[0]
    weiavg = _rounds(tmp_path / "weiavg", "algorithm={name: weiavg}")[0]
    pfa = _rounds(tmp_path / "pfa", "algorithm={name: pfa, params: {split: explicit, public_clients: [1, 3]}}")[0]
    assert oracle["weights"] == pytest.approx(oracle["oracle_weights"], abs=1e-7)  # float32 weights
    assert oracle["weights_l1_to_oracle"] < 1e-6 and oracle["noise_stat_ratio_to_oracle"] == pytest.approx(1.0)
    assert weiavg["oracle_weights"] == oracle["oracle_weights"] and sum(oracle["oracle_weights"]) == pytest.approx(1.0)
    assert weiavg["noise_stat_ratio_to_oracle"] == pytest.approx(
        weiavg["noise_stat_analytic"] / oracle["noise_stat_analytic"], rel=1e-6)
    assert weiavg["noise_stat_ratio_to_oracle"] > 1.0
    assert weiavg["weights_l1_to_oracle"] == pytest.approx(
        sum(abs(a - b) for a, b in zip(weiavg["weights"], oracle["oracle_weights"], strict=True)), rel=1e-6)
    assert pfa["public"] == [False, True, False, True, False, False]
    assert "weights_l1_to_oracle" in pfa
    assert "noise_stat_ratio_to_oracle" not in pfa and "noise_stat_analytic" not in pfa
    assert "public" not in weiavg

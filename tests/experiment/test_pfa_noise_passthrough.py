"""metrics.jsonl's `pfa_noise_passthrough` (spec heterogeneous_dp §5): the clients' own DP noise, redrawn from their
generators, pushed through the round's PFA projection, from real runs."""

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

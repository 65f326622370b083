"""Runs that could train nothing are refused before anything is written, and what a run's noise means for its
clients is said in one `note:` line where a user would not expect it (the CLI, as a user meets it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cli_runner import cli
from dpfl.privacy.adaptive_clipping import update_noise_multiplier

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
CENTRAL = ("--set", "algorithm.name=dp_fedavg_central", "--set", "privacy.mechanism=central", "--set",
           "privacy.unit=client", "--set", "privacy.observer=aggregate", "--set", "privacy.sampling=null")


def _refused(tmp_path: Path, *args: str) -> str:
    code, _, err = cli("run", DEMO_CONFIG, *args, "--out", tmp_path / "run")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert not (tmp_path / "run").exists()  # refused before the run directory was made
    return lines[0]


@pytest.mark.parametrize("mechanism", [(), CENTRAL], ids=["dpsgd", "central"])
def test_no_noise_with_finite_budgets_is_refused_up_front(tmp_path, mechanism):
    line = _refused(tmp_path, *mechanism, "--set", "privacy.noise_multiplier=0")
    assert "no client can afford even one round" in line and "infinite epsilon" in line


def test_a_selection_rate_that_draws_nobody_is_refused(tmp_path):
    line = _refused(tmp_path, "--set", "training.selection.kind=poisson", "--set", "training.selection.rate=0.001",
                    "--set", "privacy.noise_multiplier=1.0")
    assert "draws on average 0.3 participants in 30 rounds" in line


def test_a_small_noise_that_still_trains_is_not_refused(tmp_path):
    code, _, err = cli("run", DEMO_CONFIG, "--set", "privacy.noise_multiplier=1.0", "--set", "training.rounds=2",
                       "--out", tmp_path / "run")
    assert code == 0, err
    assert "note:" not in err


def test_central_dp_with_per_client_budgets_says_one_noise_serves_the_smallest(tmp_path):
    code, _, err = cli("run", DEMO_CONFIG, *CENTRAL, "--set", "training.rounds=3", "--out", tmp_path / "run")
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert any("calibrated to the smallest budget (epsilon 2)" in n and "up to 8" in n for n in notes), err
    # ten clients per round: the client-level noise is larger than the mean update it hides
    assert any("client-level DP with about 10 clients per round" in n and "will dominate" in n for n in notes), err
    assert "Warning" not in err  # one line each, not Python's warning format


def test_secure_aggregation_without_noise_is_refused_up_front(tmp_path):
    config = DEMO_CONFIG.parent / "secure" / "digits_distributed.yaml"
    code, _, err = cli("run", config, "--set", "privacy.noise_multiplier=0", "--out", tmp_path / "run")
    assert code == 2 and "no client can afford even one round" in err and not (tmp_path / "run").exists()


def test_the_noise_note_under_adaptive_clipping_quotes_the_updates_z_delta(tmp_path):
    """With adaptive clipping the mean update carries z_Delta > z (the count takes its share, Theorem 1): the note
    sizes the noise by z_Delta, the noise the update really gets."""
    code, _, err = cli("run", DEMO_CONFIG, *CENTRAL, "--set", "privacy.clip=null", "--set",
                       "privacy.adaptive_clipping.count_noise=5", "--set", "training.rounds=3",
                       "--out", tmp_path / "run")
    assert code == 0, err
    block = json.loads((tmp_path / "run" / "privacy.json").read_text())["adaptive_clipping"]
    z, z_delta = block["noise_multiplier"], update_noise_multiplier(block["noise_multiplier"], 5.0)
    assert z_delta > z * (1 + 1e-3)  # the two differ visibly at %g
    note = next(line for line in err.splitlines() if "client-level DP with about" in line)
    quoted = re.search(r"\(noise ([0-9.e+-]+), the update's share of ([0-9.e+-]+) x", note)
    assert quoted is not None, note
    assert float(quoted.group(1)) == pytest.approx(z_delta, rel=1e-5)
    assert float(quoted.group(2)) == pytest.approx(z, rel=1e-5)

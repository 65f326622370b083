"""privacy.noise_cohort_size: central DP-FedAvg simulating a larger cohort (pfl-research's noise_cohort_size).

A run with m clients per round and noise_cohort_size M scales the noise on the sum by m / M, so the average carries
the noise a cohort of M would give it, and its ledger is the ledger of the run with M clients per round. Its own
guarantee (noise multiplier z m / M at its own sampling) is what privacy.json reports as the guarantee; the
simulated epsilons are labelled as such.
"""

from __future__ import annotations

import json
from pathlib import Path

import dp_accounting as dpa
import pytest
import torch

from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.algorithms.server.view import ServerView
from dpfl.experiment.config import ConfigError, load_config
from dpfl.privacy.accountant import epsilon
from dpfl.privacy.events import sampled_gaussian_event
from cli_runner import cli

CENTRAL = Path(__file__).resolve().parents[2] / "configs" / "fmnist_central.yaml"
SMALL = ["training.rounds=2", "data.dataset=digits", "data.clients=50", "training.selection={kind: fixed, k: 5}",
         "evaluation.every=2"]


def _args(out: Path, sets: list[str]) -> list[str]:
    return ["run", str(CENTRAL), "--out", str(out), *[a for s in SMALL + sets for a in ("--set", s)]]


def test_the_noise_on_the_sum_is_scaled_by_the_expected_cohort_over_the_simulated_one():
    torch.manual_seed(0)
    params = {"w": torch.zeros(30)}
    uploads = {"w": torch.randn(5, 30)}
    view = ServerView.simple([10] * 5, expected_clients=5.0)
    plain = CentralDPFedAvg(1.0, 2.0).aggregate(params, uploads, view, seed=3, round_=1)["w"]
    simulated = CentralDPFedAvg(1.0, 2.0, noise_cohort=40, simulated_selection=Selection("fixed", k=40))
    sim = simulated.aggregate(params, uploads, view, seed=3, round_=1)["w"]
    quiet = CentralDPFedAvg(1.0, 0.0).aggregate(params, uploads, view, seed=3, round_=1)["w"]  # the clipped mean
    torch.testing.assert_close(sim - quiet, (plain - quiet) * 5 / 40, rtol=1e-5, atol=1e-7)
    assert simulated.accounted_selection(Selection("fixed", k=5)) == Selection("fixed", k=40)


def test_the_ledger_is_the_larger_cohorts_and_the_guarantee_is_this_runs_own(tmp_path):
    assert cli(*_args(tmp_path / "sim", ["privacy.noise_cohort_size=25"]))[0] == 0
    assert cli(*_args(tmp_path / "big", ["training.selection={kind: fixed, k: 25}"]))[0] == 0
    sim = json.loads((tmp_path / "sim" / "privacy.json").read_text())
    big = json.loads((tmp_path / "big" / "privacy.json").read_text())
    # the simulated run's ledger and calibration are those of the run with 25 clients per round
    assert [c["epsilon_spent"] for c in sim["clients"]] == [c["epsilon_spent"] for c in big["clients"]]
    block = sim["noise_cohort"]
    z = block["noise_multiplier_simulated"]
    assert block["noise_cohort_size"] == 25 and block["expected_cohort"] == 5
    assert block["noise_multiplier_own"] == pytest.approx(z * 5 / 25, rel=1e-12)
    # this run's own epsilon, recomputed here: 2 rounds of the Gaussian with multiplier z/5, 5 of 50 drawn
    own = epsilon(dpa.SelfComposedDpEvent(sampled_gaussian_event(z / 5, sampling="fixed", population=50,
                                                                 sample_size=5), 2), 1e-5, "rdp")
    assert block["epsilon"]["1e-05"] == pytest.approx(own, rel=1e-9) and own > 4
    assert all(c["epsilon_guarantee"] == pytest.approx(own, rel=1e-9) for c in sim["clients"])
    assert sim["guarantee"]["epsilon_max"] == pytest.approx(own, rel=1e-9)
    assert sim["meets_budgets"] is False and sim["warning"].startswith("SIMULATION of a cohort of 25")
    assert "noise_cohort" not in big and big["meets_budgets"] is True


@pytest.mark.parametrize("sets, key", [
    (["privacy.noise_cohort_size=5"], "privacy.noise_cohort_size"),  # not above the expected cohort
    (["privacy.noise_cohort_size=51"], "privacy.noise_cohort_size"),  # more than the population
    (["privacy.noise_cohort_size=25", "training.selection={kind: all}"], "privacy.noise_cohort_size"),
    (["privacy.noise_cohort_size=25", "secure_aggregation={}", "training.selection={kind: all}"],
     "privacy.noise_cohort_size"),
])
def test_a_cohort_that_cannot_be_simulated_is_refused_in_one_line(tmp_path, sets, key):
    code, _, err = cli(*_args(tmp_path / "run", sets))
    assert code == 2 and "privacy.noise_cohort_size" in err and "Traceback" not in err, err


def test_noise_cohort_size_is_central_dps_only():
    with pytest.raises(ConfigError, match="privacy.noise_cohort_size: simulates a larger cohort of central DP"):
        load_config(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml", ["privacy.noise_cohort_size=20"])
    with pytest.raises(ConfigError, match="privacy.noise_cohort_size: a simulated cohort does not combine"):
        load_config(CENTRAL, ["privacy.clip=null", "privacy.adaptive_clipping={}", "privacy.noise_cohort_size=40"])

"""`dpfl reproduce rdpcfl --round1-analysis` (spec clustered_dpfl.md §7): round 1 + R-DPCFL's GMM, by b^1.

The key property: a point is exactly round 1 of the run it stands for (same calibration, same updates, same
GMM), so it is checked against a real run of the same config. The rest uses a stand-in `point`.
"""

import csv
import json

import pytest

import dpfl
from cli_runner import cli
from dpfl.api import run
from dpfl.experiment.config import load_config
from dpfl.reproduce import rdpcfl
from dpfl.reproduce.jobs import GridError, Job, config_dir
from dpfl.reproduce.rdpcfl_round1 import BATCHES, COLUMNS, analysis_grid, round1_point, run_analysis
from dpfl.results.run_files import read_metrics


@pytest.mark.parametrize("batch", ["full", "16"])
def test_a_point_is_round_one_of_the_run_it_stands_for(tmp_path, batch):
    cfg = load_config(config_dir("rdpcfl") / "ci_digits_rotation.yaml",
                      ["training.rounds=3", f"algorithm.params.round1_batch={batch}"])
    point = round1_point(Job("digits", f"b{batch}", 0, cfg))
    run(cfg, out=tmp_path / "run")
    first = next(m for m in read_metrics(tmp_path / "run") if "round1_clusters" in m)
    assert point["round1_clusters"] == first["round1_clusters"]
    assert point["mss"] == pytest.approx(first["mss"], rel=1e-9) and point["em_iterations"] == first["em_iterations"]
    assert point["centre_distance"] == pytest.approx(first["centre_distance"], rel=1e-9)
    truth = rdpcfl.planted_clusters(cfg)
    assert point["recovered"] == rdpcfl.same_partition(first["round1_clusters"], truth)
    assert point["round1_batch"] == batch and point["n_clusters"] == len(set(first["round1_clusters"]))


def test_the_full_batch_costs_more_noise_for_the_same_budget():
    """Round 1 at q = 1 spends more of eps_total than a Poisson round, so the whole run is calibrated noisier."""
    noise = {}
    for batch in ("16", "full"):
        cfg = load_config(config_dir("rdpcfl") / "ci_digits_rotation.yaml", [f"algorithm.params.round1_batch={batch}"])
        noise[batch] = round1_point(Job("digits", f"b{batch}", 0, cfg))["noise_multiplier"]
    assert noise["full"] > noise["16"] > 0


def test_the_grid():
    full = analysis_grid("full", settings_pattern="fmnist-rotation-*")
    assert len(full.jobs) == len(rdpcfl.EPSILONS["full"]) * len(BATCHES["full"]) * 4
    by = {(j.setting, j.method, j.seed): j.config for j in full.jobs}
    cfg = by["fmnist-rotation-eps3", "b512", 0]
    assert (cfg.algorithm.name, cfg.algorithm.params["round1_batch"], cfg.privacy.budgets) == ("rdpcfl", 512, 3.0)
    assert by["fmnist-rotation-eps3", "bfull", 1].algorithm.params["round1_batch"] == "full"
    assert cfg.training.rounds == 200 and cfg.data.clustered.train_per_client == 8000  # calibrated for the thesis run
    assert {j.setting for j in analysis_grid("ci", epsilons="3,5").jobs} == {"fmnist-rotation-eps3",
                                                                             "fmnist-rotation-eps5"}
    with pytest.raises(GridError, match="round-1 batches are 'full' or integers"):
        analysis_grid("ci", batches=["0"])
    with pytest.raises(GridError, match="--scale"):
        analysis_grid("reduced")


def _stand_in(calls):
    def point(job):
        calls.append(job.key)
        b = job.method[1:]
        good = b == "full"
        return {"setting": job.setting, "epsilon": job.config.privacy.budgets, "round1_batch": b, "seed": job.seed,
                "n_clusters": 4, "recovered": good, "minority_recovered": good, "ari": 1.0 if good else 0.5,
                "mss": 3.0 if good else 1.0, "mpo": 0.01, "em_iterations": 3 if good else 12, "em_converged": True,
                "centre_distance": 0.9, "noise_multiplier": 1.3, "e_c": 9, "seconds": 1.0,
                "round1_clusters": [0] * 21}
    return point


def test_points_are_saved_reused_and_summarised(tmp_path):
    grid = analysis_grid("ci", seeds=2, batches=["32", "full"])
    calls = []
    csv_path, md_path, rows = run_analysis(grid, tmp_path, point=_stand_in(calls), command="test")
    assert len(calls) == 4 and len(rows) == 4
    table = list(csv.DictReader(csv_path.open()))
    assert list(table[0]) == COLUMNS and {r["round1_batch"] for r in table} == {"32", "full"}
    md = md_path.read_text()
    assert "| full | 2/2 | 2/2 | 1.00 ± 0.00 | 3.00 ± 0.00 | 3.0 (3) |" in md and "| 32 | 0/2 | 0/2 |" in md
    assert (tmp_path / "plots" / "round1_analysis.png").is_file()
    assert "Points computed by: dpfl " in md and "(4 points). Written by: dpfl " in md
    again = []
    run_analysis(grid, tmp_path, point=_stand_in(again))
    assert again == []  # every point was saved
    # a saved point of another config (here: another planned length) is recomputed, not reused
    path = tmp_path / "round1" / "fmnist-rotation-eps5" / "b32" / "seed0.json"
    saved = json.loads(path.read_text())
    assert saved["environment"]["dpfl"] == dpfl.__version__
    saved["config"]["training"]["rounds"] = 7
    path.write_text(json.dumps(saved))
    run_analysis(grid, tmp_path, point=_stand_in(again))
    assert again == [("fmnist-rotation-eps5", "b32", 0)]
    # the tables show the chosen b^1 and seeds, including settings not selected this time
    _, _, rows = run_analysis(analysis_grid("ci", seeds=2, batches=["full"]), tmp_path, point=_stand_in(again))
    assert len(rows) == 2
    _, _, rows = run_analysis(analysis_grid("ci", seeds=2, batches=["32", "full"], epsilons="3,5",
                                            settings_pattern="*eps3"), tmp_path, point=_stand_in(again))
    assert len(rows) == 8 and again[1:] == [("fmnist-rotation-eps3", m, s) for s in (0, 1) for m in ("b32", "bfull")]
    # compute=False (--tables-only): a missing point is reported, not computed; the saved ones are tabulated
    path.unlink()
    said = []
    _, _, rows = run_analysis(grid, tmp_path, point=_stand_in(again), compute=False,
                              on_point=lambda job, what: said.append((job.key, what)))
    assert len(again) == 5 and len(rows) == 3
    assert (("fmnist-rotation-eps5", "b32", 0), "not computed (--tables-only)") in said
    before = (tmp_path / "round1_analysis.csv").read_text()
    with pytest.raises(GridError, match="--tables-only: no saved point"):
        run_analysis(analysis_grid("ci", seeds=2, batches=["64"]), tmp_path, compute=False)
    assert (tmp_path / "round1_analysis.csv").read_text() == before  # the earlier tables stay


def test_cli_usage_errors(tmp_path):
    code, _, err = cli("reproduce", "rdpcfl", "--round1-analysis", "--scale", "ci", "--out", tmp_path, "--methods",
                       "rdpcfl")
    assert code == 2 and "--rounds and --methods do not apply" in err
    code, _, err = cli("reproduce", "rdpcfl", "--scale", "ci", "--out", tmp_path, "--round1-batches", "32")
    assert code == 2 and "--round1-batches applies to --round1-analysis only" in err
    code, _, err = cli("reproduce", "rdpcfl", "--round1-analysis", "--scale", "ci", "--out", tmp_path,
                       "--round1-batches", "32,x")
    assert code == 2 and "round-1 batches are 'full' or integers >= 1, got 'x'" in err
    code, out, err = cli("reproduce", "rdpcfl", "--round1-analysis", "--scale", "ci", "--out", tmp_path, "--dry-run")
    assert code == 0, err
    assert out.splitlines()[0].startswith("R-DPCFL b^1 analysis, scale ci: 8 points")
    assert not any(tmp_path.iterdir())  # nothing ran
    code, _, err = cli("reproduce", "rdpcfl", "--round1-analysis", "--scale", "ci", "--out", tmp_path, "--dry-run",
                       "--tables-only")
    assert code == 2 and "--dry-run and --tables-only: choose one" in err


@pytest.mark.integration  # a real ci point on Fashion-MNIST (~15 s); the first test runs round 1 in the default tier
def test_cli_runs_one_point_end_to_end(tmp_path, fmnist):
    """`dpfl reproduce rdpcfl --round1-analysis` as a user runs it: one real ci point (full batch, eps 5, seed 0),
    then the same command again reuses it."""
    args = ("reproduce", "rdpcfl", "--round1-analysis", "--scale", "ci", "--seeds", "1", "--round1-batches", "full",
            "--out", tmp_path)
    code, out, err = cli(*args)
    assert code == 0, err
    assert "[1/1] fmnist-rotation-eps5 b^1=full seed0: 4 clusters" in out
    row = next(csv.DictReader((tmp_path / "round1_analysis.csv").open()))
    assert (row["round1_batch"], row["epsilon"]) == ("full", "5.0") and float(row["mss"]) > 0
    assert float(row["noise_multiplier"]) > 0 and "b^1 analysis" in (tmp_path / "round1_analysis.md").read_text()
    code, out, _ = cli(*args)
    assert code == 0 and "seed0: saved before" in out
    (tmp_path / "round1_analysis.csv").unlink()
    code, out, err = cli(*args, "--tables-only")  # rewrites the tables from the saved point
    assert code == 0, err
    assert "1 of the selection's 1 points saved before" in out and "seed0:" not in out
    assert next(csv.DictReader((tmp_path / "round1_analysis.csv").open())) == row
    code, out, err = cli(*args[:3], "--scale", "ci", "--seeds", "2", "--only-seeds", "1", "--out", tmp_path,
                         "--dry-run")  # a grid's seeds in pieces: only seed 1's points are to compute
    assert code == 0 and "4 points" in out and out.count(" seed 1") == 4 and " seed 0" not in out, err
    code, _, err = cli(*args[:-1], tmp_path / "empty", "--tables-only")
    assert code == 2 and "--tables-only: no saved point of this selection" in err
    assert not (tmp_path / "empty" / "round1").exists()  # nothing computed

"""`dpfl reproduce fedceo --search` (spec fedceo.md §4): the grids, the two stages, selection on validation only.

The selection test uses a stand-in `execute` that writes a finished run directory whose validation and test
accuracies disagree on purpose: the search must follow the validation numbers.
"""

from __future__ import annotations

import csv
import json
import math

import pytest

from dpfl.experiment.config import config_to_yaml
from dpfl.reproduce import fedceo
from dpfl.reproduce.fedceo_search import INTERVALS, LAMBDA_GRIDS, STAGE1_INTERVAL, THETAS, run_search, search_grid
from dpfl.reproduce.jobs import GridError
from cli_runner import cli


def test_lambda_grids_are_the_spec_grids_plus_the_paper_value():
    assert LAMBDA_GRIDS["1.0"] == [55.0, 60.0, 65.0, 70.0, 75.0, 80.0, 85.0, 90.0, 95.0, 100.0]
    for sigma, (lo, hi, paper) in {"1.5": (0.1, 10.0, 0.5), "2.0": (0.01, 1.0, 0.03)}.items():
        grid = LAMBDA_GRIDS[sigma]
        assert len(grid) == 10 and grid == sorted(grid) and (grid[0], grid[-1]) == (lo, hi) and paper in grid
        logs = [math.log10(v) for v in grid if v != paper]
        steps = [b - a for a, b in zip(logs, logs[1:])]
        assert max(steps) - min(steps) < 0.01  # 9 log-spaced points (3 significant digits)


@pytest.mark.parametrize("scale", ["ci", "reduced", "full"])
def test_stage_one_sweeps_lambda_with_the_paper_theta_and_a_udp_fedavg_reference(scale):
    grid = search_grid(scale, 1)
    assert grid.seeds == [0] and [s.name for s in grid.settings] == [f"search-fmnist-mlp-sg{s}" for s in fedceo.SIGMAS]
    for s in grid.settings:
        sigma = s.meta["sigma"]
        jobs = [j for j in grid.jobs if j.setting == s.name]
        assert jobs[0].method == "udp_fedavg" and jobs[0].config.algorithm.name == "dp_fedavg_local"
        params = [j.config.algorithm.params for j in jobs[1:]]
        assert [p["lam"] for p in params] == LAMBDA_GRIDS[sigma]
        assert {(p["theta"], p["interval"]) for p in params} == {(fedceo.FEDCEO_PARAMS[sigma][1], STAGE1_INTERVAL[scale])}
        assert {j.config.privacy.noise_multiplier for j in jobs} == {float(sigma)}
        assert {j.config.data.client_val_fraction for j in jobs} == {0.1}  # the 80/10/10 split of spec §5
        # every run of a setting shares everything but the server
        shared = {config_to_yaml(j.config.model_copy(update={"name": "", "algorithm": None})) for j in jobs}
        assert len(shared) == 1
    assert all(fedceo.SPEC[scale]["rounds"] % i == 0 for i in INTERVALS[scale])  # the last round smooths


def test_stage_two_is_theta_by_interval_at_the_chosen_lambda():
    grid = search_grid("reduced", 2, best_lam={"1.5": 0.316})
    assert [s.name for s in grid.settings] == ["search-fmnist-mlp-sg1.5"]
    got = [(j.config.algorithm.params["lam"], j.config.algorithm.params["theta"], j.config.algorithm.params["interval"])
           for j in grid.jobs]
    assert got == [(0.316, th, i) for th in THETAS for i in INTERVALS["reduced"]]
    with pytest.raises(GridError, match="no setting"):
        search_grid("reduced", 2, best_lam={})
    both = search_grid("ci", 1, settings_pattern="fmnist-mlp-sg1.0, *sg2.0")  # every alternative gets the prefix
    assert sorted({j.setting for j in both.jobs}) == ["search-fmnist-mlp-sg1.0", "search-fmnist-mlp-sg2.0"]


def _fake_execute(score):
    """A stand-in run: val_accuracy = score(params), test_accuracy = 1 - that (to catch selection on test)."""
    calls = []

    def execute(cfg, path, **kw):
        calls.append(cfg.name)
        p = cfg.algorithm.params if cfg.algorithm.name == "fedceo" else None
        val = score(p)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.yaml").write_text(config_to_yaml(cfg))
        rows = [{"round": 1, "test_accuracy": 1 - val, "val_accuracy": val, "selected": [], "uplink_bytes": 0,
                 "downlink_bytes": 0, "seconds": 0.0}]
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = {"final_accuracy": 1 - val, "best_accuracy": 1 - val, "rounds_done": 1, "stop_reason": "rounds",
                   "final_val_accuracy": val}
        (path / "summary.json").write_text(json.dumps(summary))
        return summary

    return execute, calls


def test_the_search_selects_on_validation_in_two_stages_and_resumes(tmp_path):
    def score(p):  # udp_fedavg 0.5; FedCEO peaks at lam 0.316 in stage 1, then at theta 1.06, I 25
        if p is None:
            return 0.5
        return 0.6 - abs(math.log10(p["lam"] / 0.316)) / 10 + (0.05 if (p["theta"], p["interval"]) == (1.06, 25) else 0)

    execute, calls = _fake_execute(score)
    result = run_search("reduced", tmp_path, settings_pattern="fmnist-mlp-sg1.5", execute=execute, command="test")
    assert len(calls) == 11 + 12 - 1  # stage 2 holds stage 1's (0.316, 1.04, 10)
    assert result.chosen == {"1.5": {"lam": 0.316, "theta": 1.06, "interval": 25, "val_accuracy": pytest.approx(0.65),
                                     "udp_fedavg_val_accuracy": 0.5, "runs": 22, "planned": 22, "complete": True,
                                     "lam_at_grid_edge": None}}
    rows = list(csv.DictReader((tmp_path / "search.csv").open()))
    assert len(rows) == 22 and {r["stage"] for r in rows} == {"1", "2"}
    assert json.loads((tmp_path / "search.json").read_text())["chosen"]["1.5"]["theta"] == 1.06
    md = (tmp_path / "search.md").read_text()
    assert "| 1.5 | 0.316 | 1.06 | 25 | 0.6500 | 0.5000 | 22 of 22 |" in md and "REDUCTION" in md
    again, calls2 = _fake_execute(lambda p: 0.0)
    assert run_search("reduced", tmp_path, settings_pattern="fmnist-mlp-sg1.5", execute=again).chosen == result.chosen
    assert calls2 == []  # every run was finished: nothing re-ran
    assert "grid's largest" not in md and "grid's smallest" not in md


@pytest.mark.parametrize("direction, edge", [(1, "largest"), (-1, "smallest")])
def test_a_lambda_chosen_at_the_grid_edge_is_flagged(tmp_path, direction, edge):
    execute, _ = _fake_execute(lambda p: 0.5 if p is None else 0.5 + direction * math.log10(p["lam"]) / 100)
    result = run_search("reduced", tmp_path, settings_pattern="fmnist-mlp-sg2.0", execute=execute)
    grid = LAMBDA_GRIDS["2.0"]
    assert result.chosen["2.0"]["lam"] == (max(grid) if direction > 0 else min(grid))
    assert result.chosen["2.0"]["lam_at_grid_edge"] == edge
    assert f"the chosen λ is the grid's {edge}" in (tmp_path / "search.md").read_text()


def test_cli_search_refuses_options_that_do_not_apply(tmp_path):
    code, _, err = cli("reproduce", "fedceo", "--search", "--scale", "ci", "--out", tmp_path, "--seeds", "2")
    assert code == 2 and "--search runs its own grid with one seed" in err
    code, _, err = cli("reproduce", "fedceo", "--search", "--scale", "huge", "--out", tmp_path)
    assert code == 2 and "--scale must be one of ci, reduced, full" in err
    assert not any(tmp_path.iterdir())  # nothing ran


def _peak_at(lam):
    """A stand-in score whose FedCEO optimum is at `lam` (theta/I do not matter) and udp_fedavg scores 0.5."""
    return lambda p: 0.5 if p is None else 0.6 - abs(math.log10(p["lam"] / lam)) / 10


def test_searches_of_one_sigma_at_a_time_keep_each_others_choice(tmp_path):
    execute, _ = _fake_execute(_peak_at(0.316))
    run_search("reduced", tmp_path, settings_pattern="fmnist-mlp-sg1.5", execute=execute)
    execute, calls = _fake_execute(_peak_at(0.1))
    result = run_search("reduced", tmp_path, settings_pattern="fmnist-mlp-sg2.0", execute=execute)
    assert len(calls) == 1 + 10 + 12 - 1  # only sigma_g 2.0 ran; 1.5's finished runs were collected
    assert {s: (c["lam"], c["complete"]) for s, c in result.chosen.items()} == {"1.5": (0.316, True),
                                                                              "2.0": (0.1, True)}
    rows = list(csv.DictReader((tmp_path / "search.csv").open()))
    assert sorted({r["sigma"] for r in rows}) == ["1.5", "2.0"] and len(rows) == 22 + 22
    # a σ_g whose stage 2 is not finished is reported, but not as complete
    (tmp_path / "runs/search-fmnist-mlp-sg1.5/fedceo-lam0.316-th1.08-I25/seed0/summary.json").unlink()
    result = run_search("reduced", tmp_path, settings_pattern="fmnist-mlp-sg2.0", execute=execute)
    assert (result.chosen["1.5"]["runs"], result.chosen["1.5"]["complete"]) == (21, False)
    assert "21 of 22 (**incomplete**: not final)" in (tmp_path / "search.md").read_text()


def test_the_comparison_takes_complete_choices_from_a_search_result(tmp_path):
    execute, _ = _fake_execute(lambda p: 0.5 if p is None else
                               0.6 - abs(math.log10(p["lam"] / 1.0)) / 10 + (0.01 if p["theta"] == 1.08 else 0))
    run_search("reduced", tmp_path, settings_pattern="fmnist-mlp-sg2.0", execute=execute)
    path = tmp_path / "search.json"
    assert fedceo.searched_params(path, "reduced")["2.0"][:3] == (1.0, 1.08, 5)
    grid = fedceo.grid("reduced", search_result=path)
    jobs = {(j.setting, j.method): j.config.algorithm.params for j in grid.jobs if j.seed == 0}
    assert (jobs["fmnist-mlp-sg2.0", "fedceo"]["lam"], jobs["fmnist-mlp-sg2.0", "fedceo"]["theta"]) == (1.0, 1.08)
    assert jobs["fmnist-mlp-sg2.0", "fedceo_theta1"]["theta"] == 1.0  # the ablation keeps theta = 1
    assert jobs["fmnist-mlp-sg1.5", "fedceo"]["lam"] == fedceo.SEARCHED["reduced"]["1.5"][0]  # not in the file
    assert any(n.startswith("FedCEO λ/ϑ/I on fashion_mnist, σ_g 2.0: chosen on the validation splits by the search "
                            f"in {path}") for n in grid.selection)
    with pytest.raises(GridError, match="searched at scale 'reduced'; this comparison's search would be 'full'"):
        fedceo.searched_params(path, "full")
    with pytest.raises(GridError, match="'reduced \\(reduced: 10 rounds instead of 50\\)'"):
        fedceo.searched_params(path, "reduced", rounds=10)
    data = json.loads(path.read_text())
    data["chosen"]["2.0"]["complete"] = False
    path.write_text(json.dumps(data))
    with pytest.raises(GridError, match="search of sigma_g 2.0 .* is not complete \\(22 of 22 runs"):
        fedceo.searched_params(path, "reduced")
    del data["chosen"]["2.0"]["complete"]  # a search.json written before completeness was recorded
    path.write_text(json.dumps(data))
    with pytest.raises(GridError, match="not complete"):
        fedceo.searched_params(path, "reduced")
    path.write_text("{not json")
    with pytest.raises(GridError, match="is not a search.json"):
        fedceo.searched_params(path, "reduced")
    with pytest.raises(GridError, match="no file"):
        fedceo.searched_params(tmp_path / "missing.json", "reduced")


def test_cli_comparison_with_a_search_result(tmp_path):
    execute, _ = _fake_execute(_peak_at(0.178))
    run_search("ci", tmp_path / "search", settings_pattern="fmnist-mlp-sg2.0", execute=execute)
    path = tmp_path / "search" / "search.json"
    code, out, err = cli("reproduce", "fedceo", "--scale", "ci", "--out", tmp_path / "cmp", "--dry-run",
                         "--search-result", path)
    assert code == 0, err
    assert f"σ_g 2.0: chosen on the validation splits by the search in {path}" in out
    code, _, err = cli("reproduce", "fedceo", "--scale", "reduced", "--out", tmp_path / "cmp", "--dry-run",
                       "--search-result", path)
    assert code == 2 and "searched at scale 'ci'" in err
    code, _, err = cli("reproduce", "fedceo", "--search", "--scale", "ci", "--out", tmp_path / "cmp",
                       "--search-result", path)
    assert code == 2 and "does not apply to --search" in err
    assert not (tmp_path / "cmp").exists()

"""`dpfl reproduce fedceo --search` (spec fedceo.md §4): the grids, the two stages, selection on validation only.

The selection test uses a stand-in `execute` that writes a finished run directory whose validation and test
accuracies disagree on purpose: the search must follow the validation numbers.
"""

from __future__ import annotations

import csv
import json
import math
from itertools import pairwise

import pytest

from dpfl.experiment.config import config_to_yaml
from dpfl.reproduce import fedceo
from dpfl.reproduce.fedceo_search import (INTERVALS, LAMBDA_GRIDS, STAGE1_INTERVAL, THETAS, UDP_LAMBDA_GRID, run_search,
                                        search_grid)
from dpfl.reproduce.jobs import GridError
from cli_runner import cli


def test_lambda_grids_are_the_spec_grids_plus_the_paper_value():
    assert LAMBDA_GRIDS["1.0"] == [55.0, 60.0, 65.0, 70.0, 75.0, 80.0, 85.0, 90.0, 95.0, 100.0]
    for sigma, (lo, hi, paper) in {"1.5": (0.1, 10.0, 0.5), "2.0": (0.01, 1.0, 0.03)}.items():
        grid = LAMBDA_GRIDS[sigma]
        assert len(grid) == 10 and grid == sorted(grid) and (grid[0], grid[-1]) == (lo, hi) and paper in grid
        logs = [math.log10(v) for v in grid if v != paper]
        steps = [b - a for a, b in pairwise(logs)]
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
        assert ({(p["theta"], p["interval"]) for p in params}
                == {(fedceo.FEDCEO_PARAMS[sigma][1], STAGE1_INTERVAL[scale])})
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
    md = (tmp_path / "search.md").read_text()
    assert f"the chosen λ is the grid's {edge}" in md
    spread = math.log10(max(grid) / min(grid)) / 100  # the stand-in score's range over the grid
    assert f"Stage 1's val acc spans {spread:.4f} over the λ grid." in md


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


def test_a_search_with_set_overrides_serves_only_a_comparison_with_the_same_overrides(tmp_path):
    """λ chosen under other hyperparameters is not the comparison's choice: the label carries --set both ways."""
    lr = ("training.optimizer.lr=0.2",)
    seen = []
    execute, _ = _fake_execute(lambda p: 0.5 if p is None else 0.6 - abs(math.log10(p["lam"] / 1.0)) / 10)

    def spy(cfg, path, **kw):
        seen.append(cfg.training.optimizer.lr)
        return execute(cfg, path, **kw)

    run_search("reduced", tmp_path / "lr", settings_pattern="fmnist-mlp-sg2.0", execute=spy, extra=lr)
    assert seen and set(seen) == {0.2}  # every run of every stage (stage 1 and 2: 22 runs)
    path = tmp_path / "lr" / "search.json"
    assert json.loads(path.read_text())["scale"] == "reduced (reduced: overrides training.optimizer.lr=0.2)"
    assert "overrides training.optimizer.lr=0.2" in (tmp_path / "lr" / "search.md").read_text()
    assert fedceo.searched_params(path, "reduced", extra=lr)["2.0"][0] == 1.0
    jobs = [j for j in fedceo.grid("reduced", search_result=path, extra=lr).jobs if j.setting == "fmnist-mlp-sg2.0"]
    assert {j.config.training.optimizer.lr for j in jobs} == {0.2}
    with pytest.raises(GridError, match="same --scale, --rounds and --set"):
        fedceo.searched_params(path, "reduced")  # the comparison without the override
    run_search("reduced", tmp_path / "plain", settings_pattern="fmnist-mlp-sg2.0", execute=execute)
    with pytest.raises(GridError, match="searched at scale 'reduced'; this comparison's search would be 'reduced "
                                        "\\(reduced: overrides training.optimizer.lr=0.2\\)'"):
        fedceo.grid("reduced", search_result=tmp_path / "plain" / "search.json", extra=lr)


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


def test_udp_search_sweeps_its_own_wider_lambda_grid_against_the_papers_udp_fedavg():
    assert UDP_LAMBDA_GRID[0] == 0.001 and UDP_LAMBDA_GRID[-1] == 10.0 and len(UDP_LAMBDA_GRID) == 9
    grid = search_grid("ci", 1, variant=fedceo.Variant("shards", "udp"))
    assert [s.name for s in grid.settings] == [f"search-fmnist-mlp-shards-udp-sg{s}" for s in fedceo.SIGMAS]
    for s in grid.settings:
        jobs = [j for j in grid.jobs if j.setting == s.name]
        assert jobs[0].method == "udp_fedavg" and jobs[0].config.algorithm.name == "udp_fedavg"
        assert [j.config.algorithm.params["lam"] for j in jobs[1:]] == UDP_LAMBDA_GRID
        assert {(j.config.privacy.mechanism, j.config.data.partition) for j in jobs} == {("udp", "shards")}
    shards = search_grid("ci", 1, variant=fedceo.Variant("shards"))  # dpsgd on shards keeps the spec's grids
    lams = [j.config.algorithm.params["lam"] for j in shards.jobs
            if j.setting.endswith("sg1.5") and j.method != "udp_fedavg"]
    assert lams == LAMBDA_GRIDS["1.5"]


def test_a_variants_search_records_it_and_feeds_only_that_variants_comparison(tmp_path):
    udp = fedceo.Variant(mechanism="udp")
    execute, _ = _fake_execute(_peak_at(0.01))
    result = run_search("ci", tmp_path, settings_pattern="fmnist-mlp-udp-sg2.0", execute=execute, variant=udp)
    assert result.chosen["2.0"]["lam"] == 0.01 and result.chosen["2.0"]["complete"]
    path = tmp_path / "search.json"
    assert json.loads(path.read_text())["variant"] == {"partition": "iid", "mechanism": "udp"}
    assert "client mechanism `udp`" in (tmp_path / "search.md").read_text()
    grid = fedceo.grid("ci", mechanism="udp", search_result=path)
    jobs = {(j.setting, j.method): j.config.algorithm.params for j in grid.jobs}
    assert jobs["fmnist-mlp-udp-sg2.0", "fedceo"]["lam"] == 0.01
    assert jobs["fmnist-mlp-udp-sg1.5", "fedceo"]["lam"] == fedceo.FEDCEO_PARAMS["1.5"][0]  # not searched
    with pytest.raises(GridError, match="searched the variant .*'udp'.*same --partition and --mechanism"):
        fedceo.grid("ci", search_result=path)  # the default comparison must not take udp's lambda
    with pytest.raises(GridError, match="search each variant in its own --out"):
        run_search("ci", tmp_path, settings_pattern="fmnist-mlp-sg2.0", execute=execute)
    assert json.loads(path.read_text())["variant"]["mechanism"] == "udp"  # the udp search is kept
    data = json.loads(path.read_text())
    del data["variant"]  # written before variants existed: the default's
    path.write_text(json.dumps(data))
    assert fedceo.searched_params(path, "ci")["2.0"][0] == 0.01


def test_cli_search_and_comparison_take_the_variant(tmp_path):
    code, out, err = cli("reproduce", "fedceo", "--scale", "ci", "--out", tmp_path, "--dry-run",
                         "--partition", "shards", "--settings", "*sg1.5")
    assert code == 0, err
    assert "fmnist-mlp-shards-sg1.5" in out and "nor for label shards" in out
    code, _, err = cli("reproduce", "fedceo", "--search", "--scale", "ci", "--out", tmp_path, "--mechanism", "laplace")
    assert code == 2 and "--mechanism must be one of dpsgd, udp" in err
    code, _, err = cli("reproduce", "fedceo", "--dlg", "--scale", "ci", "--out", tmp_path, "--partition", "shards")
    assert code == 2 and "takes only --out" in err
    assert not any(tmp_path.iterdir())


def test_a_comparison_of_one_sigma_ignores_another_sigmas_unfinished_search(tmp_path):
    """The chain 'search sigma A, compare A, search sigma B' must not fail on B's partial search (seen at full
    scale: the comparison of 1.5 refused a search.json in which 1.0 had 2 of 22 runs)."""
    execute, _ = _fake_execute(_peak_at(0.316))
    run_search("reduced", tmp_path, settings_pattern="fmnist-mlp-sg1.5", execute=execute)
    path = tmp_path / "search.json"
    data = json.loads(path.read_text())
    data["chosen"]["1.0"] = {**data["chosen"]["1.5"], "lam": 60.0, "complete": False, "runs": 2}
    path.write_text(json.dumps(data))
    grid = fedceo.grid("reduced", search_result=path, settings_pattern="fmnist-mlp-sg1.5")
    assert {j.config.algorithm.params["lam"] for j in grid.jobs if j.method == "fedceo"} == {0.316}
    assert fedceo.searched_params(path, "reduced", sigmas=["1.5"]).keys() == {"1.5"}
    data["chosen"]["2.0"] = {**data["chosen"]["1.5"], "lam": 0.5}  # a complete choice the comparison does not run
    path.write_text(json.dumps(data))
    assert fedceo.searched_params(path, "reduced", sigmas=["1.5"]).keys() == {"1.5", "2.0"}  # kept: its runs match
    with pytest.raises(GridError, match="search of sigma_g 1.0 .* is not complete"):
        fedceo.grid("reduced", search_result=path, settings_pattern="*sg1.0,*sg1.5")
    with pytest.raises(GridError, match="search of sigma_g 1.0 .* is not complete"):
        fedceo.grid("reduced", search_result=path)  # every sigma_g


def test_tune_ablation_searches_the_theta1_lambda_at_the_chosen_interval_and_feeds_the_ablation(tmp_path):
    """Spec §4 Option tune_ablation: FedCEO's choice comes from theta > 1 runs only; a third stage picks the
    theta = 1 ablation's own lambda (here it peaks elsewhere), and the comparison's fedceo_theta1 uses it."""
    def score(p):
        if p is None:
            return 0.5
        if p["theta"] == 1.0:  # the ablation peaks at lam 3.16 and beats every theta > 1 run
            return 0.9 - abs(math.log10(p["lam"] / 3.16)) / 10
        return 0.6 - abs(math.log10(p["lam"] / 0.316)) / 10 + (0.05 if (p["theta"], p["interval"]) == (1.06, 25) else 0)

    execute, calls = _fake_execute(score)
    result = run_search("reduced", tmp_path, settings_pattern="fmnist-mlp-sg1.5", execute=execute, tune_ablation=True)
    c = result.chosen["1.5"]
    assert (c["lam"], c["theta"], c["interval"]) == (0.316, 1.06, 25)  # not a theta = 1 run
    assert (c["ablation_lam"], c["ablation_val_accuracy"]) == (3.16, pytest.approx(0.9))
    assert len(calls) == 22 + 10 and (c["runs"], c["planned"], c["complete"]) == (32, 32, True)
    third = [r for r in result.rows if r["stage"] == 3]
    assert {(r["theta"], r["interval"]) for r in third} == {(1.0, 25)} and len(third) == len(LAMBDA_GRIDS["1.5"])
    assert "the ϑ = 1 ablation's own λ = 3.16 at I = 25" in (tmp_path / "search.md").read_text()
    params = fedceo.searched_params(tmp_path / "search.json", "reduced")["1.5"]
    assert params.ablation_lam == 3.16
    jobs = {j.method: j.config.algorithm.params for j in fedceo.grid(
        "reduced", search_result=tmp_path / "search.json", settings_pattern="*sg1.5").jobs if j.seed == 0}
    assert (jobs["fedceo_theta1"]["lam"], jobs["fedceo_theta1"]["theta"],
            jobs["fedceo_theta1"]["interval"]) == (3.16, 1.0, 25)
    assert (jobs["fedceo"]["lam"], jobs["fedceo"]["theta"]) == (0.316, 1.06)
    # without the option the ablation keeps FedCEO's lambda (the spec's default) and nothing new runs
    again, calls = _fake_execute(score)
    plain = run_search("reduced", tmp_path, settings_pattern="fmnist-mlp-sg1.5", execute=again)
    assert calls == [] and "ablation_lam" not in plain.chosen["1.5"] and plain.chosen["1.5"]["complete"]
    assert fedceo.searched_params(tmp_path / "search.json", "reduced")["1.5"].ablation_lam is None


def test_cli_tune_ablation_belongs_to_the_search(tmp_path):
    code, _, err = cli("reproduce", "fedceo", "--scale", "ci", "--out", tmp_path, "--tune-ablation", "--dry-run")
    assert code == 2 and "--tune-ablation is a stage of --search" in err
    assert not any(tmp_path.iterdir())

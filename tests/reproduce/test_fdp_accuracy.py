"""`dpfl reproduce fdp-accuracy`: the grid against spec fdp_accounting.md §8, the divergence rule, and a tiny real run.

Grid tests only build and validate configs. The end-to-end test runs the ci scale (digits + logistic regression,
2 runs of 3 rounds, a few seconds) through the CLI. Missing datasets: the full grid's MNIST job is skipped, not failed
(only where MNIST is absent, as on the development machine).
"""

from __future__ import annotations

import csv
import math

import pytest

from dpfl.experiment.config import config_to_yaml, load_config
from dpfl.reproduce import fdp_accuracy as fa
from dpfl.reproduce.jobs import GridError
from dpfl.reproduce.runner import FAILED, OK, SKIPPED, Outcome, run_jobs
from cli_runner import cli

SIGMAS = {1.0, 0.1, 0.01, 0.001}


def _mnist_missing() -> bool:
    from dpfl.data import available

    return not any(r["name"] == "mnist" and r.get("source") != "missing" for r in available())


# ---- the grid ---------------------------------------------------------------------------------------------
def test_full_grid_is_exactly_the_spec_combinations():
    grid = fa.grid("full")
    assert grid.paper == "fdp-accuracy" and grid.label == "full" and grid.seeds == [0, 1, 2, 3, 4]
    assert grid.all_jobs == grid.jobs and {j.method for j in grid.jobs} == {"noisy_fedavg"}
    combos = {}
    for j in grid.jobs:
        c = j.config
        key = (c.data.dataset, c.data.clients, c.training.local_steps, c.training.rounds, c.algorithm.params["std"])
        combos.setdefault(key, set()).add(j.seed)
        assert c.training.local_steps * c.training.rounds == 30000
        assert c.algorithm.name == "noisy_fedavg" and c.seed == j.seed
        assert (c.data.partition, c.data.alpha) == ("dirichlet_quota", 0.1)
        assert c.training.selection.kind == "all"  # full participation
        quota, model = {"mnist": (600, "lenet5"), "cifar10": (500, "resnet18_gn")}[c.data.dataset]
        assert (c.data.samples_per_client, c.model.name) == (quota, model)
    expected = {(d, m, k, t, s) for d in ("mnist", "cifar10") for m in (20, 50, 100)
                for k, t in ((50, 600), (100, 300), (200, 150)) for s in SIGMAS}
    assert set(combos) == expected and len(expected) == 2 * 3 * 3 * 4
    assert all(seeds == {0, 1, 2, 3, 4} for seeds in combos.values())
    assert len(grid.jobs) == 360 and len({j.setting for j in grid.jobs}) == 72
    assert "mnist-lenet5-m20-K50-T600-sg0.01" in {s.name for s in grid.settings}
    assert "cifar10-resnet18gn-m100-K200-T150-sg1.0" in {s.name for s in grid.settings}
    assert any("Noisy-FedProx is not run" in n for n in grid.selection)


def test_defaults_the_paper_does_not_state_are_recorded_in_every_job():
    for scale in fa.SCALES:
        for j in fa.grid(scale).jobs:
            c = j.config
            p = c.algorithm.params
            assert (p["schedule"], p["clip_mode"], p["batch_sampling"]) == ("constant", "per_example", "shuffle")
            assert (c.training.optimizer.lr, c.training.batch_size, c.privacy.clip) == (fa.DEFAULT_LR, 32, 1.0)
            assert (c.privacy.delta, c.privacy.secure_aggregation, c.privacy.release) == (1e-5, False, "transcript")
            assert c.privacy.observer == "server" and c.privacy.smoothness_L is None  # the default (upload) view
            assert c.training.optimizer.momentum == 0


@pytest.mark.parametrize("scale", fa.SCALES)
def test_every_job_config_validates_and_reruns_from_its_base(scale):
    """Each job is `dpfl run BASE --set <setting overrides> --set <method overrides> --set seed=.. --set name=..`."""
    grid = fa.grid(scale, seeds=1)
    settings = {s.name: s for s in grid.settings}
    for j in grid.jobs:
        s = settings[j.setting]
        again = load_config(s.base, [*s.overrides, *s.methods[0].overrides, f"seed={j.seed}",
                                     f"name={s.name}.{j.method}.seed{j.seed}"])
        assert config_to_yaml(again) == config_to_yaml(j.config)
    for base in {s.base for s in grid.settings}:
        load_config(base)  # the shipped base configs are valid on their own


def test_reduced_and_ci_scales():
    grid = fa.grid("reduced")
    assert "REDUCED stand-in" in grid.label and grid.seeds == [0, 1]
    k, t = fa.REDUCED_KT
    assert len(grid.jobs) == 4 * 2
    for j in grid.jobs:
        c = j.config
        assert (c.data.dataset, c.model.name, c.data.clients, c.data.samples_per_client) == ("fashion_mnist", "lenet5",
                                                                                            20, 600)
        assert (c.training.local_steps, c.training.rounds) == (k, t) and c.algorithm.params["std"] in SIGMAS
        assert j.setting.startswith("fmnist-lenet5-m20-")
    assert all("REDUCED" in s.describe and "STAND-IN for mnist" in s.describe for s in grid.settings)
    ci = fa.grid("ci")
    assert ci.label == "ci" and len(ci.jobs) == 2 and {j.config.data.dataset for j in ci.jobs} == {"digits"}
    assert {j.config.algorithm.params["std"] for j in ci.jobs} == {1.0, 0.001}


def test_filters_labels_and_errors():
    g = fa.grid("full", seeds=2, rounds=30, settings_pattern="mnist-*-m20-K50-*")
    assert g.label == "full (reduced: 30 rounds instead of T = 600/300/150, 2 seeds instead of 5)"
    assert len(g.jobs) == 4 * 2 and {j.config.training.rounds for j in g.jobs} == {30}
    assert len(g.all_jobs) == 72 * 2
    # --rounds renames the settings too: a run directory must not say T600 when it trained 30 rounds
    assert {j.setting for j in g.jobs} == {f"mnist-lenet5-m20-K50-T30-sg{s}" for s in SIGMAS}
    assert all("T = 30 (TK = 1500; --rounds replaced T = 600)" in s.describe
               for s in g.settings if s.name.startswith("mnist-lenet5-m20-K50-"))
    stand_in = fa.grid("full", datasets=["fashion_mnist"], seeds=1)
    assert "STAND-IN" in stand_in.label and {j.config.data.dataset for j in stand_in.jobs} == {"fashion_mnist"}
    with pytest.raises(GridError, match="--scale must be one of ci, reduced, full"):
        fa.grid("tiny")
    with pytest.raises(GridError, match="ships digits"):
        fa.grid("ci", datasets=["mnist"])
    with pytest.raises(GridError, match="unknown method 'noisy_fedprox'"):
        fa.grid("ci", methods=["noisy_fedprox"])
    with pytest.raises(GridError, match="matches no setting"):
        fa.grid("ci", settings_pattern="cifar*")


# ---- the divergence rule ----------------------------------------------------------------------------------
def _rows(*evals, unevaluated=()):
    rows = [{"round": i + 1, "test_loss": loss, "test_accuracy": acc} for i, (loss, acc) in enumerate(evals)]
    return rows + [{"round": len(rows) + i + 1} for i in range(len(unevaluated))]


@pytest.mark.parametrize("metrics, diverged, why", [
    (_rows((2.3, 0.1), (1.2, 0.6), (0.9, 0.7)), False, ""),  # learning
    (_rows((2.3, 0.1), (2.31, 0.1), (2.30, 0.1)), False, ""),  # at chance but the loss never blew up: not diverged
    (_rows((2.3, 0.1), (60.0, 0.1), (40.0, 0.12)), True, "test loss 60 > 10 ln 10"),  # blew up, at chance
    (_rows((2.3, 0.1), (60.0, 0.1), (3.0, 0.151)), False, ""),  # blew up but recovered above chance + 0.05
    (_rows((2.3, 0.1), (23.0, 0.1)), False, ""),  # 23.0 < 10 ln 10 = 23.03: the bound is strict
    (_rows((2.3, 0.1), (23.1, 0.15)), True, "final accuracy 0.1500"),  # chance + 0.05 itself counts as chance
    (_rows((2.3, 0.1), (float("nan"), 0.1)), True, "non-finite test_loss"),
    (_rows((2.3, 0.1), (float("inf"), 0.3)), True, "non-finite test_loss"),  # non-finite: whatever the accuracy
    (_rows((2.3, 0.5), (1.0, float("nan"))), True, "non-finite test_accuracy"),
    (_rows((2.3, 0.1), ("NaN", 0.1)), True, "non-finite test_loss"),  # as the privacy files spell it
    ([{"round": 1}, {"round": 2}], False, ""),  # nothing evaluated: no verdict
])
def test_divergence_rule(metrics, diverged, why):
    v = fa.divergence(metrics, classes=10)
    assert v.diverged is diverged
    assert (why in v.reason) if why else v.reason == ""


def test_divergence_rule_constants_and_classes():
    assert fa.CHANCE_MARGIN == 0.05 and fa.LOSS_BLOWUP == 10.0
    blown = _rows((0.7, 0.5), (20.0, 0.52))  # 20 > 10 ln 2 = 6.9 and 0.52 <= 0.5 + 0.05 with two classes
    assert fa.divergence(blown, classes=2).diverged and not fa.divergence(blown, classes=10).diverged
    v = fa.divergence(_rows((2.3, 0.1), (60.0, 0.1), (40.0, 0.1)))
    assert (v.final_test_loss, v.max_test_loss) == (40.0, 60.0) and "at round 2" in v.reason


def test_cells_mark_diverged_and_average_the_rest():
    def row(acc, div, status=OK):
        return {"status": status, "final_accuracy": acc, "diverged": div}

    assert fa.cell([row(0.1, True), row(0.1, True)]) == "diverged (2/2)"
    assert fa.cell([row(0.1, True)]) == "diverged"
    assert fa.cell([row(0.8, False), row(0.6, False)]) == f"0.7000 ± {math.sqrt(0.02):.4f}"
    assert fa.cell([row(0.8, False), row(0.1, True)]) == "0.8000 ± n/a (1/2 diverged)"
    assert fa.cell([row(None, None, SKIPPED), row(None, None, SKIPPED)]) == "— (skipped)"
    assert fa.cell([row(0.5, False), row(None, None, FAILED)]) == "0.5000 ± n/a"


def test_write_results_from_synthetic_runs(tmp_path):
    """Two seeds of one configuration diverge, the other learns: the tables say so, next to μ and ε."""
    import json

    grid = fa.grid("ci")
    runs = {("1.0", 0): [(2.3, 0.1), (80.0, 0.1), (75.0, 0.1)], ("0.001", 0): [(2.2, 0.3), (1.5, 0.6), (1.0, 0.7)]}
    outcomes = []
    for j in grid.jobs:
        d = j.run_dir(tmp_path)
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(config_to_yaml(j.config))
        evals = runs[(j.setting.rsplit("-sg", 1)[1], j.seed)]
        with open(d / "metrics.jsonl", "w") as f:
            for i, (loss, acc) in enumerate(evals):
                f.write(json.dumps({"round": i + 1, "test_loss": loss, "test_accuracy": acc, "seconds": 0.5}) + "\n")
        (d / "summary.json").write_text(json.dumps({"rounds_done": 3, "stop_reason": "rounds"}))
        mu = 40.0 if j.config.algorithm.params["std"] == 1.0 else 4e4
        (d / "privacy.json").write_text(json.dumps({"accounted": True, "fdp": {
            "view": "upload", "release": "transcript", "headline": "composition", "mu_max": mu,
            "epsilon_max": {"1e-05": mu * 10, "0.001": mu * 9}}}))
        outcomes.append(Outcome(j, d, OK, "ran"))
    fa.write_results(grid, outcomes, tmp_path, command="dpfl reproduce fdp-accuracy --scale ci")
    with open(tmp_path / "results.csv", newline="") as f:
        rows = {r["sigma"]: r for r in csv.DictReader(f)}
    assert rows["1.0"]["diverged"] == "True" and "test loss 80" in rows["1.0"]["diverged_reason"]
    assert rows["0.001"]["diverged"] == "False" and rows["0.001"]["final_accuracy"] == "0.7"
    assert (float(rows["1.0"]["mu"]), float(rows["1.0"]["epsilon"]), rows["1.0"]["headline_bound"]) == (
        40.0, 400.0, "composition")
    assert (rows["1.0"]["view"], rows["1.0"]["delta"], rows["1.0"]["lr"]) == ("upload", "1e-05", str(fa.DEFAULT_LR))
    md = (tmp_path / "results.md").read_text()
    assert "| m | K | T | σ = 1.0 | σ = 0.001 |" in md and "| 10 | 5 | 3 | diverged | 0.7000 ± n/a |" in md
    assert "- Runs computed by: " in md and "Written by: dpfl " in md
    assert "| 10 | 5 | 3 | 1.0 | 1/1 | diverged | 1/1 | 40 | 400 (δ = 1e-05) | composition | upload/transcript |" in md
    assert "learning rate 0.1 (constant schedule), batch size 32" in md and "per_example clipping with V = 1.0" in md
    assert "- **Scale: ci** — ci smoke test: digits" in md  # the spec's scale: its description as it is


def test_a_changed_scale_says_its_description_is_the_scale_as_specified(tmp_path):
    """--rounds 120 on the reduced scale: the description's '(K, T) = (10, 12)' must not read as what ran."""
    grid = fa.grid("reduced", rounds=120)
    fa.write_results(grid, [], tmp_path, command="dpfl reproduce fdp-accuracy --scale reduced --rounds 120")
    scale_line = next(ln for ln in (tmp_path / "results.md").read_text().splitlines() if ln.startswith("- **Scale"))
    assert scale_line.startswith("- **Scale: reduced (changed: 120 rounds instead of T = 12)")
    assert "— the reduced scale as specified, before the changes in parentheses: REDUCED stand-in" in scale_line


# ---- running it ---------------------------------------------------------------------------------------------
def test_ci_scale_runs_end_to_end_through_the_cli(tmp_path):
    code, out, err = cli("reproduce", "fdp-accuracy", "--scale", "ci", "--out", tmp_path)
    assert code == 0, err
    assert "fdp-accuracy (ci): 2 ok" in out
    with open(tmp_path / "results.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == fa.COLUMNS
        rows = {r["sigma"]: r for r in reader}
    assert set(rows) == {"1.0", "0.001"}
    for r in rows.values():
        assert r["status"] == "ok" and r["scale"] == "ci" and r["rounds_run"] == "3"
        assert 0.0 <= float(r["final_accuracy"]) <= 1.0 and r["diverged"] in ("True", "False")
        assert float(r["seconds"]) > 0 and float(r["cpu_seconds"]) > 0  # both measured by the run itself
        assert (r["view"], r["release"], r["headline_bound"]) == ("upload", "transcript", "composition")
        mu, eps = float(r["mu"]), float(r["epsilon"])
        # upload view, composition: μ = 2 V η K √T / σ (constant schedule)
        assert mu == pytest.approx(2 * 1.0 * fa.DEFAULT_LR * 5 * math.sqrt(3) / float(r["sigma"]), rel=1e-9)
        assert eps > 0
    assert float(rows["0.001"]["mu"]) == pytest.approx(1000 * float(rows["1.0"]["mu"]))
    md = (tmp_path / "results.md").read_text()
    assert "**Scale: ci** — ci smoke test" in md and "dpfl reproduce fdp-accuracy --scale ci --out" in md
    assert "## digits with logr, 100 samples per client — CI scale, not the paper's setting" in md
    assert "| m | K | T | σ | seeds ok | final test acc | diverged | μ | ε | bound | view |" in md

    code, out, err = cli("reproduce", "fdp-accuracy", "--scale", "ci", "--out", tmp_path)  # again: nothing runs
    assert code == 0 and "finished before" in err and "2 ok" in out


def test_missing_dataset_is_skipped_not_failed(tmp_path):
    if not _mnist_missing():
        pytest.skip("MNIST is available here")
    grid = fa.grid("full", seeds=1, settings_pattern="mnist-lenet5-m20-K50-T600-sg0.01")
    [outcome] = run_jobs(grid.jobs, tmp_path)
    assert outcome.status == SKIPPED and "not available on this machine" in outcome.message
    code, out, err = cli("reproduce", "fdp-accuracy", "--scale", "full", "--out", tmp_path / "cli", "--seeds", "1",
                         "--settings", "mnist-lenet5-m20-K50-T600-sg0.01")
    assert code == 0, err
    assert "1 skipped" in out
    with open(tmp_path / "cli" / "results.csv", newline="") as f:
        [row] = list(csv.DictReader(f))
    assert row["status"] == "skipped" and "mnist" in row["message"]
    assert "— (skipped)" in (tmp_path / "cli" / "results.md").read_text()


def test_dry_run_lists_the_full_grid_and_marks_missing_datasets(tmp_path):
    code, out, err = cli("reproduce", "fdp-accuracy", "--scale", "full", "--out", tmp_path, "--dry-run")
    assert code == 0, err
    assert out.splitlines()[0] == f"fdp-accuracy, scale full: 360 jobs -> {tmp_path / 'runs'}"
    if _mnist_missing():
        assert out.count("dataset mnist not found locally: would be skipped") == 180
    assert not any(tmp_path.iterdir())
    code, _, err = cli("reproduce", "fdp-accuracy", "--scale", "ci", "--out", tmp_path, "--dataset", "mnist")
    assert code == 2 and err.startswith("error: --dataset: the fdp-accuracy grid at --scale ci ships digits")


def test_outcomes_are_read_back_from_the_run_directories(tmp_path):
    """What `dpfl reproduce fdp-accuracy` tabulates after running: finished, failed (a log), started, nothing."""
    grid = fa.grid("ci")
    done, failed = grid.jobs
    d = done.run_dir(tmp_path)
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(config_to_yaml(done.config))
    (d / "summary.json").write_text("{}")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / f"{failed.setting}.{failed.method}.seed0.log").write_text("Traceback")
    got = {o.job.setting: (o.status, o.message) for o in fa.outcomes_from_dirs(grid, tmp_path)}
    assert got[done.setting] == (OK, "")
    assert got[failed.setting][0] == FAILED and "logs/" in got[failed.setting][1]
    (tmp_path / "logs" / f"{failed.setting}.{failed.method}.seed0.log").unlink()
    f = failed.run_dir(tmp_path)
    f.mkdir(parents=True)
    (f / "config.yaml").write_text(config_to_yaml(failed.config))
    assert {o.job.setting: o.status for o in fa.outcomes_from_dirs(grid, tmp_path)}[failed.setting] == "incomplete"
    other = fa.grid("ci", settings_pattern=done.setting)  # unselected jobs appear only when finished
    assert [o.job.setting for o in fa.outcomes_from_dirs(other, tmp_path)] == [done.setting]


def test_reduced_dry_run_is_labelled_reduced_stand_in(tmp_path):
    code, out, err = cli("reproduce", "fdp-accuracy", "--scale", "reduced", "--out", tmp_path, "--dry-run")
    assert code == 0, err
    assert out.splitlines()[0] == ("fdp-accuracy, scale reduced [REDUCED stand-in: fashion_mnist + lenet5 for mnist]: "
                                   f"8 jobs -> {tmp_path / 'runs'}")
    assert sum(line.startswith("fmnist-lenet5-m20-K10-T12-sg") for line in out.splitlines()) == 8


def test_each_dataset_keeps_its_own_normalisation():
    norms = {j.config.data.dataset: j.config.data.options["normalize"]
             for j in fa.grid("full", datasets=["mnist", "cifar10", "fashion_mnist"], seeds=1).jobs}
    assert norms == {"mnist": [0.1307, 0.3081], "fashion_mnist": [0.2860, 0.3530],
                     "cifar10": [[0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]]}

"""`dpfl reproduce splitting`: setting configs, the study runner, its outputs and its errors."""

import csv
import json
from pathlib import Path

import pytest

from cli_runner import cli
from dpfl.experiment.config import ConfigError
from dpfl.reproduce import splitting
from dpfl.reproduce.splitting_config import load_setting, validate_setting

TINY = """
name: tiny-ls
problem: {kind: least_squares, preset: small, shift_scale: 1.0}
rounds: 40
anderson: {memories: [0, 2]}
methods:
  - {name: fedavg_k5, preset: fedavg, eta: 0.001, local: {name: gradient_steps, k: 5}}
  - {name: fedpi, preset: fedpi, eta: 0.005, local: {name: exact_ls_prox}}
"""


@pytest.fixture
def tiny_scale(tmp_path, monkeypatch):
    configs = tmp_path / "configs"
    (configs / "convex").mkdir(parents=True)
    (configs / "convex" / "tiny.yaml").write_text(TINY)
    monkeypatch.setattr(splitting, "config_dir", lambda family: configs)
    monkeypatch.setitem(splitting.SCALES, "ci", {"settings": ("tiny",), "seeds": 1})
    return configs


def test_every_shipped_setting_validates():
    for scale in splitting.SCALES:
        for setting in splitting.settings(scale):
            assert setting.methods and setting.rounds >= 1
        splitting.plan(scale)  # validates the CNN run configs too


def test_the_cnn_grid_is_the_spec_comparison():
    """5 presets x (tau 0, 10) x 3 partitions x 4 seeds; Anderson's scope as §7 allows; the reduced scale is
    labelled and changes only the rounds and the local epochs."""
    full, reduced = splitting.plan("full").cnn, splitting.plan("reduced").cnn
    assert len(full.jobs) == len(reduced.jobs) == 5 * 2 * 3 * 4
    assert splitting.plan("ci").cnn is None and not splitting.plan("reduced").convex
    by = {(j.setting, j.method, j.seed): j.config for j in full.jobs}
    assert by["cnn-shards2", "fedpi-aa10", 3].algorithm.params["anderson"]["scope"] == "state"
    assert by["cnn-iid", "fedrp-aa10", 0].algorithm.params["anderson"] == {"memory": 10, "scope": "global",
                                                                          "blend": 0.0, "safeguard": False}
    assert by["cnn-iid", "fedavg-aa0", 0].algorithm.params.get("anderson") is None  # dpfl's own fedavg
    assert by["cnn-shards6", "fedprox-aa0", 1].algorithm.params["mu"] == 1.0
    assert {c.data.partition for c in by.values()} == {"iid", "shards"}
    for j in reduced.jobs:
        f = by[j.setting, j.method, j.seed]
        assert (j.config.training.rounds, j.config.training.local_epochs) == (30, 1)
        assert (f.training.rounds, f.training.local_epochs) == (100, 10)
        assert j.config.algorithm == f.algorithm and j.config.data == f.data
    assert "reduced" in reduced.label and "local_epochs=1" in reduced.label
    everyone = splitting.plan("reduced-all-clients").cnn  # reduced, but the whole population in every round
    key = lambda j: (j.setting, j.method, j.seed)  # noqa: E731
    assert [key(j) for j in everyone.jobs] == [key(j) for j in reduced.jobs]
    for j, r in zip(everyone.jobs, reduced.jobs, strict=True):
        assert (j.config.training.selection.kind, r.config.training.selection.kind) == ("all", "fixed")
        assert j.config.training.model_copy(update={"selection": r.config.training.selection}) == r.config.training
        assert j.config.algorithm == r.config.algorithm and j.config.data == r.config.data
    assert "reduced" in everyone.label and "selection={kind: all}" in everyone.label
    assert not splitting.plan("reduced-all-clients").convex
    only = splitting.plan("full", methods=["fedpi"], settings_pattern="cnn-iid,ls-s1")
    assert {j.method for j in only.cnn.jobs} == {"fedpi-aa0", "fedpi-aa10"}
    assert {j.method for j in only.convex} == {"fedpi"}


TINY_CNN = """
name: tiny-cnn
seed: 0
data: {dataset: digits, clients: 4, partition: iid}
model: {name: logr}
algorithm: {name: fedpi, params: {eta: 1.0}}
training: {rounds: 3, local_epochs: 0.5, batch_size: 16, optimizer: {lr: 0.1}, selection: {kind: fixed, k: 2}}
evaluation: {every: 1}
"""


def _tiny_cnn_grid(tmp_path: Path, monkeypatch) -> None:
    """The CNN half with one tiny digits partition (TINY_CNN) and Anderson memory 2."""
    from dpfl.reproduce import splitting_cnn

    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "tiny.yaml").write_text(TINY_CNN)
    monkeypatch.setattr(splitting_cnn, "config_dir", lambda family: configs)
    monkeypatch.setattr(splitting_cnn, "PARTITIONS", {"cnn-tiny": ("tiny.yaml", "digits, 4 clients")})
    monkeypatch.setattr(splitting_cnn, "TAU", 2)


def test_the_cnn_half_runs_real_runs_and_reports_them(tmp_path, monkeypatch):
    from dpfl.reproduce import splitting_cnn

    _tiny_cnn_grid(tmp_path, monkeypatch)
    out = tmp_path / "out"
    lines = []
    csv_path, md_path, rows = splitting.run_study("reduced", out, seeds=1, rounds=3, methods=["fedavg", "fedpi"],
                                                  progress=lines.append)
    with open(csv_path) as f:
        table = list(csv.DictReader(f))
    assert [(r["method"], r["anderson"]) for r in table] == [("fedavg", "0"), ("fedavg", "2"), ("fedpi", "0"),
                                                             ("fedpi", "2")]
    assert all(r["status"] == "ok" and r["rounds"] == "3" and 0 < float(r["final_accuracy"]) <= 1 for r in table)
    assert table[0]["final_residual"] == "" and float(table[3]["final_residual"]) > 0  # only splitting logs it
    assert (out / "runs" / "cnn-tiny" / "fedpi-aa2" / "seed0" / "summary.json").is_file()
    assert (out / "plots" / "accuracy_cnn-tiny.png").stat().st_size > 0
    text = md_path.read_text()
    assert "## Nonconvex" in text and "| fedpi | 2 |" in text and len(lines) == 4
    assert "Runs computed by: dpfl " in text and " (4 runs)." in text
    assert "4 clients, 2 per round" in text  # the cohort the table states is the runs' (TINY_CNN's)
    everyone = splitting.plan("reduced-all-clients", seeds=1, rounds=3, methods=["fedavg"]).cnn
    assert "all 4 clients in every round" in splitting_cnn.markdown(everyone, [], out)  # TINY_CNN, every client
    again = splitting.run_study("reduced", out, seeds=1, rounds=3, methods=["fedavg", "fedpi"])[2]
    assert [r["final_accuracy"] for r in again] == [r["final_accuracy"] for r in rows]  # collected, not rerun


@pytest.mark.integration  # two worker processes (~8 s); the CNN half runs in process in the default tier
def test_the_cnn_runs_can_be_shared_by_worker_processes(tmp_path, monkeypatch):
    """--workers: the CNN jobs (built here from the patched configs, pickled to the workers) run once each."""
    _tiny_cnn_grid(tmp_path, monkeypatch)
    out = tmp_path / "out"
    rows = splitting.run_study("reduced", out, seeds=1, rounds=3, methods=["fedavg", "fedpi"], workers=2)[2]
    assert [(r["method"], r["anderson"], r["status"], r["rounds"]) for r in rows] == [
        ("fedavg", 0, "ok", 3), ("fedavg", 2, "ok", 3), ("fedpi", 0, "ok", 3), ("fedpi", 2, "ok", 3)]
    for d in (out / "runs" / "cnn-tiny").glob("*/seed0"):
        assert len((d / "environment.jsonl").read_text().splitlines()) == 1, d  # each run started once
    code, _, err = cli("reproduce", "splitting", "--scale", "ci", "--out", tmp_path / "o", "--workers", "0")
    assert code == 2 and "--workers must be at least 1" in err
    code, _, err = cli("reproduce", "splitting", "--scale", "ci", "--out", tmp_path / "o", "--workers", "2",
                       "--dry-run")
    assert code == 2 and "--dry-run runs none" in err


def test_study_writes_one_row_per_run_with_the_required_columns(tiny_scale, tmp_path):
    out = tmp_path / "out"
    csv_path, md_path, rows = splitting.run_study("ci", out)
    with open(csv_path) as f:
        table = list(csv.DictReader(f))
    required = {"setting", "method", "anderson", "seed", "rounds", "final_gap", "final_rel_dist", "rounds_to_1e-8"}
    assert required <= set(table[0])
    assert [(r["method"], r["anderson"]) for r in table] == [("fedavg_k5", "0"), ("fedavg_k5", "2"), ("fedpi", "0"),
                                                             ("fedpi", "2")]
    assert all(r["status"] == "ok" and r["rounds"] == "40" for r in table)
    fedpi = {r["anderson"]: r for r in table if r["method"] == "fedpi"}
    assert float(fedpi["0"]["final_rel_dist"]) < 1e-8  # exact prox, heterogeneous: FedPi reaches theta*
    assert int(fedpi["2"]["rounds_to_1e-8"]) < int(fedpi["0"]["rounds_to_1e-8"])
    assert all(float(r["final_rel_dist"]) > 1e-3 for r in table if r["method"] == "fedavg_k5")  # biased
    metrics = out / "runs" / "tiny-ls" / "fedpi-aa0-seed0.jsonl"
    assert len(metrics.read_text().splitlines()) == 40
    assert (out / "plots" / "gap_tiny-ls.png").stat().st_size > 0
    assert "| fedpi | 0 |" in md_path.read_text()


def test_rerunning_continues_instead_of_repeating(tiny_scale, tmp_path):
    out = tmp_path / "out"
    splitting.run_study("ci", out)
    summary = out / "runs" / "tiny-ls" / "fedpi-aa0-seed0.json"
    marked = {**json.loads(summary.read_text()), "seconds": -1.0}
    summary.write_text(json.dumps(marked))
    _, _, rows = splitting.run_study("ci", out)
    assert next(r for r in rows if r["method"] == "fedpi" and r["anderson"] == 0)["seconds"] == -1.0


def test_a_failing_run_is_recorded_and_the_others_go_on(tiny_scale, tmp_path, monkeypatch):
    from dpfl.reproduce import splitting_solver as splitting_run

    real = splitting_run.run_splitting

    def flaky(problem, alg, rounds, **kw):
        if alg.name == "fedavg":
            raise RuntimeError("boom")
        return real(problem, alg, rounds, **kw)

    monkeypatch.setattr(splitting_run, "run_splitting", flaky)
    out = tmp_path / "out"
    _, _, rows = splitting.run_study("ci", out)
    assert [r["status"] for r in rows] == ["failed", "failed", "ok", "ok"]
    assert "boom" in (out / "logs" / "tiny-ls-fedavg_k5-aa0-seed0.txt").read_text()
    assert not (out / "runs" / "tiny-ls" / "fedavg_k5-aa0-seed0.json").exists()  # retried next time


@pytest.mark.parametrize("change, match", [
    (lambda d: d["methods"][0].update(preset="fedsgd"), r"methods\.0\.preset"),
    (lambda d: d["anderson"].update(memories=[-1]), "memory tau must be >= 0"),
    (lambda d: d["methods"][1].update(eta=0), r"methods\.1\.eta"),
    (lambda d: d["problem"].update(kind="logistic"), "cannot apply to a logistic problem"),
    (lambda d: d.update(participation={"kind": "poisson", "rate": 0.5}) or d["methods"][1].update(mode="decentralized"),
     "decentralized mode with partial participation"),
    (lambda d: d["methods"][0].update(local={"name": "exact_ls_prox"}), "needs a gradient operator"),
    (lambda d: d.update(colour="blue"), "colour"),
])
def test_bad_settings_are_one_config_error(change, match):
    import yaml

    data = yaml.safe_load(TINY)
    change(data)
    with pytest.raises(ConfigError, match=match) as err:
        validate_setting(data, "tiny.yaml")
    assert "\n" not in str(err.value)


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, match in ((["--scale", "huge"], "--scale must be one of ci, reduced, reduced-all-clients, full"),
                        (["--scale", "ci", "--methods", "nope"], "unknown method 'nope'"),
                        (["--scale", "ci", "--settings", "zzz*"], "matches no setting"),
                        (["--scale", "ci", "--seeds", "0"], "--seeds must be >= 1")):
        code, out, err = cli("reproduce", "splitting", "--out", tmp_path / "o", *args)
        assert code == 2, (args, out, err)
        assert match in err and len(err.strip().splitlines()) == 1


def test_cli_dry_run_lists_the_jobs(tmp_path):
    code, out, _ = cli("reproduce", "splitting", "--scale", "ci", "--out", tmp_path / "o", "--dry-run")
    assert code == 0
    assert "ls-s1 fedpi-aa2-seed0 (605 rounds): new" in out
    assert len(out.strip().splitlines()) == 24  # 2 problems x 6 methods x (tau 0, 2)
    code, out, _ = cli("reproduce", "splitting", "--scale", "reduced", "--out", tmp_path / "o", "--dry-run",
                       "--settings", "cnn-iid", "--seeds", "1")
    assert code == 0 and "cnn-iid" in out and "fedpi-aa10" in out and "new" in out
    code, out, _ = cli("reproduce", "splitting", "--scale", "reduced-all-clients", "--out", tmp_path / "all",
                       "--dry-run", "--settings", "cnn-iid", "--seeds", "1")  # as a user lists the new scale's grid
    assert code == 0 and "10 jobs" in out and "cnn-iid" in out and "fedrp-aa10" in out


def test_load_setting_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_setting(tmp_path / "missing.yaml")


def test_dpfl_data_convex_reports_the_heterogeneity(tmp_path):
    from dpfl.data import heterogeneity, make_least_squares

    code, out, _ = cli("data", "convex", "--preset", "small", "--shift-scale", "1", "--json")
    assert code == 0
    stats = json.loads(out)
    expected = heterogeneity(make_least_squares(preset="small", shift_scale=1.0, seed=0))
    assert stats["heterogeneity_H"] == pytest.approx(expected, rel=1e-12)
    code0, out0, _ = cli("data", "convex", "--preset", "small", "--json")
    assert json.loads(out0)["heterogeneity_H"] < stats["heterogeneity_H"]
    code, _, err = cli("data", "convex", "--shift-scale", "-1")
    assert code == 2 and "shift_scale" in err and len(err.strip().splitlines()) == 1


def test_the_same_out_with_other_rounds_is_refused(tiny_scale, tmp_path):
    out = tmp_path / "out"
    splitting.run_study("ci", out, methods=["fedpi"])
    with pytest.raises(ValueError, match="holds a run of another setting"):
        splitting.run_study("ci", out, methods=["fedpi"], rounds=10)
    _, _, rows = splitting.run_study("ci", out, methods=["fedpi"])  # the same options continue
    assert all(r["status"] == "ok" for r in rows)


def test_tables_only_collects_finished_jobs_and_runs_none(tiny_scale, tmp_path, monkeypatch):
    (tiny_scale / "convex" / "tiny2.yaml").write_text(TINY.replace("name: tiny-ls", "name: tiny-ls2"))
    monkeypatch.setitem(splitting.SCALES, "ci", {"settings": ("tiny", "tiny2"), "seeds": 1})
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="--tables-only: no finished job"):
        splitting.run_study("ci", out, compute=False)
    splitting.run_study("ci", out, methods=["fedpi"], settings_pattern="tiny-ls")  # 2 of the 8 jobs
    (out / "results.csv").unlink()
    _, md_path, rows = splitting.run_study("ci", out, compute=False)
    assert {(r["setting"], r["method"], r["anderson"]) for r in rows} == {("tiny-ls", "fedpi", 0),
                                                                          ("tiny-ls", "fedpi", 2)}
    assert all(r["status"] == "ok" for r in rows)
    assert not list(out.glob("**/fedavg_k5*")) and not (out / "runs" / "tiny-ls2").exists()  # nothing ran
    assert {r["method"] for r in csv.DictReader((out / "results.csv").open())} == {"fedpi"}
    md = md_path.read_text()
    assert "| fedpi |" in md
    assert "### tiny-ls2" in md and "No job of this setting has finished yet." in md
    # as a user runs it, with 2 seeds planned: "seeds ok" counts the finished seed against the planned ones
    code, out_text, err = cli("reproduce", "splitting", "--scale", "ci", "--out", out, "--seeds", "2", "--tables-only")
    assert code == 0, err
    assert "splitting (ci): 2 ok, 0 failed" in out_text
    fedpi = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| fedpi |")]
    assert len(fedpi) == 2 and all(line.endswith("| 1/2 |") for line in fedpi), fedpi
    code, _, err = cli("reproduce", "splitting", "--scale", "ci", "--out", out, "--dry-run", "--tables-only")
    assert code == 2 and "--dry-run and --tables-only: choose one" in err


def test_only_seeds_runs_those_seeds_and_the_tables_keep_the_others(tiny_scale, tmp_path, monkeypatch):
    """--only-seeds spreads a grid's seeds over sessions: each invocation runs its seeds; the other seeds' finished
    runs under the same --out are read back (not rerun) into the tables, convex and CNN alike."""
    (tmp_path / "cnn-side").mkdir()  # tiny_scale has tmp_path/configs
    _tiny_cnn_grid(tmp_path / "cnn-side", monkeypatch)
    cnn = splitting.plan("reduced", seeds=2, methods=["fedavg"], only_seeds=[1])
    assert {j.seed for j in cnn.cnn.jobs} == {1} and {j.seed for j in cnn.cnn_other_seeds} == {0}
    convex = splitting.plan("ci", seeds=2, only_seeds=[1])
    assert {j.seed for j in convex.convex} == {1} and {j.seed for j in convex.convex_other_seeds} == {0}
    with pytest.raises(ValueError, match="seed 2 is not among the planned seeds 0..1"):
        splitting.plan("reduced", seeds=2, only_seeds=[2])
    with pytest.raises(ValueError, match="seed 1 is not among the planned seeds 0..0"):
        splitting.plan("ci", only_seeds=[1])

    out = tmp_path / "out"
    first = splitting.run_study("ci", out, seeds=2, only_seeds=[1])[2]
    assert {r["seed"] for r in first} == {1} and len(first) == 4
    summary = out / "runs" / "tiny-ls" / "fedpi-aa0-seed1.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "seconds": -1.0}))  # marks the finished run
    both = splitting.run_study("ci", out, seeds=2, only_seeds=[0])[2]
    assert sorted((r["seed"], r["method"], r["anderson"]) for r in both) == sorted(
        (s, m, t) for s in (0, 1) for m in ("fedavg_k5", "fedpi") for t in (0, 2))
    assert next(r for r in both if r["seed"] == 1 and r["method"] == "fedpi" and r["anderson"] == 0)["seconds"] == -1
    fedpi = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| fedpi |")]
    assert len(fedpi) == 2 and all(line.endswith("| 2/2 |") for line in fedpi), fedpi

    cnn_out = tmp_path / "cnn"
    rows = splitting.run_study("reduced", cnn_out, seeds=2, rounds=3, methods=["fedavg"], only_seeds=[1])[2]
    assert [(r["seed"], r["anderson"]) for r in rows] == [(1, 0), (1, 2)]
    assert not (cnn_out / "runs" / "cnn-tiny" / "fedavg-aa0" / "seed0").exists()  # seed 0 was not run
    rows = splitting.run_study("reduced", cnn_out, seeds=2, rounds=3, methods=["fedavg"], only_seeds=[0])[2]
    assert sorted((r["seed"], r["anderson"]) for r in rows) == [(0, 0), (0, 2), (1, 0), (1, 2)]
    assert all(r["status"] == "ok" for r in rows)
    for d in (cnn_out / "runs" / "cnn-tiny").glob("*/seed1"):
        assert len((d / "environment.jsonl").read_text().splitlines()) == 1, d  # seed 1 ran once, read back after


def test_cli_only_seeds(tmp_path):
    code, out, _ = cli("reproduce", "splitting", "--scale", "reduced", "--out", tmp_path / "o", "--dry-run",
                       "--settings", "cnn-iid", "--seeds", "2", "--only-seeds", "1")
    assert code == 0 and "10 jobs" in out
    jobs = [line for line in out.splitlines() if line.startswith("cnn-iid ")]
    assert len(jobs) == 10 and all(line.split()[2] == "1" for line in jobs), jobs
    for args, match in ((["--only-seeds", "4"], "seed 4 is not among the planned seeds 0..1"),
                        (["--only-seeds", "1", "--tables-only"], "--only-seeds chooses the seeds to train")):
        code, _, err = cli("reproduce", "splitting", "--scale", "reduced", "--out", tmp_path / "o", "--seeds", "2",
                           *args)
        assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err

"""`dpfl reproduce` as a user runs it: a tiny real PFA comparison, re-running it, dry runs and usage errors."""

from __future__ import annotations

import csv

import pytest

from cli_runner import cli

SETTING = "fmnist-logr-iid-MixGauss1-M10-rdp"




def _one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_reproduce_pfa_runs_labels_and_resumes(tmp_path, fmnist):
    args = ["reproduce", "pfa", "--scale", "ci", "--out", tmp_path, "--settings", SETTING,
            "--methods", "max_eps", "--rounds", "1"]
    code, out, err = cli(*args)
    assert code == 0, err
    assert f"[1/1] {SETTING} max_eps seed0: ok (ran, final accuracy" in err
    assert "pfa (ci (reduced: 1 round instead of 5)): 1 ok" in out
    with open(tmp_path / "results.csv", newline="") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"max_eps"}
    # max_eps calibrates everyone to epsilon 10 while MixGauss1 budgets are ~0.1: it violates them
    assert rows["max_eps"]["meets_budgets"] == "False"
    assert float(rows["max_eps"]["max_epsilon_spent"]) > float(rows["max_eps"]["min_budget"])
    md = (tmp_path / "results.md").read_text()
    assert "| max_eps — **NOT private (violates budgets)** | 1/1 |" in md
    assert "dpfl reproduce pfa --scale ci --out" in md and "--rounds 1" in md

    code, out, err = cli(*args)  # again: nothing to run, results re-collected
    assert code == 0, err
    assert "finished before" in err and "ran," not in err
    assert "1 ok" in out

    line = _one_line_error(*cli(*args[:-1], "2")[::2])
    assert "holds a run with a different config" in line

    # --tables-only: the tables again from the finished run, nothing trained; the command shown computes them
    (tmp_path / "results.csv").unlink()
    code, out, err = cli(*args, "--tables-only")
    assert code == 0, err
    assert "max_eps seed0" not in err and "1 ok" in out
    with open(tmp_path / "results.csv", newline="") as f:
        assert {r["method"]: r for r in csv.DictReader(f)} == rows
    assert "--tables-only" not in (tmp_path / "results.md").read_text()

    # a job killed after its last checkpoint: --dry-run says how far it got, the next invocation resumes it
    (tmp_path / "runs" / SETTING / "max_eps" / "seed0" / "summary.json").unlink()
    code, out, err = cli(*args, "--dry-run")
    assert code == 0, err
    [job_line] = [line for line in out.splitlines() if line.startswith(SETTING)]
    assert job_line.split()[:2] == [SETTING, "max_eps"] and "partial: round 1 of 1 logged" in job_line
    code, out, err = cli(*args)
    assert code == 0, err
    assert f"{SETTING} max_eps seed0: ok (resumed" in err and "1 ok" in out


def test_a_private_run_planned_less_than_one_participation_fails_max_eps_trains(tmp_path, fmnist):
    """1 round with 8 of 10 clients: a budget-enforcing method's clients are planned 0.8 participations and could not
    afford round 1, so the job fails with why (before, it finished with 0 rounds trained); max_eps, whose budgets are
    not enforced, trains its round."""
    code, out, err = cli("reproduce", "pfa", "--scale", "ci", "--out", tmp_path, "--settings", SETTING,
                         "--methods", "max_eps,fedavg", "--rounds", "1")
    assert code == 1
    with open(tmp_path / "results.csv", newline="") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    assert rows["max_eps"]["status"] == "ok" and rows["max_eps"]["rounds_run"] == "1"
    assert rows["fedavg"]["status"] == "failed" and "0.8 participations" in rows["fedavg"]["message"]
    assert "would train nothing" in rows["fedavg"]["message"]


def test_only_seeds_runs_those_seeds_and_the_tables_collect_every_finished_one(tmp_path, fmnist):
    # a grid's seeds spread over two invocations (two machines or sessions) into one --out
    args = ["reproduce", "pfa", "--scale", "ci", "--out", tmp_path, "--settings", SETTING, "--methods", "max_eps",
            "--rounds", "1", "--seeds", "2"]
    code, out, err = cli(*args, "--only-seeds", "1")
    assert code == 0, err
    assert f"[1/1] {SETTING} max_eps seed1: ok (ran" in err and "seed0" not in err
    first_piece = tmp_path.parent / f"{tmp_path.name}-seed1.csv"
    first_piece.write_text((tmp_path / "results.csv").read_text())
    assert not (tmp_path / "runs" / SETTING / "max_eps" / "seed0").exists()
    md = (tmp_path / "results.md").read_text()
    assert "| 1/2 |" in md and "seeds selected with --only-seeds 1" in md and "--only-seeds 1" in md
    assert "- Runs: 1 (1 ok); seed 1 of the planned 0..1;" in md
    code, out, err = cli(*args, "--only-seeds", "0")
    assert code == 0, err
    assert f"{SETTING} max_eps seed0: ok (ran" in err and "seed1: ok (ran" not in err
    with open(tmp_path / "results.csv", newline="") as f:
        assert sorted(r["seed"] for r in csv.DictReader(f)) == ["0", "1"]
    assert "| 2/2 |" in (tmp_path / "results.md").read_text()
    assert "- Runs: 2 (2 ok); seeds 0..1;" in (tmp_path / "results.md").read_text()
    # the first piece's CSV merged with the whole grid's is the whole grid's, byte for byte (dpfl's order kept)
    merged = tmp_path.parent / f"{tmp_path.name}-merged.csv"
    code, out, err = cli("reproduce", "merge", first_piece, tmp_path / "results.csv", "--out", merged)
    assert code == 0, err
    assert "merged 2 files: 2 rows" in out
    assert merged.read_text() == (tmp_path / "results.csv").read_text()


def test_only_seeds_usage_errors(tmp_path):
    args = ["reproduce", "pfa", "--scale", "ci", "--out", tmp_path, "--settings", SETTING, "--seeds", "2"]
    assert "seed 2 is not among the planned seeds 0..1 (raise --seeds" in _one_line_error(
        *cli(*args, "--only-seeds", "0,2")[::2])
    assert "comma-separated seed numbers" in _one_line_error(*cli(*args, "--only-seeds", "one")[::2])
    assert "--tables-only trains none" in _one_line_error(*cli(*args, "--only-seeds", "1", "--tables-only")[::2])
    assert "--only-seeds applies to the comparison" in _one_line_error(*cli(
        "reproduce", "robust-hdp", "--scale", "ci", "--out", tmp_path, "--noise-table", "--only-seeds", "0")[::2])
    round1 = ["reproduce", "rdpcfl", "--scale", "ci", "--out", tmp_path, "--round1-analysis", "--seeds", "2"]
    assert "seed 2 is not among the planned seeds 0..1" in _one_line_error(*cli(*round1, "--only-seeds", "2")[::2])
    assert "--tables-only computes none" in _one_line_error(*cli(*round1, "--only-seeds", "1", "--tables-only")[::2])
    assert "--only-seeds applies to the comparison" in _one_line_error(*cli(
        "reproduce", "fedceo", "--scale", "ci", "--out", tmp_path, "--search", "--only-seeds", "0")[::2])
    assert not any(tmp_path.iterdir())


def test_set_overrides_every_run_and_every_output_says_so(tmp_path, fmnist):
    args = ["reproduce", "pfa", "--scale", "ci", "--out", tmp_path, "--settings", SETTING, "--methods", "max_eps",
            "--rounds", "1"]
    code, out, err = cli(*args, "--set", "training.optimizer.lr=0.37", "--set", "training.batch_size=16")
    assert code == 0, err
    label = "ci (reduced: 1 round instead of 5, overrides training.optimizer.lr=0.37 training.batch_size=16)"
    assert f"pfa ({label}): 1 ok" in out
    saved = (tmp_path / "runs" / SETTING / "max_eps" / "seed0" / "config.yaml").read_text()
    assert "lr: 0.37" in saved and "batch_size: 16" in saved
    md = (tmp_path / "results.md").read_text()
    assert label in md and "--set training.optimizer.lr=0.37 --set training.batch_size=16" in md
    with open(tmp_path / "results.csv", newline="") as f:
        assert [r["scale"] for r in csv.DictReader(f)] == [label]
    # the same --out without the overrides is another config: refused, nothing overwritten
    assert "holds a run with a different config" in _one_line_error(*cli(*args)[::2])
    assert "lr: 0.37" in (tmp_path / "runs" / SETTING / "max_eps" / "seed0" / "config.yaml").read_text()


@pytest.mark.parametrize("command, message", [
    (["pfa", "--set", "seed=3"], "--set seed: the grid sets seed for each run (use --seeds)"),
    (["pfa", "--set", "training.rounds=3"], "the grid sets training.rounds for each run (use --rounds)"),
    (["pfa", "--set", "name=x"], "--set name: the grid sets name for each run"),
    (["pfa", "--set", "lr"], "--set 'lr': expected FIELD.PATH=VALUE"),  # the message of dpfl run --set
    (["pfa", "--set", " seed =3"], "--set seed: the grid sets seed for each run"),  # read as dpfl run reads it
    (["pfa", "--set", "training.optimizer.lrr=3"], "training.optimizer.lrr: unknown field, did you mean 'lr'?"),
    (["robust-hdp", "--noise-table", "--set", "training.optimizer.lr=1"], "--set applies to the comparison"),
    (["rdpcfl", "--round1-analysis", "--set", "training.optimizer.lr=1"], "--set applies to the comparison"),
    (["fedceo", "--dlg", "--set", "training.optimizer.lr=1"], "--set applies to the comparison and --search"),
    (["fedceo", "--search", "--set", "seed=1"], "--set seed: the grid sets seed for each run"),  # read, not ignored
])
def test_set_usage_errors(tmp_path, command, message):
    assert message in _one_line_error(*cli("reproduce", *command, "--scale", "ci", "--out", tmp_path,
                                           "--dry-run")[::2])
    assert not any(tmp_path.iterdir())


def test_tables_only_trains_nothing_and_needs_a_finished_run(tmp_path):
    args = ["reproduce", "pfa", "--scale", "ci", "--out", tmp_path, "--settings", SETTING, "--methods", "max_eps"]
    line = _one_line_error(*cli(*args, "--tables-only")[::2])
    assert "--tables-only: no finished run of this selection under" in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results.csv").exists()
    line = _one_line_error(*cli(*args, "--tables-only", "--dry-run")[::2])
    assert "--dry-run and --tables-only: choose one" in line
    line = _one_line_error(*cli("reproduce", "fedceo", "--scale", "ci", "--out", tmp_path, "--search",
                                "--tables-only")[::2])
    assert "--tables-only applies to the comparison" in line


def test_dry_run_lists_jobs_and_runs_nothing(tmp_path):
    code, out, err = cli("reproduce", "robust-hdp", "--scale", "full", "--out", tmp_path, "--dry-run", "--seeds", "2",
                         "--rounds", "20", "--settings", "fmnist-Dist5*", "--dataset", "fmnist")
    assert code == 0, err
    assert out.splitlines()[0] == ("robust-hdp, scale full (reduced: 20 rounds instead of 200, 2 seeds instead of 3): "
                                   f"30 jobs -> {tmp_path / 'runs'}")
    lines = [line.split() for line in out.splitlines() if line.startswith("fmnist-")]
    assert len(lines) == 30 and {line[3] for line in lines} == {"new"}  # Dist5, its two lies, two controls
    assert not any(tmp_path.iterdir())


def test_dry_run_shows_a_missing_dataset(tmp_path):
    from dpfl.data import available

    if any(r["name"] == "mnist" and r.get("source") != "missing" for r in available()):
        pytest.skip("MNIST is available here")
    code, out, _ = cli("reproduce", "pfa", "--scale", "full", "--out", tmp_path, "--dry-run", "--dataset", "mnist",
                       "--methods", "pfa")
    assert code == 0
    assert out.count("dataset mnist not found locally: would be skipped") == 16 * 5  # settings x seeds


@pytest.mark.parametrize("args, message", [
    (["--scale", "tiny"], "--scale must be 'ci' or 'full'"),
    (["--scale", "ci", "--methods", "pfa,nope"], "unknown method 'nope'"),
    (["--scale", "ci", "--settings", "cifar*"], "matches no setting"),
    (["--scale", "ci", "--seeds", "0"], "--seeds must be >= 1"),
    (["--scale", "ci", "--rounds", "0"], "--rounds must be >= 1"),
    (["--scale", "ci", "--calibration", "exact"], "--calibration must be one of accountant, pfa-heuristic"),
    (["--scale", "full", "--dataset", "cifar10"], "ships fashion_mnist and mnist"),
])
def test_usage_errors_are_one_line_with_exit_code_2(tmp_path, args, message):
    line = _one_line_error(*cli("reproduce", "pfa", "--out", tmp_path, "--dry-run", *args)[::2])
    assert message in line
    assert not any(tmp_path.iterdir())


def test_out_and_scale_are_required(tmp_path):
    code, _, err = cli("reproduce", "robust-hdp", "--out", tmp_path)
    assert code == 2 and "--scale" in err


def test_noise_table_flag_reports_a_selection_that_matches_nothing_in_one_line(tmp_path):
    code, _, err = cli("reproduce", "robust-hdp", "--scale", "ci", "--noise-table", "--out", tmp_path / "nt",
                       "--settings", "no-such-setting")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no-such-setting" in err
    assert not (tmp_path / "nt").exists()

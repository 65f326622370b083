"""`dpfl reproduce mpdp` in pieces: --settings, --only-seeds, --dry-run and --tables-only, and the run directories'
config check (one --out, one experiment: a directory of another config is refused before anything runs)."""

import csv
import json

import pytest

from cli_runner import cli

# one setting, one method, one round, no inversion: about 5 s per run
TINY = ("--scale", "ci", "--settings", "ci_digits_mlp", "--methods", "fedavg", "--inversion-steps", 0, "--seeds", 2)


def _rows(out):
    return list(csv.DictReader((out / "results.csv").open()))


def test_seeds_run_in_pieces_and_the_tables_collect_every_finished_one(tmp_path):
    out = tmp_path / "mpdp"
    code, stdout, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--dry-run")
    assert code == 0, err
    assert "mpdp, scale ci: 2 jobs" in stdout and stdout.count(": new") == 2 and not (out / "runs").exists()

    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 1)
    assert code == 0, err
    assert [(r["setting"], r["method"], r["seed"]) for r in _rows(out)] == [("ci_digits_mlp", "fedavg", "1")]
    assert "1 of the grid's 2 runs" in (out / "results.md").read_text()
    saved = (out / "runs" / "ci_digits_mlp" / "fedavg-seed1" / "config.yaml").read_text()
    assert "method: fedavg" in saved and "rounds: 1" in saved and "seed: 1" in saved

    code, stdout, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--dry-run")
    assert code == 0, err
    assert "fedavg seed 0: new" in stdout and "fedavg seed 1: finished" in stdout

    summary = out / "runs" / "ci_digits_mlp" / "fedavg-seed1" / "summary.json"
    mtime = summary.stat().st_mtime
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 0)
    assert code == 0, err
    assert summary.stat().st_mtime == mtime  # seed 1 collected, not run again
    assert sorted(r["seed"] for r in _rows(out)) == ["0", "1"]
    assert "of the grid's" not in (out / "results.md").read_text()

    (out / "results.csv").unlink()
    code, stdout, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--tables-only")
    assert code == 0, err
    assert sorted(r["seed"] for r in _rows(out)) == ["0", "1"] and summary.stat().st_mtime == mtime


def test_a_directory_of_another_config_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "mpdp"
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 1)
    assert code == 0, err
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 2, "--out", out)
    assert code == 2 and "holds another run" in err and "rounds: 1" in err, err
    assert not (out / "runs" / "ci_digits_mlp" / "fedavg-seed0").exists()  # seed 0 (new) did not run either
    code, _, err = cli("reproduce", "mpdp", *TINY[:-4], "--inversion-steps", 3, "--seeds", 2, "--rounds", 1,
                       "--out", out)
    assert code == 2 and "inversion_steps 0, this job 3" in err, err

    legacy = out / "runs" / "ci_digits_mlp" / "fedavg-seed1"
    (legacy / "config.yaml").unlink()  # as a run made before dpfl saved the config
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--tables-only")
    assert code == 2 and "cannot be checked" in err, err


def test_an_unfinished_run_is_run_again_from_the_start(tmp_path):
    out = tmp_path / "mpdp"
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 0)
    assert code == 0, err
    run = out / "runs" / "ci_digits_mlp" / "fedavg-seed0"
    first = json.loads((run / "summary.json").read_text())
    (run / "summary.json").unlink()  # killed before its last write
    code, stdout, _ = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 0, "--dry-run")
    assert "fedavg seed 0: partial: runs again from the start" in stdout
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 0)
    assert code == 0, err
    again = json.loads((run / "summary.json").read_text())
    assert again["accuracy"] == first["accuracy"] and again["seed"] == first["seed"] == 0


def test_bad_selections_are_one_line(tmp_path, monkeypatch):
    code, _, err = cli("reproduce", "mpdp", *TINY, "--out", tmp_path, "--only-seeds", 5)
    assert code == 2 and "seed 5 is not among the planned seeds 0..1" in err
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "no-data"))  # no CIFAR files: every full setting is skipped
    code, _, err = cli("reproduce", "mpdp", "--scale", "full", "--out", tmp_path, "--only-seeds", 0)
    assert code == 2 and "plans no run" in err, err
    monkeypatch.undo()
    code, _, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", tmp_path, "--settings", "nope*")
    assert code == 2 and "matches no setting" in err and "ci_digits_k100" in err
    code, _, err = cli("reproduce", "mpdp", *TINY, "--out", tmp_path, "--tables-only")
    assert code == 2 and "no finished run" in err
    code, _, err = cli("reproduce", "mpdp", *TINY, "--out", tmp_path, "--tables-only", "--dry-run")
    assert code == 2 and "choose one" in err
    code, _, err = cli("reproduce", "mpdp", *TINY, "--out", tmp_path, "--tables-only", "--only-seeds", 0)
    assert code == 2 and "--tables-only trains none" in err


def test_an_unverified_epsilon_keeps_its_stamp_in_the_tables():
    from dpfl.reproduce.mpdp import COLUMNS, markdown

    assert "epsilon_label" in COLUMNS  # the CSV carries each run's label, stamps included
    stamp = "UNVERIFIED: Theorem 11 conditions violated (K = 100 too small)"
    row = {"status": "ok", "method": "mpdp", "accuracy": 0.5, "round_seconds": 1.0, "server_seconds": 0.1,
           "client_seconds": 0.01, "upload_bytes": 100, "violation_rate": 0.0, "epsilon_composed": 30.0}
    rows = [{**row, "setting": "paper", "epsilon_label": f"NOMINAL (idealised model); {stamp}"},
            {**row, "setting": "verified", "epsilon_label": "NOMINAL (idealised model)"}]
    md = markdown("full", rows, {}, "", "")
    paper, verified = md.split("## paper")[1].split("## verified")
    assert paper.startswith(" (epsilons UNVERIFIED)") and f"**{stamp}**" in paper
    assert "UNVERIFIED" not in verified


@pytest.mark.integration  # starts two worker processes (~17 s)
def test_workers_on_one_seed_keep_the_other_seeds_finished_rows_in_grid_order(tmp_path):
    """--only-seeds 1 --workers 2 after seed 0 ran alone: seed 1 runs in the workers, seed 0 (not selected) is read
    back, and the tables list both in the grid's order, seed 0 first."""
    out = tmp_path / "mpdp"
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 0)
    assert code == 0, err
    summary = out / "runs" / "ci_digits_mlp" / "fedavg-seed0" / "summary.json"
    mtime = summary.stat().st_mtime
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 1, "--workers", 2)
    assert code == 0, err
    assert [(r["seed"], r["status"]) for r in _rows(out)] == [("0", "ok"), ("1", "ok")]
    assert summary.stat().st_mtime == mtime  # seed 0 read back, not run again
    assert "of the grid's" not in (out / "results.md").read_text()

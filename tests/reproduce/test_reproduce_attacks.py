"""`dpfl reproduce attacks`: every setting runs its training, inversion, membership inference and audit, results.csv
has the issue's columns, a re-run skips finished settings, bad input is one line."""

import csv

import pytest
from cli_runner import cli

from dpfl.attacks import probe
from dpfl.reproduce import attacks
from dpfl.reproduce.jobs import GridError


@pytest.fixture
def small(monkeypatch):  # the ci scale's machinery with fewer canaries and attack steps (the real one: ~10 min)
    monkeypatch.setitem(attacks.SCALES, "ci", {**attacks.SCALES["ci"], "canaries": 20, "inversion_steps": 5})
    monkeypatch.setattr(probe, "EXTRACTOR_EPOCHS", 1)


def test_reproduce_attacks_ci_smoke(tmp_path, small):
    out = tmp_path / "attacks"
    csv_path, md_path, rows = attacks.run_study("ci", out, rounds=1)
    assert all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    table = list(csv.DictReader(csv_path.open()))
    assert {"method", "epsilon", "psnr", "mia_asr", "mia_auc", "tpr_at_1fpr", "eps_lower", "eps_reported"} <= set(table[0])
    assert [(r["method"], r["epsilon"]) for r in table] == [("fedavg", "")] + [
        (m, e) for m in ("dpsgd", "client") for e in ("1.0", "3.0", "8.0")]
    assert {r["audit_unit"] for r in table} == {"client", "sample"}
    assert all(float(r["eps_reported"]) <= float(r["epsilon"]) + 1e-6 for r in table if r["method"] != "fedavg")
    assert (out / "runs" / "attacks_ci_fmnist-fedavg" / "inversion.png").is_file()
    stamp = (out / "runs" / "attacks_ci_fmnist-client-eps1" / "attacks.json").stat().st_mtime
    attacks.run_study("ci", out, rounds=1)
    assert (out / "runs" / "attacks_ci_fmnist-client-eps1" / "attacks.json").stat().st_mtime == stamp
    with pytest.raises(GridError, match="holds another run.*rounds: 1"):  # other --rounds: not mixed in
        attacks.run_study("ci", out, rounds=2)
    assert "ε lower" in md_path.read_text()
    assert "(7 settings). Written by: dpfl " in md_path.read_text()  # each setting's environment in its attacks.json


def test_reproduce_attacks_bad_scale_is_one_line(tmp_path):
    code, _, err = cli("reproduce", "attacks", "--scale", "huge", "--out", tmp_path)
    assert code == 2 and "--scale must be ci" in err

"""Own data from the CLI as a user meets it: the shipped hospitals example (configs/hospitals) inspected and run as is,
and a broken silo reported in one line naming the file and the line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from cli_runner import cli

EXAMPLE = Path(__file__).resolve().parents[1] / "configs" / "hospitals"
CONFIG = EXAMPLE / "hospitals.yaml"


def test_data_inspect_prints_each_hospitals_records_and_label_counts():
    code, out, err = cli("data", "inspect", CONFIG, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["dataset"] == "files" and report["n_classes"] == 2 and report["record_shape"] == [5]
    rows = report["per_client"]
    assert [r["name"] for r in rows] == ["hospital_a", "hospital_b", "hospital_c"]
    for r in rows:  # every record of the file, as given
        lines = (EXAMPLE / f"{r['name']}.csv").read_text(encoding="utf-8").splitlines()
        assert r["train"] == len(lines) - 1 and sum(r["labels"]) == r["train"] and len(r["labels"]) == 2
    assert report["test"]["records"] == 300
    code, out, _ = cli("data", "inspect", CONFIG)
    assert code == 0 and "hospital_b" in out and "global test" in out


def test_a_held_out_share_of_each_hospital_instead_of_a_test_file():
    code, out, err = cli("data", "inspect", CONFIG, "--json", "--set", "data.test=null",
                         "--set", "data.client_test_fraction=0.2")
    assert code == 0, err
    report = json.loads(out)
    assert [(r["train"], r["test"]) for r in report["per_client"]] == [(320, 80), (200, 50), (120, 30)]
    assert report["test"]["records"] == 160


def test_a_broken_silo_is_one_line_naming_the_file_and_the_line(tmp_path):
    copy = tmp_path / "hospitals"
    shutil.copytree(EXAMPLE, copy)
    lines = (copy / "hospital_b.csv").read_text(encoding="utf-8").splitlines()
    fields = lines[4].split(",")
    fields[-1] = "2"  # a label outside the 2 declared classes
    lines[4] = ",".join(fields)
    (copy / "hospital_b.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for args in (("data", "inspect", copy / "hospitals.yaml"),
                 ("run", copy / "hospitals.yaml", "--out", tmp_path / "run")):
        code, _, err = cli(*args)
        assert code == 2 and err.count("\n") == 1, err
        assert "hospital_b.csv, line 5, column 'readmitted': label 2 is outside the 2 declared classes" in err
    assert not (tmp_path / "run").exists()
    code, _, err = cli("data", "inspect", copy / "hospitals.yaml", "--set", "data.scaling=fit")
    assert code == 2 and "scaling fitted on a client's own records" in err


def test_dpfl_run_on_the_example_gives_each_hospital_its_budget(tmp_path):
    out = tmp_path / "run"
    code, stdout, err = cli("run", CONFIG, "--out", out, "--set", "training.rounds=2")
    assert code == 0, err
    privacy = json.loads((out / "privacy.json").read_text(encoding="utf-8"))
    rows = privacy["clients"]
    assert [r["epsilon_budget"] for r in rows] == [1, 3, 8]
    assert [r["records"] for r in rows] == [400, 250, 150]
    for r in rows:
        assert 0 < r["epsilon_guarantee"] <= r["epsilon_budget"] * (1 + 1e-6)
    assert privacy["meets_budgets"]
    saved = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))["data"]
    assert saved["dataset"] == "files" and "partition" not in saved and "alpha" not in saved
    assert [Path(p).name for p in saved["silos"]] == ["hospital_a.csv", "hospital_b.csv", "hospital_c.csv"]
    assert "report.md" in {p.name for p in out.iterdir()}

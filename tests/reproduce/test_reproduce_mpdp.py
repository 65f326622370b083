"""`dpfl reproduce mpdp`: the grid runs, writes results.csv with the issue's columns, lists what it skipped, and
resumes without re-running finished jobs."""

import csv

from cli_runner import cli


def test_reproduce_mpdp_ci_smoke(tmp_path):
    out = tmp_path / "mpdp"
    code, stdout, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", out, "--seeds", 1, "--rounds", 2,
                            "--methods", "mpdp,mp_cdp,fedavg")
    assert code == 0, err
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {"setting", "method", "seed", "epsilon", "accuracy", "round_seconds", "server_seconds",
            "client_seconds"} <= set(rows[0])
    settings = {r["setting"] for r in rows}
    assert {"ci_digits_mlp-eps3", "ci_digits_mlp-eps30", "ci_digits_mlp-eps300", "ci_digits_k100"} <= settings
    assert all(r["status"] == "ok" for r in rows)
    assert {r["epsilon"] for r in rows if r["method"] == "fedavg"} == {""}
    md = (out / "results.md").read_text()
    assert "ci_digits_cnn-eps3" in settings and "NOMINAL" in md
    mtime = (out / "runs" / "ci_digits_k100" / "mpdp-seed0" / "summary.json").stat().st_mtime
    code, _, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", out, "--seeds", 1, "--rounds", 2,
                       "--methods", "mpdp,mp_cdp,fedavg")
    assert code == 0, err
    assert (out / "runs" / "ci_digits_k100" / "mpdp-seed0" / "summary.json").stat().st_mtime == mtime


def test_reproduce_mpdp_bad_input_is_one_line(tmp_path):
    code, _, err = cli("reproduce", "mpdp", "--scale", "huge", "--out", tmp_path)
    assert code == 2 and "--scale must be" in err
    code, _, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", tmp_path, "--methods", "magic")
    assert code == 2 and "unknown method" in err

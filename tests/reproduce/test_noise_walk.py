"""scripts/noise_walk.py: the global model's norm round by round beside the walk its logged DP noise gives, on real
ci-scale Robust-HDP runs (6 clients, the thesis CNN, budgets 0.2-1.5 spent over 3 rounds: the noise dominates)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from script_module import load_script

from cli_runner import cli
from dpfl.experiment.build import build_run
from dpfl.experiment.config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "hdp" / "rhdp" / "ci_fmnist.yaml"

# Every test reads two full ci-scale CNN runs (~40 s, once per xdist worker that collects one): the integration tier.
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def script():
    return load_script("noise_walk")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("walk")
    for name in ("weiavg", "pfa"):
        assert cli("run", CONFIG, "--out", out / name, "--set", f"algorithm={{name: {name}}}")[0] == 0
    return out


@pytest.mark.parametrize(("method", "key"), [("weiavg", "noise_stat_empirical"), ("pfa", "pfa_noise_passthrough")])
def test_the_walk_sums_the_runs_own_logged_noise_and_the_norm_follows_it(script, runs, method, key):
    result = script.walk(runs / method)
    rows = [json.loads(line) for line in (runs / method / "metrics.jsonl").read_text().splitlines()]
    run = build_run(load_config(runs / method / "config.yaml"))
    w0 = sum(float(t.detach().double().pow(2).sum()) for t in run.model.parameters())
    p = sum(t.numel() for t in run.model.parameters())
    assert result["stat_key"] == key and [r["round"] for r in result["rounds"]] == [1, 2, 3]
    assert result["initial_norm"] == pytest.approx(math.sqrt(w0))
    for i, r in enumerate(result["rounds"]):
        total = sum(row[key] for row in rows[: i + 1])
        assert r["walk"] == pytest.approx(math.sqrt(w0 + p * 0.05 ** 2 * total), rel=1e-12)
        assert r["param_norm"] == rows[i]["param_norm"]
        # seeded runs: after at most 3 rounds of clipped steps the noise sets the norm (both within 0.4% here)
        assert r["ratio"] == pytest.approx(1.0, abs=0.02)


def test_weiavgs_weights_grow_by_what_its_noise_adds(script, runs):
    """WeiAvg keeps far more noise than PFA's public group at ci (8.7 against 4.6 after 3 rounds, from 4.4): its
    squared norm grows by what the walk adds, within 5% (the signal's share of the growth)."""
    weiavg, pfa = script.walk(runs / "weiavg"), script.walk(runs / "pfa")
    w0 = weiavg["initial_norm"] ** 2
    last = weiavg["rounds"][-1]
    assert last["walk"] > 1.5 * weiavg["initial_norm"] and last["walk"] > 1.5 * pfa["rounds"][-1]["walk"]
    assert last["param_norm"] ** 2 - w0 == pytest.approx(last["walk"] ** 2 - w0, rel=0.05)


def test_refuses_a_run_without_the_noise_statistics(script, runs, tmp_path):
    rows = [json.loads(line) for line in (runs / "weiavg" / "metrics.jsonl").read_text().splitlines()]
    (tmp_path / "config.yaml").write_text((runs / "weiavg" / "config.yaml").read_text())
    for i, key in enumerate(("noise_stat_empirical", "param_norm")):  # as a non-private or an older run logs them
        trimmed = [dict(r) for r in rows]
        trimmed[i].pop(key)
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trimmed))
        with pytest.raises(SystemExit, match="needs param_norm and one of noise_stat_empirical, pfa_noise_passthrough"):
            script.walk(tmp_path)
    with pytest.raises(SystemExit, match="nothing-here: no such directory"):
        script.walk(runs / "nothing-here")
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit, match="no metrics.jsonl rows"):
        script.walk(tmp_path)


def test_main_prints_the_table_json_and_csv(script, runs, capsys):
    script.main([str(runs / "weiavg"), str(runs / "pfa"), "--every", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| run | stat | round |")
    assert [line.split(" | ")[2] for line in lines[2:]] == ["1", "2", "3", "1", "2", "3"]  # 1, every 2nd, the last
    script.main([str(runs / "pfa"), "--json"])
    (row,) = json.loads(capsys.readouterr().out)
    assert row["stat_key"] == "pfa_noise_passthrough" and len(row["rounds"]) == 3
    script.main([str(runs / "weiavg"), str(runs / "pfa"), "--csv"])
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["stat_key"], r["round"]) for r in table] == [("noise_stat_empirical", str(i)) for i in (1, 2, 3)] + [
        ("pfa_noise_passthrough", str(i)) for i in (1, 2, 3)]
    logged = [json.loads(line) for line in (runs / "pfa" / "metrics.jsonl").read_text().splitlines()]
    assert [float(r["test_accuracy"]) for r in table[3:]] == [r["test_accuracy"] for r in logged]  # evaluated rounds
    assert float(table[-1]["walk"]) == row["rounds"][-1]["walk"]
    with pytest.raises(SystemExit):
        script.main([str(runs / "pfa"), "--every", "0"])
    with pytest.raises(SystemExit):
        script.main([str(runs / "pfa"), "--json", "--csv"])

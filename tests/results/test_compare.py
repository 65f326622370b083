from __future__ import annotations

import json

import matplotlib.image as mpimg
import pytest

from dpfl.results import compare_runs, format_table, read_metrics
from dpfl.results.compare import table_columns

from .fakes import make_accounted_run, make_unaccounted_run, spent_epsilon


def test_compare_two_runs(tmp_path):
    a = make_accounted_run(tmp_path / "runs" / "a")
    b = make_unaccounted_run(tmp_path / "runs" / "b")
    rows, plot = compare_runs([a, b], out=tmp_path / "cmp")
    assert [r["name"] for r in rows] == ["dp-fedavg-test", "udp-unaccounted"]
    assert rows[0]["algorithm"] == "dp_fedavg_local" and rows[0]["unit"] == "sample"
    assert rows[0]["epsilon_max"] == spent_epsilon(9, 5)
    assert rows[1]["epsilon_max"] is None
    assert rows[0]["rounds_done"] == 5 and rows[0]["stop_reason"] == "rounds"
    assert plot == tmp_path / "cmp" / "compare_accuracy.png"
    assert mpimg.imread(plot).shape[:2] == (500, 800)

    table = format_table(rows).splitlines()
    assert len(table) == 4
    assert table[0].split() == ["name", "algorithm", "unit", "final_accuracy", "best_accuracy", "rounds_done",
                                "stop_reason", "epsilon_max"]
    assert f"{spent_epsilon(9, 5):.3f}" in table[2] and table[3].rstrip().endswith("-")


def test_compare_defaults_to_the_first_runs_parent_and_incomplete_runs(tmp_path):
    a = make_accounted_run(tmp_path / "runs" / "a", complete=False)
    b = make_accounted_run(tmp_path / "runs" / "b")  # same name: the legend tells them apart
    rows, plot = compare_runs([a, b], out=None)
    assert plot == tmp_path / "runs" / "compare_accuracy.png" and plot.is_file()
    assert rows[0]["stop_reason"] == "incomplete" and rows[0]["complete"] is False
    assert rows[0]["rounds_done"] == 5 and rows[0]["final_accuracy"] == rows[1]["final_accuracy"]


def test_labels_name_the_runs_in_the_rows_and_the_legend(tmp_path, monkeypatch):
    a = make_accounted_run(tmp_path / "runs" / "a")
    b = make_unaccounted_run(tmp_path / "runs" / "b")
    seen = {}

    def spy(runs, path, *, title=None):
        seen.update(names=list(runs), title=title)
        return None

    monkeypatch.setattr("dpfl.results.compare.plot_compare", spy)
    rows, plot = compare_runs([a, b], out=tmp_path / "cmp", labels=["clip only", "sigma 0.01"], title="T = 600")
    assert [r["label"] for r in rows] == ["clip only", "sigma 0.01"] and rows[0]["name"] == "dp-fedavg-test"
    assert seen == {"names": ["clip only", "sigma 0.01"], "title": "T = 600"} and plot is None
    assert format_table(rows, ["label", "name"]).splitlines()[2].split()[:3] == ["clip", "only", "dp-fedavg-test"]
    twin = make_accounted_run(tmp_path / "runs" / "twin")  # without labels: a shared name gets its directory
    compare_runs([a, twin, b], out=tmp_path / "cmp")
    assert seen["names"] == ["dp-fedavg-test (a)", "dp-fedavg-test (twin)", "udp-unaccounted"]
    for bad, why in ((["one"], "1 label"), (["x", "x"], "distinct"), (["x", " "], "non-empty")):
        with pytest.raises(ValueError, match=why):
            compare_runs([a, b], out=tmp_path / "cmp", labels=bad)


def test_a_run_with_personal_models_is_plotted_and_tabled_by_its_personal_accuracy(tmp_path, monkeypatch):
    # a clustered run: the server's model (test_accuracy) near chance, its clients' own models (acc_personal) not
    personal = make_accounted_run(tmp_path / "runs" / "clustered")
    rows = [json.loads(line) for line in (personal / "metrics.jsonl").read_text().splitlines()]
    for i, r in enumerate(rows):
        r.update(test_accuracy=0.1, acc_personal=0.5 + 0.1 * i, acc_personal_clients=4)
    (personal / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plain = make_accounted_run(tmp_path / "runs" / "plain")
    seen = {}

    def spy(runs, path, *, title=None):
        seen.update(runs=runs, title=title)
        return None

    monkeypatch.setattr("dpfl.results.compare.plot_compare", spy)
    table, _ = compare_runs([personal, plain], out=tmp_path / "cmp", labels=["clustered", "plain"])
    assert [r["personal_accuracy"] for r in table] == [rows[-1]["acc_personal"], None]
    assert [r["test_accuracy"] for r in seen["runs"]["clustered"]] == [r["acc_personal"] for r in rows]
    assert seen["runs"]["plain"] == read_metrics(plain)  # a run without personal models: its own rows
    assert seen["title"] == "Accuracy per round (2 runs, personal where a method has it)"
    assert table_columns(table).index("personal_accuracy") == table_columns(table).index("best_accuracy") + 1
    assert "personal_accuracy" not in table_columns(table[1:])

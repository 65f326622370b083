from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpfl.results import (
    RunDirError,
    append_jsonl,
    as_float,
    read_config_text,
    read_metrics,
    read_privacy,
    read_summary,
    truncate_jsonl,
    write_json_atomic,
)

from .fakes import make_accounted_run, spent_epsilon


def test_readers_return_the_files(tmp_path):
    run = make_accounted_run(tmp_path / "run")
    metrics = read_metrics(run)
    assert [m["round"] for m in metrics] == [1, 2, 3, 4, 5]
    assert metrics[2]["epsilon"][4] == spent_epsilon(4, 3)
    privacy = read_privacy(run)
    assert privacy["accounted"] is True and len(privacy["clients"]) == 10
    assert read_summary(run)["rounds_done"] == 5
    assert read_config_text(run).startswith("name: dp-fedavg-test")


def test_summary_absent_means_none(tmp_path):
    run = make_accounted_run(tmp_path / "run", complete=False)
    assert read_summary(run) is None


@pytest.mark.parametrize("kind", ["empty", "missing", "file"])
def test_not_a_run_directory(tmp_path, kind):
    target = tmp_path / "x"
    if kind == "empty":
        target.mkdir()
    elif kind == "file":
        target.write_text("hello")
    for reader in (read_metrics, read_privacy, read_summary, read_config_text):
        with pytest.raises(RunDirError) as err:
            reader(target)
        assert str(target) in str(err.value)
        assert isinstance(err.value, ValueError)


def test_missing_and_corrupt_files_are_named(tmp_path):
    run = make_accounted_run(tmp_path / "run")
    (run / "privacy.json").unlink()
    with pytest.raises(RunDirError, match="privacy.json"):
        read_privacy(run)
    (run / "summary.json").write_text("{not json")
    with pytest.raises(RunDirError, match="summary.json.*corrupt"):
        read_summary(run)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[1] = "garbage\n"
    (run / "metrics.jsonl").write_text("".join(lines))
    with pytest.raises(RunDirError, match=r"metrics.jsonl.*line 2"):
        read_metrics(run)


def test_read_metrics_ignores_a_trailing_partial_line(tmp_path):
    run = make_accounted_run(tmp_path / "run", complete=False)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"round": 6, "test_acc')
    assert len(read_metrics(run)) == 5


def test_append_and_truncate_keep_exactly_the_first_rows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"round": r, "epsilon": [0.1 * r, float(np.float32(0.3))], "note": "a\nb"} for r in range(1, 6)]
    for row in rows:
        append_jsonl(path, row)
    assert path.read_text().count("\n") == 5  # the newline inside a string is escaped
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows

    with open(path, "a") as f:
        f.write('{"round": 6, "epsil')  # a writer killed mid-append
    with pytest.raises(ValueError, match="partial line"):
        append_jsonl(path, {"round": 6})
    truncate_jsonl(path, 3)
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:3]
    assert path.read_text().endswith("\n")
    append_jsonl(path, rows[3])
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:4]


def test_truncate_drops_only_the_partial_line(tmp_path):
    path = tmp_path / "m.jsonl"
    for r in range(1, 4):
        append_jsonl(path, {"round": r})
    complete = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"round": 4')
    truncate_jsonl(path, 3)
    assert path.read_bytes() == complete
    with pytest.raises(ValueError, match="only 3 complete lines"):
        truncate_jsonl(path, 4)
    truncate_jsonl(path, 0)
    assert path.read_bytes() == b""
    truncate_jsonl(tmp_path / "new.jsonl", 0)
    assert (tmp_path / "new.jsonl").read_bytes() == b""


def test_write_json_atomic_leaves_no_temp_files(tmp_path):
    path = tmp_path / "sub" / "privacy.json"
    write_json_atomic(path, {"a": 1, "eps": np.float64(0.5), "v": np.arange(3)})
    write_json_atomic(path, {"a": 2, "inf": math.inf})
    assert sorted(p.name for p in path.parent.iterdir()) == ["privacy.json"]
    data = json.loads(path.read_text())
    assert data["a"] == 2 and math.isinf(as_float(data["inf"]))
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text())["a"] == 2  # the old file is intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["privacy.json"]


def test_as_float_reads_the_ledger_encoding():
    assert as_float(None) is None
    assert as_float(2) == 2.0
    assert math.isinf(as_float("inf")) and math.isnan(as_float("nan"))
    with pytest.raises(ValueError):
        as_float("abc")


def test_last_number_skips_rounds_without_a_number():
    from dpfl.results.run_files import last_number

    rows = [{"round": 1, "acc": 0.5}, {"round": 2, "acc": 0.75}, {"round": 3}, {"round": 4, "acc": None},
            {"round": 5, "acc": float("nan")}, {"round": 6, "acc": "n/a"}]
    assert last_number(rows, "acc") == 0.75
    assert last_number(rows + [{"acc": "inf"}], "acc") == math.inf  # the run files' encoding of infinity counts
    assert last_number(rows, "missing") is None and last_number([], "acc") is None


def test_a_config_cut_at_any_line_boundary_is_truncated_and_a_whole_one_is_not(tmp_path):
    """A cut at a line boundary leaves valid YAML with fewer sections: dpfl's end line tells it from a whole file
    (a run directory written before the header existed keeps the older check, a final newline)."""
    from dpfl.experiment.build import build_demo_config
    from dpfl.experiment.config import config_to_yaml

    run = make_accounted_run(tmp_path / "run")
    text = config_to_yaml(build_demo_config())
    (run / "config.yaml").write_text(text)
    assert read_config_text(run) == text
    lines = text.splitlines(keepends=True)
    for cut in range(2, len(lines)):
        (run / "config.yaml").write_text("".join(lines[:cut]))
        with pytest.raises(RunDirError, match="truncated"):
            read_config_text(run)

"""The outputs of an f-DP report (results.fdp_output): CSV columns, strict JSON, files, the terminal table."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
from rich.console import Console

from dpfl.privacy.fdp import COMPOSITION, PAPER_LABEL, FdpCurve, FdpReport, fdp_report
from dpfl.results.fdp_output import (
    FDP_FILES,
    FDP_FORMATS,
    FROM_RUN_BASIS,
    fdp_column,
    fdp_csv,
    fdp_json_text,
    print_fdp,
    print_fdp_table,
    write_fdp_files,
)

SETTING = dict(algo="fedavg", schedule="constant", eta=0.1, K=5, V=1.0, sigma=1.0, m=10, rounds=[1, 10, 100])


@pytest.fixture(scope="module")
def report() -> FdpReport:
    return fdp_report(**SETTING, deltas=(1e-5, 1e-3))


@pytest.fixture(scope="module")
def with_paper() -> FdpReport:
    return fdp_report(**SETTING, L=2.0, paper="printed")


def console(width: int = 200) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, soft_wrap=True), buf


def test_csv_header_names_every_curve_and_delta_and_rows_read_back_exactly(report):
    rows = list(csv.reader(io.StringIO(fdp_csv(report))))
    assert rows[0] == ["T", "mu[composition]", "eps[composition,delta=1e-05]", "eps[composition,delta=0.001]"]
    assert [r[0] for r in rows[1:]] == ["1", "10", "100"]
    c = report.curve(COMPOSITION)
    for i, r in enumerate(rows[1:]):
        assert [float(x) for x in r[1:]] == [c.mu[i], c.eps[1e-5][i], c.eps[1e-3][i]]  # repr: exact


def test_csv_labels_the_paper_claimed_curve_in_full(with_paper):
    header = next(csv.reader(io.StringIO(fdp_csv(with_paper))))
    paper = next(c for c in with_paper.curves if not c.is_guarantee)
    assert fdp_column(paper) == paper.label and PAPER_LABEL in paper.label
    assert f"mu[{paper.label}]" in header and f"eps[{paper.label},delta=1e-05]" in header
    assert all(fdp_column(c) == c.name for c in with_paper.curves if c.is_guarantee)


def test_json_is_strict_with_non_finite_values_as_strings(report):
    assert json.loads(fdp_json_text(report)) == json.loads(json.dumps(report.to_dict()))
    inf = FdpReport(view="upload", release="transcript", rounds=np.array([1]), deltas=(1e-5,),
                    curves=[FdpCurve(COMPOSITION, "composition (guarantee)", True, np.array([math.inf]),
                                     {1e-5: np.array([math.nan])})],
                    headline=COMPOSITION, params=dict(report.params))
    text = fdp_json_text(inf)
    assert "Infinity" not in text and "NaN" not in text and text.endswith("}\n")
    data = json.loads(text)
    assert data["curves"][0]["mu"] == ["inf"] and data["headline"]["epsilon"] == {"1e-05": "nan"}


def test_write_fdp_files_writes_csv_json_and_plot(report, tmp_path):
    paths = write_fdp_files(report, tmp_path / "out")
    assert [p.name for p in paths] == list(FDP_FILES) and all(p.is_file() for p in paths)
    assert paths[0].read_text() == fdp_csv(report) and paths[1].read_text() == fdp_json_text(report)


def test_print_fdp_csv_and_json_go_verbatim_to_the_console_file(report, tmp_path):
    con, buf = console()
    print_fdp(report, "csv", con)
    assert buf.getvalue() == fdp_csv(report)
    con, buf = console()
    print_fdp(report, "json", con, run_dir=tmp_path)
    assert buf.getvalue().count("\n") == 1
    assert json.loads(buf.getvalue()) == {**json.loads(fdp_json_text(report)), "run": str(tmp_path),
                                          "basis": FROM_RUN_BASIS}
    con, buf = console()
    print_fdp(report, "csv", con, run_dir=tmp_path)
    assert buf.getvalue().startswith(f"# run {tmp_path}: computed from the run's config: its planned cohort")
    with pytest.raises(ValueError, match="format must be one of table, csv, json"):
        print_fdp(report, "yaml", con)
    assert FDP_FORMATS == ("table", "csv", "json")


def test_table_states_the_setting_before_numbers_and_headers_do_not_wrap(with_paper, tmp_path):
    con, buf = console(width=40)  # narrower than the table: the table renders wider rather than wrap headers
    print_fdp(with_paper, "table", con, view_requested="auto", written=[tmp_path / "a.csv"], run_dir=tmp_path)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith(f"from the config of run {tmp_path} ")
    assert lines[1] == "f-DP accounting of noisy fedavg (Gaussian DP, record-level; dpfl privacy fdp)"
    assert lines[2].startswith("view:    upload (resolved from --view auto): the server sees every noisy upload")
    assert "L 2 (ASSUMPTION)" in buf.getvalue() and "paper variant printed" in buf.getvalue()
    assert any(PAPER_LABEL in line for line in lines)  # whole, on one line
    first_number = next(i for i, line in enumerate(lines) if line.startswith("│"))
    assert first_number > next(i for i, line in enumerate(lines) if line.startswith("assumptions:"))
    head = with_paper.curve(with_paper.headline)
    assert f"headline guarantee: {with_paper.headline} at T = 100: mu = {head.mu[-1]:.6g}, " in buf.getvalue()
    assert "they are not privacy guarantees" in lines[-2] and lines[-1] == f"files: {tmp_path / 'a.csv'}"


def test_table_without_a_requested_view_shows_the_report_view(report):
    con, buf = console()
    print_fdp_table(report, con)
    text = buf.getvalue()
    assert "\nview:    upload: " in text and "resolved" not in text and "NOT a guarantee" not in text
    assert "ε(δ=0.001)" in text and "warnings:" in text

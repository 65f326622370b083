"""One way to print an epsilon: results.formatting.format_epsilon, and every place that prints one uses it."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from dpfl.results.compare import compare_runs, format_table
from dpfl.results.formatting import format_epsilon
from dpfl.results.outcome import print_outcome
from dpfl.results.report import write_report
from .fakes import make_accounted_run


@pytest.mark.parametrize("value, text", [
    (1.23456, "1.235"), (0.0, "0.000"), (24933.0, "24933.000"), (999_999.4, "999999.400"),
    (1e6, "1e+06"), (2.4e20, "2.4e+20"), (240000000093439033344.0, "2.4e+20"), (2.191e10, "2.191e+10"),
    (float("inf"), "inf"), (float("-inf"), "-inf"), (float("nan"), "nan"),
])
def test_three_decimals_below_a_million_scientific_from_there(value, text):
    assert format_epsilon(value) == text


def test_an_unprivate_runs_epsilon_prints_in_scientific_notation_everywhere(tmp_path):
    """A clip-only run (σ = 1e-9) spends ε ≈ 2.4e20: 21 digits that a narrow terminal table cut to a prefix."""
    run = make_accounted_run(tmp_path / "run", n_clients=2)
    huge = 240000000093439033344.0
    privacy = json.loads((run / "privacy.json").read_text())
    for c in privacy["clients"]:
        c["epsilon_spent"] = huge
    (run / "privacy.json").write_text(json.dumps(privacy))
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "epsilon_max": huge}))

    buf = io.StringIO()
    print_outcome(run, Console(file=buf, width=200, soft_wrap=True))
    report = write_report(run).read_text()
    table = format_table(compare_runs([run], out=tmp_path / "cmp")[0])
    for text in (buf.getvalue(), report, table):
        assert "2.4e+20" in text
        assert not re.search(r"\d{10}", text), text  # no run of ten digits anywhere


@pytest.mark.parametrize("row, shown", [
    ({"test_accuracy": 0.2, "acc_personal": 0.776}, "personal accuracy 0.776"),  # the method's metric wins
    ({"test_accuracy": 0.8123}, "accuracy 0.812"),
    ({"test_accuracy": None, "acc_personal": None}, "accuracy -"),  # a round without evaluation
])
def test_progress_lines_show_the_personal_accuracy_of_methods_that_have_one(row, shown):
    from dpfl.results.formatting import accuracy_words, round_accuracy

    assert accuracy_words(round_accuracy(row)) == shown

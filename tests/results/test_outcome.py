"""What a finished run prints (`dpfl run` / `dpfl demo`): results.outcome.print_outcome on hand-written run dirs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from dpfl.results.outcome import MAX_CLIENT_ROWS, print_outcome
from dpfl.results.run_files import RunDirError
from .fakes import budget, make_accounted_run, make_unaccounted_run, spent_epsilon


def render(run_dir: Path, summary=None) -> str:
    buf = io.StringIO()
    print_outcome(run_dir, Console(file=buf, width=200, soft_wrap=True), summary)
    return buf.getvalue()


def test_accounted_run_prints_summary_guarantee_and_one_row_per_client(tmp_path):
    run = make_accounted_run(tmp_path / "run", n_clients=4)
    text = render(run)
    lines = text.splitlines()
    assert lines[0] == ""  # a blank line separates the outcome from the progress bar
    assert lines[1] == "dp-fedavg-test: 5 rounds (stop: rounds), final accuracy 0.850, best 0.850"
    assert lines[2] == ("guarantee: sample-level DP against the server, which sees every individual upload; "
                        "DP-SGD (poisson sampling, per-sample clip 1.0); accountant rdp")
    header = next(line for line in lines if "budget ε" in line)
    assert [h.strip() for h in header.strip("┃│ ").replace("┃", "│").split("│")] == \
        ["client", "records", "budget ε", "δ", "noise z", "spent ε"]
    for c in range(4):
        row = next(line for line in lines if line.startswith("│") and line.strip("│ ").startswith(f"{c} "))
        cells = [x.strip() for x in row.strip("│").split("│")]
        assert cells == [str(c), str(100 + 10 * c), f"{budget(c):.3f}", "1e-05", f"{1.1 + 0.01 * c:.3f}",
                         f"{spent_epsilon(c, 5):.3f}"]
    assert "more clients" not in text and "f-DP" not in text and "privacy:" not in text
    assert lines[-1] == f"run directory: {run}  (report: {run / 'report.md'})"


def test_the_summary_given_is_printed_instead_of_summary_json(tmp_path):
    run = make_accounted_run(tmp_path / "run", n_clients=2)
    summary = {**json.loads((run / "summary.json").read_text()), "name": "from-execute", "final_accuracy": None}
    assert render(run, summary).splitlines()[1].startswith("from-execute: 5 rounds (stop: rounds), final accuracy -,")
    del summary["name"]
    assert render(run, summary).splitlines()[1].startswith("run: 5 rounds")  # the directory's name


def test_many_clients_are_cut_to_the_first_rows(tmp_path):
    run = make_accounted_run(tmp_path / "run", n_clients=MAX_CLIENT_ROWS + 7)
    text = render(run)
    assert "... 7 more clients in privacy.json" in text
    rows = [line for line in text.splitlines() if line.startswith("│")]
    assert len(rows) == MAX_CLIENT_ROWS


def test_fdp_headline_and_paper_claimed_curve_are_printed(tmp_path):
    run = make_accounted_run(tmp_path / "run", n_clients=2)
    privacy = json.loads((run / "privacy.json").read_text())
    privacy["fdp"] = {"view": "upload", "release": "transcript", "mu_max": 0.123456, "headline": "composition",
                      "epsilon_max": {"1e-05": 1.23456}, "clients": [{"client": 0}, {"client": 1}],
                      "paper_claimed": {"label": "paper-claimed (NOT a guarantee)", "mu": 0.0123456}}
    (run / "privacy.json").write_text(json.dumps(privacy))
    text = render(run)
    assert ("f-DP (upload view, release transcript): largest mu 0.1235, epsilon 1.235 at delta 1e-05 (bound: "
            "composition, exact GDP conversion)") in text
    assert "paper-claimed (NOT a guarantee): mu 0.01235" in text


def test_the_one_guarantee_is_printed_with_why_other_epsilons_differ(tmp_path):
    run = make_accounted_run(tmp_path / "run", n_clients=2)
    privacy = json.loads((run / "privacy.json").read_text())
    for c in privacy["clients"]:
        c["epsilon_guarantee"] = c["epsilon_spent"] / 2
    privacy["guarantee"] = {"epsilon_max": 0.75, "source": "the f-DP block's headline bound",
                            "other_epsilons": [{"field": "clients[].epsilon_spent", "epsilon_max": 1.5,
                                                "why_it_differs": "RDP's conversion is not exact"}]}
    (run / "privacy.json").write_text(json.dumps(privacy))
    text = render(run)
    assert "guarantee ε" in text  # the column appears only when it differs from the spent epsilon
    assert "the run's guarantee: epsilon <= 0.75 for every client" in text and "headline bound" in text
    assert "also computed, not the guarantee: clients[].epsilon_spent (largest 1.5): RDP's conversion" in text


def test_unaccounted_run_prints_its_warning_and_no_table(tmp_path):
    run = make_unaccounted_run(tmp_path / "run")
    lines = render(run).splitlines()
    assert lines[1] == "udp-unaccounted: 5 rounds (stop: rounds), final accuracy 0.850, best 0.850"
    assert lines[2] == "privacy: a privacy mechanism ran for which dpfl computes no epsilon; no guarantee is reported"
    assert not any("budget ε" in line or line.startswith("guarantee") for line in lines)
    assert lines[3].startswith("run directory: ") and len(lines) == 4


def test_non_private_run_without_warning_says_so(tmp_path):
    run = make_unaccounted_run(tmp_path / "run")
    privacy = json.loads((run / "privacy.json").read_text())
    del privacy["warning"]
    (run / "privacy.json").write_text(json.dumps(privacy))
    assert "privacy: not private: no epsilon is reported" in render(run).splitlines()


def test_an_unfinished_run_is_a_run_dir_error(tmp_path):
    run = make_accounted_run(tmp_path / "run", complete=False)
    with pytest.raises(RunDirError, match="did not finish"):
        render(run)


def test_an_early_stop_on_budgets_names_the_setting_that_avoids_it():
    from dpfl.results.outcome import early_stop_hint

    assert early_stop_hint("rounds", {}) is None
    assert "participation: worst_case" in early_stop_hint("budget",
                                                          {"noise_calibration": {"participation": "expected"}})
    assert "worst_case" not in early_stop_hint("budget", {"noise_calibration": {"participation": "worst_case"}})


def test_an_accounted_run_prints_its_warning_heuristic_and_assumptions_before_any_epsilon(tmp_path):
    run = make_accounted_run(tmp_path / "run", n_clients=2)
    privacy = json.loads((run / "privacy.json").read_text())
    privacy.update(warning="NOT PRIVATE AS PROMISED: clients [1] spent more than their budgets",
                   heuristic="noise from PFA's heuristic formula ..., which is NOT a DP guarantee",
                   per_upload_amplification="ASSUMED: the server cannot tell which clients took part")
    privacy["fdp"] = {"view": "aggregate", "release": "final", "mu_max": 0.5, "headline": "shifted-interpolation",
                      "epsilon_max": {"1e-05": 2.0}, "clients": [{"client": 0}, {"client": 1}],
                      "params": {"smoothness_L": 4.5}}
    (run / "privacy.json").write_text(json.dumps(privacy))
    lines = render(run).splitlines()
    first_eps = next(i for i, line in enumerate(lines) if "budget ε" in line)
    warning = lines.index("WARNING: NOT PRIVATE AS PROMISED: clients [1] spent more than their budgets")
    assert warning < first_eps
    assert "calibration: noise from PFA's heuristic formula ..., which is NOT a DP guarantee" in lines
    assert "  per-upload amplification ASSUMED: the server cannot tell which clients took part" in lines
    assert any(line.endswith("(bound: shifted-interpolation, exact GDP conversion; holds only if the loss is L-smooth "
                             "with the ASSUMED L = 4.5)") for line in lines)


def test_a_populations_classes_are_printed_instead_of_clients(tmp_path):
    """privacy.json of a run above PER_CLIENT_LIMIT clients has `clients_summary`, not `clients` (docs/scale.md):
    the outcome prints each class with its size and first client, or each field's range."""
    run = make_accounted_run(tmp_path / "run", n_clients=2)
    privacy = json.loads((run / "privacy.json").read_text())
    del privacy["clients"]
    row = {"epsilon_budget": 8.0, "delta": 1e-7, "noise_multiplier": 1.25, "batch_size": 2, "records": 2,
           "epsilon_reported": 0.5, "epsilon_guarantee": 0.5}
    privacy["clients_summary"] = {"clients": 1_000_000, "classes_count": 2, "why": "more than 100000 clients",
                                  "classes": [
        {"clients": 999_990, "first_client": 0, **row, "epsilon_spent": 0.0},
        {"clients": 10, "first_client": 3, **row, "epsilon_spent": 0.5}]}
    (run / "privacy.json").write_text(json.dumps(privacy))
    text = render(run)
    assert "1000000 clients in 2 classes of alike clients" in text
    cells = [[x.strip() for x in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]
    assert cells == [["999990", "0", "2", "8.000", "1e-07", "1.250", "0.000"],
                     ["10", "3", "2", "8.000", "1e-07", "1.250", "0.500"]]
    del privacy["clients_summary"]["classes"]
    privacy["clients_summary"]["range"] = {"epsilon_spent": [0.0, 0.5], "noise_multiplier": None}
    (run / "privacy.json").write_text(json.dumps(privacy))
    assert "  epsilon_spent: 0 to 0.5" in render(run)

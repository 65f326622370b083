"""Formatting of the results: mean ± std over seeds, and rows of jobs that did not run."""

from __future__ import annotations

import math

import pytest

from dpfl.reproduce import robust_hdp
from dpfl.reproduce.runner import FAILED, OK, Outcome
from dpfl.reproduce.tables import COLUMNS, job_row, mean_std, seeds_phrase


@pytest.mark.parametrize("values, fmt, text", [
    ([0.5], ".4f", "0.5000 ± n/a"),                       # one seed: no std
    ([0.5, 0.7], ".4f", "0.6000 ± 0.1414"),               # sample std (ddof = 1), not 0.1
    ([0.81, 0.83, 0.82], ".3f", "0.820 ± 0.010"),
    ([], ".4f", "n/a"),
    ([None, math.nan, 0.3], ".4f", "0.3000 ± n/a"),       # missing values are not seeds
    ([2e-3, 4e-3], ".3g", "0.003 ± 0.00141"),
    ([-0.05, 0.01], "+.4f", "-0.0200 ± 0.0424"),         # a signed mean, an unsigned spread
])
def test_mean_std(values, fmt, text):
    assert mean_std(values, fmt) == text


@pytest.mark.parametrize(("planned", "present", "text"), [
    ([0, 1, 2], [0, 1, 2], "seeds 0..2"),
    ([0, 1, 2], [], "seeds 0..2"),  # nothing finished: the plan
    ([0, 1, 2], [2], "seed 2 of the planned 0..2"),  # --only-seeds 2
    ([0, 1, 2], [0, 2], "seeds 0, 2 of the planned 0..2"),
    ([0], [0], "seed 0"),
])
def test_the_runs_line_names_the_seeds_the_rows_hold(planned, present, text):
    assert seeds_phrase(planned, present) == text


def test_rows_of_jobs_without_a_run_directory(tmp_path):
    job = robust_hdp.grid("ci", methods=["weiavg"]).jobs[0]
    failed = job_row(Outcome(job, job.run_dir(tmp_path), FAILED, "ran", "ConfigError: privacy.budgets: ..."),
                     "ci", tmp_path)
    assert list(failed) == COLUMNS
    assert (failed["status"], failed["message"], failed["final_accuracy"], failed["run_dir"]) == \
        ("failed", "ConfigError: privacy.budgets: ...", None, None)
    assert (failed["method"], failed["setting"], failed["seed"], failed["rounds_planned"]) == \
        ("weiavg", "fmnist-Dist5", 0, 3)
    missing = job_row(Outcome(job, job.run_dir(tmp_path), OK), "ci", tmp_path)
    assert missing["status"] == "not run"  # an "ok" without a directory is never reported as a result


def test_the_lie_and_its_controls_are_each_paired_with_the_honest_runs():
    from dpfl.reproduce.tables import _misreport_tables

    grid = robust_hdp.grid("full", seeds=1, settings_pattern="fmnist-Dist5*", methods=["weiavg"])
    accuracy = {"fmnist-Dist5": 0.54, "fmnist-Dist5-misreport-c10": 0.59, "fmnist-Dist5-noise-only": 0.60}
    rows = [{"setting": s, "method": "weiavg", "seed": 0, "status": OK, "final_accuracy": a, "final_test_loss": 1.0}
            for s, a in accuracy.items()]  # no weights-only row: its table is left out, not shown empty
    md = "\n".join(_misreport_tables(grid, rows, {}))
    assert [line for line in md.splitlines() if line.startswith("## ")] == [
        "## Falsified budget: fmnist-Dist5-misreport-c10 against fmnist-Dist5",
        "## Control of the lie: fmnist-Dist5-noise-only against fmnist-Dist5"]
    lie, control = md.split("## Control of the lie")
    assert "misreport final acc" in lie and "budgets and seeds" in lie and "| +0.0500 ± n/a |" in lie
    assert "control final acc" in control and "budgets are as stated" in control and "| +0.0600 ± n/a |" in control


def test_cpu_seconds_is_the_rounds_sum_or_empty_when_a_round_lacks_it():
    """Wall time counts pauses and other jobs; the CPU column does not, and a partial sum would understate it."""
    from dpfl.reproduce.tables import _from_metrics

    rows = [{"round": 1, "seconds": 2.0, "cpu_seconds": 1.25}, {"round": 2, "seconds": 3.0, "cpu_seconds": 0.5}]
    assert (_from_metrics(rows)["seconds"], _from_metrics(rows)["cpu_seconds"]) == (5.0, 1.75)
    older = [{"round": 1, "seconds": 2.0}, *rows[1:]]  # a round recorded before dpfl measured CPU time
    assert (_from_metrics(older)["seconds"], _from_metrics(older)["cpu_seconds"]) == (5.0, None)

"""Formatting of the results: mean ± std over seeds, and rows of jobs that did not run."""

from __future__ import annotations

import math

import pytest

from dpfl.reproduce import robust_hdp
from dpfl.reproduce.runner import FAILED, OK, Outcome
from dpfl.reproduce.tables import COLUMNS, job_row, mean_std


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

"""MP-DP configs that no run could honour fail as one line (exit 2) before anything is written: more clients than
training records, and a per-round epsilon that only a noise below the budgets' limit (1e-6) meets."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import cli
from dpfl.privacy.analytic_gaussian import analytic_gaussian_sigma

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "mpdp" / "ci_digits_mlp.yaml"


def _one_line_error(tmp_path: Path, *sets: str) -> str:
    args = [a for s in sets for a in ("--set", s)]
    code, _, err = cli("run", CONFIG, *args, "--out", tmp_path / "run")
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("note:")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    return lines[0]


def test_more_clients_than_records_is_one_line(tmp_path):
    assert "exceeds the 1438 training records" in _one_line_error(tmp_path, "data.clients=1500")


@pytest.mark.parametrize("method", ["mpdp", "mpdp_naive", "mp_cdp"])
def test_an_epsilon_beyond_the_budgets_limit_is_refused(tmp_path, method):
    line = _one_line_error(tmp_path, f"algorithm.name={method}", "algorithm.params.epsilon=1e300")
    assert "1e-06" in line and "no meaningful protection" in line


def test_the_analytic_gaussian_refuses_instead_of_returning_its_search_floor():
    assert analytic_gaussian_sigma(1e6, 1e-5) > 1e-6  # a large but meaningful target is still calibrated
    with pytest.raises(ValueError, match="no meaningful protection"):
        analytic_gaussian_sigma(1e300, 1e-5)  # it used to return 1e-6 (the search's floor) silently

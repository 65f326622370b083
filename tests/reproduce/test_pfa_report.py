"""PFA's cross-setting views in results.md: accuracy against M, and clients the heuristic calibration overspent."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from script_module import load_script

from dpfl.reproduce import pfa
from dpfl.reproduce.pfa_report import accuracy_by_seed, accuracy_vs_m, overspent_clients
from dpfl.reproduce.runner import OK, run_jobs


def _row(setting: str, method: str, seed: int, acc: float) -> dict:
    return {"setting": setting, "method": method, "seed": seed, "status": OK, "final_accuracy": acc}


def test_accuracy_against_m_is_one_table_and_plot_per_model_budgets_and_calibration(tmp_path):
    grid = pfa.grid("full", settings_pattern="fmnist-logr-iid-MixGauss1-*", seeds=2)
    rows = [_row(f"fmnist-logr-iid-MixGauss1-M{m}-rdp", method, seed, acc + seed / 100)
            for m, base in ((20, 0.5), (40, 0.6)) for method, acc in (("pfa", base), ("weiavg", base - 0.1))
            for seed in (0, 1)]
    lines = accuracy_vs_m(grid, rows, tmp_path)
    text = "\n".join(lines)
    assert "## Accuracy against M: logr, MixGauss1, calibration accountant" in text
    assert "| method | M = 20 | M = 40 |" in text  # only the M that ran
    assert "Final test accuracy, mean ± sd over seeds 0, 1.\n" in text  # the seeds, said once when every cell has all
    assert "| pfa | 0.5050 ± 0.0071 | 0.6050 ± 0.0071 |" in text  # sample std (ddof = 1) of {x, x + 0.01}
    assert "| weiavg | 0.4050 ± 0.0071 | 0.5050 ± 0.0071 |" in text
    assert (tmp_path / "plots" / "accuracy_vs_M-logr-MixGauss1-accountant.png").stat().st_size > 1000
    assert accuracy_vs_m(grid, rows[:4], tmp_path) == []  # one M: nothing to plot against
    uneven = "\n".join(accuracy_vs_m(grid, rows[:-1], tmp_path))  # M = 40's weiavg without its seed 1
    assert "| pfa | 0.5050 ± 0.0071 (n = 2) | 0.6050 ± 0.0071 (n = 2) |" in uneven
    assert "| weiavg | 0.4050 ± 0.0071 (n = 2) | 0.5000 ± n/a (n = 1) |" in uneven
    assert "mean ± sd over seeds 0, 1; a cell with fewer says its n." in uneven


def test_accuracy_by_seed_is_one_table_per_model_and_m_accountant_columns_first():
    grid = pfa.grid("full", settings_pattern="fmnist-logr-iid-*-M20-*", calibration="both", seeds=3)
    settings = ["fmnist-logr-iid-MixGauss3-M20-heuristic", "fmnist-logr-iid-MixGauss1-M20-rdp"]
    rows = [_row(setting, "pfa", seed, 0.5 + i / 10 + seed / 100) for i, setting in enumerate(settings)
            for seed in (0, 2)]
    rows.append({**_row(settings[1], "weiavg", 0, 0.4), "status": "failed"})  # a failed run is not a number
    rows.append(_row(settings[1], "weiavg", 2, 0.45))
    text = "\n".join(accuracy_by_seed(grid, rows))
    assert "## Final test accuracy by seed: logr, M = 20 (seed 0 / 2)" in text  # the seeds that ran
    assert ("| method | MixGauss1, accountant | MixGauss3, accountant | MixGauss1, heuristic | MixGauss3, heuristic |"
            in text)
    assert "| pfa | 0.6000 / 0.6200 | — / — | — / — | 0.5000 / 0.5200 |" in text
    assert "| weiavg | — / 0.4500 | — / — | — / — | — / — |" in text
    assert accuracy_by_seed(grid, rows[-2:-1]) == []  # nothing finished: no table


def test_every_client_the_heuristic_overspent_is_listed(tmp_path, fmnist):
    """The ci grid's heuristic runs: the listed clients are exactly those whose privacy.json says accountant
    epsilon > budget. There are some (seed 0: two large-budget clients of weiavg, ~20x over), as the heuristic's
    noise is far too small at large epsilon (docs/papers/pfa.md)."""
    grid = pfa.grid("ci", calibration="pfa-heuristic", methods=["weiavg", "min_eps"],
                    settings_pattern="*logr*")
    outcomes = run_jobs(grid.jobs, tmp_path)
    assert all(o.status == OK for o in outcomes)
    expected = []
    for o in outcomes:
        privacy = json.loads((o.run_dir / "privacy.json").read_text())
        expected += [(o.job.method, c["client"]) for c in privacy["clients"]
                     if c["epsilon_spent"] > c["epsilon_budget"] * (1 + 1e-9)]
    lines = overspent_clients(grid, outcomes)
    assert lines[0] == "## Heuristic calibration: clients over budget under the real accountant"
    rows = [line.split("|") for line in lines if line.startswith("| fmnist")]
    listed = [(cells[2].strip(), int(cells[4])) for cells in rows if len(cells) == 9]  # the per-client table
    assert expected and sorted(listed) == sorted(expected)
    assert f"{len(expected)} client-runs spent more than their budgets" in lines[2]
    assert "| fmnist-logr-iid-MixGauss1-M10-heuristic | weiavg | 2 | 1 |" in "\n".join(lines)  # the summary row


ROOT = Path(__file__).resolve().parents[2]


def _script():
    return load_script("pfa_accuracy_vs_m")


def test_the_script_draws_accuracy_against_m_from_published_csvs_split_by_m(tmp_path):
    """docs/results/pfa_full.csv cut into one CSV per M (a grid run one M per session) gives the same tables as the
    whole file, and those are the numbers docs/papers/pfa.md publishes."""
    published = ROOT / "docs" / "results" / "pfa_full.csv"
    lines = published.read_text().splitlines(keepends=True)
    header, body = lines[0], lines[1:]
    pieces = []
    for m in (20, 30, 40, 50):
        piece = tmp_path / f"M{m}.csv"
        piece.write_text(header + "".join(r for r in body if f"-M{m}-" in r.split(",")[1]))
        pieces.append(piece)
    _script().main([*map(str, pieces), "--out", str(tmp_path / "split")])
    _script().main([str(published), "--out", str(tmp_path / "whole")])
    split = (tmp_path / "split" / "accuracy_vs_M.md").read_text()
    whole = (tmp_path / "whole" / "accuracy_vs_M.md").read_text()
    assert split.split("\n", 1)[1] == whole.split("\n", 1)[1]  # all but the line naming the sources
    published_row = "| pfa | 0.6995 ± 0.0424 | 0.7566 ± 0.0086 | 0.7673 ± 0.0020 | 0.7774 ± 0.0035 |"  # as in the docs
    assert published_row in split
    assert (tmp_path / "split" / "plots" / "accuracy_vs_M-logr-MixGauss3-pfa-heuristic.png").stat().st_size > 1000
    with pytest.raises(SystemExit, match="two or more M"):
        _script().main([str(pieces[0]), "--out", str(tmp_path / "one")])


@pytest.fixture(scope="module")
def published_cnn_tables(tmp_path_factory) -> Path:
    """The script's output (tables and plots) from docs/results/pfa_cnn_full.csv, made once for the docs tests."""
    out = tmp_path_factory.mktemp("pfa_cnn_tables")
    _script().main([str(ROOT / "docs" / "results" / "pfa_cnn_full.csv"), "--out", str(out)])
    return out


def _pfa_cnn_pages() -> str:
    """The results pages of the PFA CNN: M = 30 in pfa.md, M = 20, 40 and 50 and accuracy against M in pfa_cnn.md."""
    return "\n".join((ROOT / "docs" / "papers" / name).read_text() for name in ("pfa.md", "pfa_cnn.md"))


def test_the_docs_cnn_tables_are_the_scripts_output_of_the_published_csv(published_cnn_tables):
    """The PFA CNN's mean ± sd tables (docs/papers/pfa.md and pfa_cnn.md) are what the script computes from
    docs/results/pfa_cnn_full.csv: a row added to the CSV (a new seed) without the docs following fails here."""
    rows = [line for line in (published_cnn_tables / "accuracy_vs_M.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| method")]
    docs = _pfa_cnn_pages()
    assert len(rows) == 4 * 7  # 2 distributions x 2 calibrations, 7 methods each
    missing = [row for row in rows if row not in docs]
    assert not missing, f"docs/papers/pfa.md and pfa_cnn.md lack these rows of the script's tables: {missing}"


def test_the_docs_cnn_seed_tables_are_the_published_csv(published_cnn_tables):
    """The PFA CNN's seed-by-seed tables (docs/papers/pfa.md and pfa_cnn.md: "seed 0 / seed 1 / ...") hold, for
    every M, every private method's row as the script writes it from docs/results/pfa_cnn_full.csv: a seed landed in
    the CSV without its table, or a number typed wrong, fails here."""
    private = ("pfa", "pfa_plus", "weiavg", "fedavg", "min_eps")
    rows = [line for line in (published_cnn_tables / "accuracy_by_seed.md").read_text().splitlines()
            if line.startswith(tuple(f"| {m} |" for m in private))]
    assert len(rows) == 4 * len(private)  # M = 20, 30, 40, 50
    docs = _pfa_cnn_pages()
    missing = [row for row in rows if row not in docs]
    assert not missing, f"docs/papers/pfa.md and pfa_cnn.md lack these seed-by-seed rows: {missing}"


@pytest.mark.parametrize("name", ["pfa_full.csv", "pfa_cnn_full.csv"])
def test_the_published_pfa_rows_bear_out_the_docs_budget_claims(name):
    """The docs say: every accountant-calibrated private run met every budget, and the heuristic overspent in every
    private run but Minimum-ε's (max_eps is not private, np_fedavg not accounted). The published rows say so too."""
    rows = list(csv.DictReader((ROOT / "docs" / "results" / name).open()))
    assert rows and all(r["status"] == OK for r in rows)
    private = {"pfa", "pfa_plus", "weiavg", "fedavg", "min_eps"}
    for r in rows:
        calibration = r["setting"].rsplit("-", 1)[1]
        if r["method"] not in private:
            continue
        expected = calibration == "rdp" or r["method"] == "min_eps"
        assert r["meets_budgets"] == str(expected), (r["setting"], r["method"], r["seed"])

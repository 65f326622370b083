"""The full-participation tables of docs/papers/splitting_all_clients.md (all 100 clients beside a 10% cohort) from
the published CSVs: the module's arithmetic on hand-made rows, and the docs holding what the script writes from the
real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpfl.reproduce import splitting_participation as sp
from dpfl.reproduce.splitting_cnn import PRESETS, TAU
from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def _rows(seeds, accuracy, *, status="ok", skip=()):
    """One CSV row (as text, the way csv_rows gives it) per planned run; `accuracy(setting, preset, tau, seed)`."""
    return [{"setting": setting, "method": preset, "anderson": str(tau), "seed": str(seed), "status": status,
             "final_accuracy": str(accuracy(setting, preset, tau, seed)), "best_accuracy": "0.9"}
            for seed in seeds for setting, _ in sp.PARTITIONS for preset in PRESETS for tau in (0, TAU)
            if (setting, preset, tau, seed) not in skip]


def test_complete_seeds_are_those_with_the_whole_all_clients_grid_finished():
    missing = ("cnn-shards6", "fedrp", TAU, 2)
    rows = _rows([0, 1, 2], lambda *k: 0.5, skip={missing}) + _rows([3], lambda *k: 0.5, status="failed")
    assert sp.complete_seeds(sp.index(rows)) == [0, 1]  # seed 2 lacks one run, seed 3's runs failed


def test_the_mean_table_compares_both_studies_over_the_same_seeds():
    everyone = sp.index(_rows([0, 1], lambda s, p, tau, seed: 0.6 + 0.1 * seed))  # 0.6 and 0.7: 0.650 ± 0.071
    cohort = sp.index(_rows([0, 1, 2], lambda s, p, tau, seed: 0.2 * (seed + 1)))  # seed 2 (0.6) left out
    table = sp.mean_table(everyone, cohort, [0, 1])
    assert table[2] == "| fedavg | 0 | " + " | ".join(["0.650 ± 0.071", "0.300 ± 0.141"] * 3) + " |"
    assert len(table) == 2 + 2 * len(PRESETS)
    del cohort[("cnn-iid", "fedpi", TAU, 1)]
    assert "incomplete (1 of 2)" in sp.mean_table(everyone, cohort, [0, 1])[9]  # fedpi, tau = 10: no mean of one
    with pytest.raises(ValueError, match="two or more seeds"):
        sp.mean_table(everyone, cohort, [0])


def test_a_seed_table_shows_final_and_best_beside_the_cohort_and_says_what_did_not_run():
    everyone = sp.index(_rows([0], lambda s, p, tau, seed: 0.3565, skip={("cnn-iid", "fedavg", 0, 0)}))
    cohort = sp.index(_rows([0], lambda s, p, tau, seed: 0.25))
    first, second = sp.seed_table(everyone, cohort, 0)[2:4]
    assert first == "| fedavg | 0 | not run | 0.250 | " + " | ".join(["0.356 (0.900)", "0.250"] * 2) + " |"
    assert second == "| fedavg | 10 | " + " | ".join(["0.356 (0.900)", "0.250"] * 3) + " |"


def test_the_docs_tables_are_the_scripts_output_of_the_published_csvs(capsys):
    """docs/papers/splitting_all_clients.md holds every table row the script prints (run as the docs say) from the
    two published CSVs: a seed or a re-run landed in the CSV without the docs following, or a number typed wrong,
    fails here."""
    load_script("splitting_participation_table").main([str(RESULTS / "splitting_cnn_all_clients.csv"),
                                                      str(RESULTS / "splitting_cnn_reduced.csv")])
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith(tuple(f"| {p} |" for p in PRESETS))]
    assert len(rows) >= 2 * len(PRESETS)  # at least seed 0
    docs = (ROOT / "docs" / "papers" / "splitting_all_clients.md").read_text()
    missing = [row for row in rows if row not in docs]
    assert not missing, f"splitting_all_clients.md lacks these rows of the script's tables: {missing}"

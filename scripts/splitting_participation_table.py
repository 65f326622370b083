"""docs/papers/splitting_all_clients.md's tables (all 100 clients per round beside a 10% cohort), from the CSVs.

One table per seed that has all-clients runs (final accuracy, best in brackets, beside the 10% cohort's final), and
a mean ± sd table over the seeds whose all-clients grid is complete, when there are two or more.

    python scripts/splitting_participation_table.py \\
        docs/results/splitting_cnn_all_clients.csv docs/results/splitting_cnn_reduced.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dpfl.reproduce.merge import csv_rows
from dpfl.reproduce.splitting_participation import complete_seeds, index, mean_table, seed_table


def tables(all_clients_csv: Path, cohort_csv: Path) -> str:
    everyone = index(csv_rows(all_clients_csv.read_text(encoding="utf-8")))
    cohort = index(csv_rows(cohort_csv.read_text(encoding="utf-8")))
    if not everyone:
        raise SystemExit(f"error: no finished run in {all_clients_csv}")
    parts = []
    for seed in sorted({key[3] for key in everyone}):
        parts += [f"Seed {seed}: final test accuracy (best in brackets), next to the 10%-cohort run of the same seed.",
                  "", *seed_table(everyone, cohort, seed), ""]
    complete = complete_seeds(everyone)
    if len(complete) >= 2:
        seeds = ", ".join(map(str, complete))
        parts += [f"Final test accuracy, mean ± sd over seeds {seeds} (both columns over the same seeds).", "",
                  *mean_table(everyone, cohort, complete), ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("all_clients_csv", type=Path, help="results CSV of --scale reduced-all-clients")
    parser.add_argument("cohort_csv", type=Path, help="results CSV of --scale reduced (10 clients per round)")
    args = parser.parse_args(argv)
    print(tables(args.all_clients_csv, args.cohort_csv), end="")


if __name__ == "__main__":
    main()

"""The PFA paper's accuracy-against-M view (its Figs. 3-4) from published result CSVs instead of run directories.

`dpfl reproduce pfa --tables-only` draws it from the run directories under one --out; a grid run over several
sessions (one M per session, directories not kept) leaves only its CSVs under docs/results/. This reads them (merged
in memory: one row per setting, seed and method) and writes the same tables and plots (`pfa_report.accuracy_vs_m`),
and each M's accuracy seed by seed (`pfa_report.accuracy_by_seed`, OUT/accuracy_by_seed.md).

    python scripts/pfa_accuracy_vs_m.py docs/results/pfa_cnn_full.csv --out OUT   # or one CSV per M, merged here
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dpfl.reproduce import pfa
from dpfl.reproduce.merge import DEFAULT_KEY as KEY, csv_rows, merge_csv_files
from dpfl.reproduce.pfa_report import accuracy_by_seed, accuracy_vs_m


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csvs", nargs="+", type=Path, help="results CSVs of `dpfl reproduce pfa --scale full`")
    parser.add_argument("--out", type=Path, required=True,
                        help="writes OUT/accuracy_vs_M.md, OUT/plots/ and OUT/accuracy_by_seed.md")
    args = parser.parse_args(argv)
    # merged: two different rows for one run are refused, not averaged
    text = merge_csv_files(args.csvs, KEY) if len(args.csvs) > 1 else args.csvs[0].read_text(encoding="utf-8")
    rows = [{**r, "final_accuracy": float(r["final_accuracy"]) if r["final_accuracy"] else None}
            for r in csv_rows(text)]
    grid = pfa.grid("full", calibration="both")
    lines = accuracy_vs_m(grid, rows, args.out)
    if not lines:
        raise SystemExit("error: no (model, budgets, calibration) has finished runs at two or more M in these CSVs")
    args.out.mkdir(parents=True, exist_ok=True)
    sources = ", ".join(p.as_posix() for p in args.csvs)
    (args.out / "accuracy_vs_M.md").write_text(f"Final test accuracy, from {sources}.\n\n" + "\n".join(lines) + "\n",
                                              encoding="utf-8")
    (args.out / "accuracy_by_seed.md").write_text(f"From {sources}.\n\n" + "\n".join(accuracy_by_seed(grid, rows)),
                                                 encoding="utf-8")
    plots = len([x for x in lines if x.startswith("![")])
    print(f"wrote {args.out / 'accuracy_vs_M.md'}, {args.out / 'accuracy_by_seed.md'} and {plots} plots")


if __name__ == "__main__":
    main()

"""docs/results/README.md indexes every published result file: a file without a row has no command a reader could
re-run, and a row without its file points at nothing."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def _indexed() -> set[str]:
    rows = [line for line in (RESULTS / "README.md").read_text().splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([^`/]+\.\w+)`", row.split(" | ")[0])}


def test_every_result_file_has_a_row_and_every_row_a_file():
    files = {p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md"}
    indexed = _indexed()
    assert files - indexed == set(), "result files without a row in docs/results/README.md"
    assert indexed - files == set(), "rows in docs/results/README.md naming no file"

"""Every ```python block in the docs is executed by a test (issue 66): a page that gains a Python block must be
added to one of the tests that run them, or the block may rot unnoticed.

The runners: test_docs_pages (getting-started, concepts, FAQ, README), test_docs_algorithms (the algorithm pages and
the family guides), test_docs_api (api.md, how-to/register.md) and test_docs_own_data (own-data.md).
"""

from __future__ import annotations

from pathlib import Path

import test_docs_algorithms
import test_docs_api
import test_docs_pages
from doc_blocks import fenced

ROOT = Path(__file__).resolve().parents[1]


def pages_with_python() -> set[Path]:
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "examples").rglob("*.md")]
    return {p.resolve() for p in pages if fenced(p.read_text(encoding="utf-8"), "python")}


def pages_run_by_tests() -> set[Path]:
    run = {ROOT / "README.md", ROOT / "docs" / "own-data.md"}
    run |= set(test_docs_pages.PAGES) | set(test_docs_algorithms.PAGES)
    run |= {ROOT / page for page in test_docs_api.PAGES}
    return {p.resolve() for p in run}


def test_every_python_block_is_run_by_a_test():
    missing = sorted(str(p.relative_to(ROOT)) for p in pages_with_python() - pages_run_by_tests())
    assert not missing, f"python blocks no test executes: {missing}"


def test_the_runners_cover_pages_that_have_python():
    assert {"README.md", "docs/api.md", "docs/own-data.md", "docs/concepts/budgets.md"} <= {
        str(p.relative_to(ROOT)) for p in pages_with_python() & pages_run_by_tests()}

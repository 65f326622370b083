"""The user guide stays readable: issue 66's size budget for the pages a user reads.

User pages are every Markdown page under docs/ except the results section (docs/papers/, docs/results/) and the
generated references (docs/reference/). Measured results belong in the results section; a user page that grows
past its budget is repeating something another page (or the generated reference) already says.
"""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
NOT_USER = ("papers", "results", "reference")
TOTAL_BYTES = 150_000
PAGE_BYTES = 25_000


def user_pages() -> dict[str, int]:
    return {str(p.relative_to(DOCS)): p.stat().st_size for p in sorted(DOCS.rglob("*.md"))
            if p.relative_to(DOCS).parts[0] not in NOT_USER}


def test_user_pages_exist():
    pages = user_pages()
    assert "index.md" in pages and "faq.md" in pages and len(pages) > 20, sorted(pages)


def test_user_pages_total_under_budget():
    pages = user_pages()
    largest = sorted(pages.items(), key=lambda kv: -kv[1])[:8]
    assert sum(pages.values()) < TOTAL_BYTES, f"{sum(pages.values())} bytes; largest: {largest}"


def test_no_user_page_over_budget():
    assert not {p: n for p, n in user_pages().items() if n > PAGE_BYTES}

"""docs/api.md and docs/how-to/register.md run as written: each page's python blocks are executed in order as one
script."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from doc_blocks import fenced

ROOT = Path(__file__).resolve().parents[1]

PAGES = {  # page -> (at least this many blocks, the run directories it leaves behind)
    "docs/api.md": (7, ["api-demo", "api-dict", "api-hospitals"]),
    "docs/how-to/register.md": (3, ["api-moons"]),
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_page_runs_as_written(page, tmp_path, monkeypatch, clean_registries):
    least, expected_runs = PAGES[page]
    blocks = fenced((ROOT / page).read_text(encoding="utf-8"), "python")
    assert len(blocks) >= least
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    namespace: dict = {"__name__": "docs_api"}
    with warnings.catch_warnings():  # the pages show attribute access, never the deprecated dict form
        warnings.filterwarnings("error", message=".*dict-style access to a typed result", category=DeprecationWarning)
        for i, block in enumerate(blocks):
            exec(compile(block, f"{page} block {i + 1}", "exec"), namespace)  # noqa: S102 - our own docs
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == expected_runs  # failed runs leave nothing behind
    for name in runs:
        assert (tmp_path / "runs" / name / "summary.json").is_file()

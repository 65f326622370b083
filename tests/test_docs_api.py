"""docs/api.md runs as written: its python blocks are executed in order as one script."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_page_runs_as_written(tmp_path, monkeypatch, clean_registries):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "api.md").read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 8
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    namespace: dict = {"__name__": "docs_api"}
    with warnings.catch_warnings():  # the page shows attribute access, never the deprecated dict form
        warnings.filterwarnings("error", message=".*dict-style access to a typed result", category=DeprecationWarning)
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/api.md block {i + 1}", "exec"), namespace)  # noqa: S102 - our own docs
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["api-demo", "api-dict", "api-hospitals", "api-moons"]  # failed runs leave nothing behind
    for name in runs:
        assert (tmp_path / "runs" / name / "summary.json").is_file()

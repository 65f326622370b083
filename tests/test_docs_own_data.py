"""docs/own-data.md runs as written: its Python block against the shipped example, and its config excerpt is the
example's own data section."""

from __future__ import annotations

from pathlib import Path

import yaml

from doc_blocks import fenced

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "own-data.md").read_text(encoding="utf-8")


def test_the_python_block_runs_as_written(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    (block,) = fenced(PAGE, "python")
    exec(compile(block, "docs/own-data.md", "exec"), {"__name__": "docs_own_data"})  # noqa: S102 - our own docs
    assert capsys.readouterr().out.strip() == "400 [400 250 150] 2"


def test_the_data_section_shown_is_the_examples():
    shown = yaml.safe_load(fenced(PAGE, "yaml")[0])["data"]
    example = yaml.safe_load((ROOT / "configs" / "hospitals" / "hospitals.yaml").read_text(encoding="utf-8"))["data"]
    assert shown == example

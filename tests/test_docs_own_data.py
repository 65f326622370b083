"""docs/own-data.md runs as written: its Python block against the shipped example, and its config excerpt is the
example's own data section."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "own-data.md").read_text(encoding="utf-8")


def test_the_python_block_runs_as_written(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    (block,) = re.findall(r"```python\n(.*?)```", PAGE, re.S)
    exec(compile(block, "docs/own-data.md", "exec"), {"__name__": "docs_own_data"})  # noqa: S102 - our own docs
    assert capsys.readouterr().out.strip() == "400 [400 250 150] 2"


def test_the_data_section_shown_is_the_examples():
    shown = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", PAGE, re.S)[0])["data"]
    example = yaml.safe_load((ROOT / "configs" / "hospitals" / "hospitals.yaml").read_text(encoding="utf-8"))["data"]
    assert shown == example

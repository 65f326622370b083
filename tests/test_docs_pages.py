"""The getting-started pages, the concept pages and the FAQ run as written.

Each page's python blocks are executed in order as one script, in a temporary working directory that sees the
repository's configs (as tests/test_docs_api.py does for docs/api.md). The accountant outputs the pages print are
what `dpfl privacy epsilon` prints today. Their shell commands are checked with every page's, in
tests/test_docs_commands.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from doc_blocks import commands, fenced, words

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*(ROOT / "docs" / "getting-started").glob("*.md"), *(ROOT / "docs" / "concepts").glob("*.md"),
                ROOT / "docs" / "faq.md"])


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    return tmp_path


@pytest.mark.parametrize("page", [p for p in PAGES if fenced(p.read_text(encoding="utf-8"), "python")], ids=_name)
def test_the_python_blocks_run_as_written(page, in_tmp, capsys):
    if page.name == "run-directory.md":  # the page reads the demo's run directory: a short demo first
        import dpfl

        dpfl.run("configs/demo.yaml", overrides=["training.rounds=2"], out="runs/demo")
    namespace: dict = {"__name__": "docs_pages"}
    for i, block in enumerate(fenced(page.read_text(encoding="utf-8"), "python")):
        exec(compile(block, f"{_name(page)} block {i + 1}", "exec"), namespace)  # noqa: S102 - our own docs
    out = capsys.readouterr().out
    if page.name == "budgets.md":
        assert out.strip() == "6 0.99"
    if page.name == "accountants.md":
        assert out.split() == ["3.847", "3.527", "1.695"]
    if page.name == "rigorous.md":
        assert out.splitlines()[0] == "True ()" and out.splitlines()[1].startswith("False heuristic calibration")


def test_the_accountant_outputs_shown_are_todays():
    """The `dpfl privacy epsilon` lines pasted in the pages are what the command prints."""
    from cli_runner import cli

    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for line in commands(text):
            parts = words(line)
            if parts[:3] == ["dpfl", "privacy", "epsilon"]:
                code, out, _ = cli(*parts[1:])
                assert code == 0 and out.strip() in text, f"{_name(page)}: {line} now prints {out.strip()}"


def test_the_readmes_python_block_runs_as_written(in_tmp, capsys):
    blocks = fenced((ROOT / "README.md").read_text(encoding="utf-8"), "python")
    assert blocks
    namespace: dict = {"__name__": "readme"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md block {i + 1}", "exec"), namespace)  # noqa: S102 - our own docs
    assert (in_tmp / "runs" / "demo-py" / "summary.json").is_file()
    assert "rdp" in capsys.readouterr().out  # the guarantee's source names the accountant

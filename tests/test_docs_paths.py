"""Every docs path that the code, the tests, the scripts, the configs, the examples and README.md name still exists,
and every #anchor on it is a heading of that page (GitHub's slugs): an error message or a docstring that sends a
reader to docs/x.md#section must not point at a page or a section that moved. The relative links inside docs/ and
README.md are checked by tests/test_docs_links.py."""

from __future__ import annotations

import re
from pathlib import Path

from test_docs_links import anchors, slug

ROOT = Path(__file__).resolve().parents[1]
# A path starting at docs/ (not inside another path such as benchmarks/docs/), ending in a word character, with an
# optional #anchor; a template such as docs/{page}.md stops at its brace and names docs/ alone, which is skipped.
PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*[\w-](?:#[\w-]+)?")
TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cfg", ".json"}


def _sources() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in ("src", "tests", "scripts", "configs", "examples"):
        files += [p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in TEXT
                  and "__pycache__" not in p.parts and p != Path(__file__).resolve()]
    return sorted(files)


def named_paths() -> dict[str, list[str]]:
    """Each docs path (with its anchor, if any) and the files that name it."""
    named: dict[str, list[str]] = {}
    for source in _sources():
        for target in set(PATH.findall(source.read_text(encoding="utf-8", errors="replace"))):
            named.setdefault(target, []).append(str(source.relative_to(ROOT)))
    return named


def missing(named: dict[str, list[str]]) -> list[str]:
    broken = []
    for target, sources in sorted(named.items()):
        path, _, anchor = target.partition("#")
        dest = ROOT / path
        if not dest.exists():
            broken.append(f"{target} (named in {', '.join(sources)}): no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (named in {', '.join(sources)}): no heading with that anchor")
    return broken


def test_the_scan_finds_paths_and_anchors():
    """The scan sees the paths it is meant to check (a regex that matched nothing would pass every time)."""
    named = named_paths()
    assert "docs/results/README.md" in named
    assert any("#" in target for target in named)
    assert PATH.findall("see docs/secure.md. Or benchmarks/docs/x.md, docs/{page}.md, docs/a.md#b-c") == \
        ["docs/secure.md", "docs/a.md#b-c"]


def test_a_missing_page_or_anchor_fails():
    first_heading = next(iter(anchors(ROOT / "docs" / "faq.md")))
    assert missing({f"docs/faq.md#{first_heading}": ["x"]}) == []
    assert missing({"docs/no-such-page.md": ["x"]}) == ["docs/no-such-page.md (named in x): no such file"]
    assert missing({"docs/faq.md#no-such-heading": ["x"]}) == \
        ["docs/faq.md#no-such-heading (named in x): no heading with that anchor"]
    assert slug("Why the loss and the accuracy disagree") == "why-the-loss-and-the-accuracy-disagree"


def test_every_docs_path_named_outside_docs_exists():
    broken = missing(named_paths())
    assert not broken, "\n".join(broken)

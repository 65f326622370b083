"""The documentation site (mkdocs.yml, scripts/docs_hooks.py) builds in strict mode: a broken link or anchor, a page
missing from the nav, a public name missing from the API reference or a docstring that does not render fails it.
Every Markdown page under docs/ is in the nav (or excluded on purpose), the CLI reference has every command of the
typer app and the API reference every name of `dpfl.__all__`. The hook lets a link to an existing repository file
outside docs/ pass and still fails the build on a link to a missing one."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from processes import tree_env

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
HOOKS = ROOT / "scripts" / "docs_hooks.py"


class _Loader(yaml.SafeLoader):
    """mkdocs.yml's tags (!relative, !!python/...) read as nothing: the nav is plain YAML."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def site_config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_Loader)


def nav_pages(nav) -> list[str]:
    """The page paths of a nav (a list of paths, {title: path} and {section: [...]} items), in order."""
    pages: list[str] = []
    for item in nav if isinstance(nav, list) else [nav]:
        if isinstance(item, str):
            pages.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                pages += nav_pages(value)
    return pages


def excluded(page: str, patterns: str) -> bool:
    """Whether not_in_nav's gitignore-style patterns (one a line, rooted at docs/ by a leading /) cover page."""
    for pattern in filter(None, (line.strip() for line in (patterns or "").splitlines())):
        if fnmatch.fnmatch(page, pattern.lstrip("/")) or (not pattern.startswith("/")
                                                           and fnmatch.fnmatch(Path(page).name, pattern)):
            return True
    return False


def test_every_page_is_in_the_nav():
    """Every Markdown file under docs/ is in the nav or excluded on purpose (not_in_nav), and the nav names no page
    that does not exist: an orphan page is one no reader of the site can reach."""
    config = site_config()
    assert config["docs_dir"] == "docs"
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), "a page is listed twice in the nav"
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    orphans = [p for p in pages if p not in listed and not excluded(p, config.get("not_in_nav"))]
    assert not orphans, f"pages under docs/ that mkdocs.yml's nav does not list (add them where they belong): {orphans}"
    assert not [p for p in listed if not (DOCS / p).is_file()], "the nav lists pages that do not exist"
    assert "reference/api.md" in listed and "reference/cli.md" in listed and "index.md" in listed


def _mkdocs(config: Path, site: Path, strict: bool = True) -> subprocess.CompletedProcess[str]:
    env = tree_env(NO_MKDOCS_2_WARNING="1")  # the tree under test, not an installed dpfl
    command = [sys.executable, "-m", "mkdocs", "build", "-f", str(config), "-d", str(site)]
    return subprocess.run(command + (["--strict"] if strict else []), capture_output=True, text=True, env=env,
                          timeout=600)


def test_a_link_to_a_repository_file_passes_and_a_missing_one_fails(tmp_path):
    """A tiny site with the project's hook: a link to a file that exists outside docs/ builds (as a code reference
    to its path); one to a missing file, a word in angle brackets and an anchor that is no heading fail the strict
    build; `[a][b]` without a definition stays text, as on GitHub."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "x.yaml").write_text("a: 1\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(
        "# Home\n\n## Part\n\nSee [the config](../configs/x.yaml), [x.yaml](../configs/x.yaml#top) and "
        "[part](#part). A shape [rounds][steps], a path `runs/<name>`.\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"site_name: t\ntheme: {{name: material, font: false}}\nhooks: [{HOOKS}]\n"
                      "validation: {links: {not_found: warn, anchors: warn, unrecognized_links: warn}}\n"
                      "markdown_extensions: [toc]\nplugins: [search, autorefs]\n")
    good = _mkdocs(config, tmp_path / "site")
    assert good.returncode == 0, good.stderr
    html = (tmp_path / "site" / "index.html").read_text()
    assert "the config (<code>configs/x.yaml</code>)" in html and "[rounds][steps]" in html
    assert "<code>runs/&lt;name&gt;</code>" in html

    (tmp_path / "docs" / "bad.md").write_text(
        "# Bad\n\n[gone](../configs/missing.yaml), [outside](../../elsewhere.md), runs/<name> and "
        "[no such part](index.md#nowhere)\n")
    bad = _mkdocs(config, tmp_path / "site2")
    assert bad.returncode != 0
    warnings = [line for line in bad.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 4, bad.stderr
    assert all(any(s in w for w in warnings) for s in ("configs/missing.yaml", "elsewhere.md", "<name>", "nowhere"))


def _headings(html: str) -> set[str]:
    return set(re.findall(r'<h[1-6] id="([^"]+)"', html))


def _command_paths(command, prefix: str) -> list[str]:
    paths = [prefix]
    for name, sub in getattr(command, "commands", {}).items():
        paths += _command_paths(sub, f"{prefix} {name}")
    return paths


def test_the_site_builds_in_strict_mode(tmp_path):
    """mkdocs build --strict passes, and the generated references cover the CLI and the public API."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    done = _mkdocs(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-5000:]

    import typer.main

    import dpfl
    from dpfl.algorithms.registry import algorithm_names
    from dpfl.cli.root import app

    cli = _headings((tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8"))
    commands = _command_paths(typer.main.get_command(app), "dpfl")
    assert {"dpfl run", "dpfl data inspect", "dpfl flower guide"} <= set(commands)
    assert not [c for c in commands if c.replace(" ", "-") not in cli], "commands missing from the CLI reference"

    api_html = (tmp_path / "site" / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    api = _headings(api_html)
    public = [name for name in dpfl.__all__ if name not in ("__version__", "algorithms")]
    assert not [name for name in public if f"dpfl.{name}" not in api], "public names missing from the API reference"
    assert not [name for name in algorithm_names() if f"dpfl.algorithms.{name}" not in api_html]
    assert (tmp_path / "site" / "reference" / "formats" / "index.html").is_file()

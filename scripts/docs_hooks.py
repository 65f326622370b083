"""MkDocs hooks of the documentation site (mkdocs.yml `hooks:`), run by `make docs` and tests/test_docs_site.py.

- Links to repository files outside docs/ (`../configs/hospitals/hospitals.yaml`, `../src/dpfl/results/FORMATS.md`):
  MkDocs knows only the files under docs/ and reports every such link as not found. A link to a file that a page
  of the site includes (`--8<-- "src/dpfl/results/FORMATS.md"`) goes to that page; a link to any other file that
  exists in the repository becomes a code reference to its path (the site has no copy of it to link to). A link to
  a file that does not exist, or to a path outside the repository, is left alone: the strict build fails on it.
- Outside the reference pages, `[a][b]` with no link definition stays text, as on GitHub (mkdocs-autorefs would read
  it as a cross-reference to a Python object named `b` and warn).
- `<!-- dpfl:cli -->` becomes the reference of every `dpfl` command, written at build time from the typer app
  (`dpfl.cli.root.app`) by typer's own docs generator (what `typer dpfl.cli.root utils docs` prints).
- `<!-- dpfl:algorithm-factories -->` becomes one mkdocstrings entry per algorithm a config can name
  (`dpfl.algorithms.algorithm_names()`), so no registered algorithm is missing from the API reference.
- reference/api.md must have an entry (`::: path.to.name`) for every name in `dpfl.__all__`, and no page may hold
  a word in angle brackets that HTML swallows (`runs/<name>` shows as `runs/`: put it in backticks); either is a
  warning, which fails the strict build.
"""

from __future__ import annotations

import logging
import posixpath
import re
import sys
import warnings
import xml.etree.ElementTree as etree
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from markdown import Extension, Markdown
from markdown.treeprocessors import Treeprocessor

log = logging.getLogger("mkdocs.hooks.dpfl")  # under "mkdocs": --strict counts its warnings

CLI_MARKER = "<!-- dpfl:cli -->"
FACTORIES_MARKER = "<!-- dpfl:algorithm-factories -->"
API_PAGE = "reference/api.md"
REFERENCE = "reference/"
ENTRY = re.compile(r"^::: *([\w.]+)", re.M)
SNIPPET = re.compile(r'^--8<-- +"([^"]+)" *$', re.M)
HTML_TAGS = set("""a abbr address area article aside audio b bdi bdo blockquote body br button canvas caption cite
code col colgroup data datalist dd del details dfn dialog div dl dt em embed fieldset figcaption figure footer form
h1 h2 h3 h4 h5 h6 head header hgroup hr html i iframe img input ins kbd label legend li link main map mark menu meta
meter nav noscript object ol optgroup option output p picture pre progress q rp rt ruby s samp script search section
select slot small source span strong style sub summary sup table tbody td template textarea tfoot th thead time title
tr track u ul var video wbr svg path g circle rect line polyline polygon use defs symbol math
autoref""".split())  # autoref: mkdocs-autorefs' cross-reference, a link once the site is built

_state: dict = {"root": None, "docs": None, "page": None, "included": {}}


# --- links to repository files outside docs/ -------------------------------------------------------------------

def repository_target(href: str, page_src: str, docs_dir: Path, root: Path) -> str | None:
    """The repository path (POSIX, relative to the root) of a relative link that leaves docs/ and names a file or
    folder that exists in the repository; None for every other link (inside docs/, absolute, a URL, an anchor, a
    missing file, a path outside the repository), which MkDocs then checks as usual."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or not parts.path or parts.path.startswith("/"):
        return None
    target = (docs_dir / PurePosixPath(page_src).parent / unquote(parts.path)).resolve()
    if target.is_relative_to(docs_dir) or not target.is_relative_to(root) or not target.exists():
        return None
    return target.relative_to(root).as_posix()


def _as_code_reference(el: etree.Element, path: str) -> None:
    """The link's text stays; the repository path follows it as code unless the text already names the file."""
    text = "".join(el.itertext())
    el.tag = "span"
    el.attrib.clear()
    el.set("class", "dpfl-repository-file")
    el.set("title", f"{path} in the dpfl repository")
    if PurePosixPath(path).name in text:
        return
    children = list(el)
    if children:
        children[-1].tail = (children[-1].tail or "") + " ("
    else:
        el.text = (el.text or "") + " ("
    code = etree.SubElement(el, "code")
    code.text, code.tail = path, ")"


class _RepositoryLinks(Treeprocessor):
    """Runs after the inline patterns made the links (priority 20) and before MkDocs' own check (priority 0)."""

    def run(self, root: etree.Element) -> None:
        page = _state["page"]
        if page is None:
            return
        for el in list(root.iter("a")):
            href = el.get("href")
            path = None if href is None else repository_target(href, page.file.src_uri, _state["docs"],
                                                                _state["root"])
            if path is None:
                continue
            including = _state["included"].get(path)
            if including is not None:  # the page that includes the file: MkDocs checks that link as usual
                fragment = urlsplit(href).fragment
                relative = posixpath.relpath(including, posixpath.dirname(page.file.src_uri) or ".")
                el.set("href", relative + (f"#{fragment}" if fragment else ""))
            else:
                _as_code_reference(el, path)


class _GithubReferences(Treeprocessor):
    """Outside the reference pages, `[a][b]` with no link definition stays text, as on GitHub: the pages are
    GitHub Markdown, where `[rounds][local_steps]` is a shape, not a link. mkdocs-autorefs would read it as a
    cross-reference to a Python object `local_steps` and warn that there is none; its `[title][identifier]` syntax
    stays on for the reference pages. Runs before the inline patterns (priority 20)."""

    def run(self, root: etree.Element) -> None:
        from mkdocs_autorefs import AutorefsInlineProcessor

        page = _state["page"]
        if page is not None and not page.file.src_uri.startswith(REFERENCE) \
                and AutorefsInlineProcessor.name in self.md.inlinePatterns:
            self.md.inlinePatterns.deregister(AutorefsInlineProcessor.name)


class _SiteExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 (Markdown's API)
        md.treeprocessors.register(_GithubReferences(md), "dpfl_github_references", 30)
        md.treeprocessors.register(_RepositoryLinks(md), "dpfl_repository_links", 5)


# --- generated sections ------------------------------------------------------------------------------------------

def cli_reference() -> str:
    """Every `dpfl` command with its usage, arguments and options, from the typer app (typer's docs generator)."""
    with warnings.catch_warnings():  # typer's import of click names that click deprecates: not ours to fix
        warnings.simplefilter("ignore", DeprecationWarning)
        import typer
        import typer.main
        from typer.cli import get_docs_for_click

        from dpfl.cli.root import app

    command = typer.main.get_command(app)
    return get_docs_for_click(obj=command, ctx=typer.Context(command, info_name="dpfl"), name="dpfl", indent=1)


def algorithm_factories() -> str:
    """One mkdocstrings entry per algorithm name, headed by the name a config uses."""
    from dpfl.algorithms.registry import algorithm_names, algorithm_spec

    entries = []
    for name in algorithm_names():
        factory = algorithm_spec(name).factory
        entries.append(f"::: {factory.__module__}.{factory.__qualname__}\n"
                       f"    options:\n      heading: \"dpfl.algorithms.{name}\"\n      toc_label: \"{name}\"\n")
    return "\n".join(entries)


def undocumented_public_names(markdown: str) -> list[str]:
    """The names of `dpfl.__all__` that the API reference's Markdown has no `::: ` entry for."""
    import dpfl

    identifiers = ENTRY.findall(markdown)
    documented = set(identifiers) | {identifier.rsplit(".", 1)[-1] for identifier in identifiers}
    return [name for name in dpfl.__all__ if name != "__version__" and name not in documented]


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.unknown: list[str] = []

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag not in HTML_TAGS:
            self.unknown.append(tag)


def swallowed_words(html: str) -> list[str]:
    """`<name>` written as text outside code, which the browser takes for an (unknown, invisible) HTML tag."""
    parser = _Tags()
    parser.feed(html)
    return sorted(set(parser.unknown))


# --- MkDocs events -----------------------------------------------------------------------------------------------

def on_config(config):
    root = Path(config.config_file_path).resolve().parent
    _state["root"], _state["docs"] = root, Path(config.docs_dir).resolve()
    src = str(root / "src")
    if src not in sys.path:  # document the tree being built, not whichever dpfl is installed
        sys.path.insert(0, src)
    config.markdown_extensions.append(_SiteExtension())
    return config


def on_files(files, config):
    """Which repository files a page includes whole (pymdownx.snippets), so that links to them go to the page."""
    _state["included"] = {}
    for file in files.documentation_pages():
        for path in SNIPPET.findall(file.content_string):
            _state["included"][PurePosixPath(path).as_posix()] = file.src_uri
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    _state["page"] = page
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if FACTORIES_MARKER in markdown:
        markdown = markdown.replace(FACTORIES_MARKER, algorithm_factories())
    if page.file.src_uri == API_PAGE:
        for name in undocumented_public_names(markdown):
            log.warning(f"{API_PAGE}: dpfl.{name} is public (dpfl.__all__) but has no `::: ` entry")
    return markdown


def on_page_content(html: str, page, config, files) -> str:
    for tag in swallowed_words(html):
        log.warning(f"{page.file.src_uri}: <{tag}> is read as an HTML tag and disappears from the page; "
                    "write it in backticks (in a docstring too)")
    return html

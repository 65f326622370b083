"""The algorithm pages (docs/algorithms/) and the guides they replace run as written.

Each page's python blocks run in order as one script in a fresh directory (configs/ linked in), on digits with one or
two rounds. Each yaml block is a config: a block whose first line names a shipped config (``# configs/x.yaml``)
replaces that config's top-level sections with its own, any other block those of configs/demo.yaml, and the result
must pass dpfl's config validation, so a wrong key or value on a page fails here. The pages also keep to their size.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from doc_blocks import fenced

from dpfl import validate_config
from dpfl.experiment.config.loading import read_config_mapping
from dpfl.experiment.config.yaml_io import parse_yaml

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = sorted((ROOT / "docs" / "algorithms").glob("*.md"))
GUIDES = [ROOT / "docs" / f"{name}.md" for name in ("heterogeneous", "fdp", "splitting", "secure")]
PAGES = ALGORITHMS + GUIDES
BASE = re.compile(r"#\s*(configs/\S+\.ya?ml)")


def _blocks(page: Path, language: str) -> list[str]:
    return fenced(page.read_text(encoding="utf-8"), language)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT / "docs"))


def test_every_algorithm_has_a_page():
    from dpfl.algorithms.registry import algorithm_names

    index = (ROOT / "docs" / "algorithms" / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `(\w+)` \| \[[^]]+\]\((\w[\w-]*\.md)\)", index, re.M))
    assert {name for name, _ in listed} == set(algorithm_names())
    for name, page in listed:
        assert f"{name}" in (ROOT / "docs" / "algorithms" / page).read_text(encoding="utf-8"), (name, page)


def test_the_pages_keep_to_their_size():
    sizes = {_name(p): p.stat().st_size for p in PAGES}
    assert all(size <= 7000 for name, size in sizes.items() if name.startswith("algorithms/")), sizes
    assert all(size <= 6000 for name, size in sizes.items() if "/" not in name), sizes
    assert sum(sizes.values()) <= 60_000, sizes


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_yaml_blocks_are_valid_configs(page):
    for i, block in enumerate(_blocks(page, "yaml")):
        named = BASE.match(block.lstrip())
        config = read_config_mapping(ROOT / (named.group(1) if named else "configs/demo.yaml"))
        config.update(parse_yaml(block, f"{_name(page)} yaml block {i + 1}"))
        validate_config(config)


@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p, "python")], ids=_name)
def test_python_blocks_run_as_written(page, tmp_path, monkeypatch, clean_registries):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    namespace: dict = {"__name__": "docs_algorithms"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # run notices (e.g. client-level DP with few clients) are the page's point
        for i, block in enumerate(_blocks(page, "python")):
            exec(compile(block, f"{_name(page)} python block {i + 1}", "exec"), namespace)  # noqa: S102 - our docs

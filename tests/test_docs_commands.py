"""Every shell command the docs show is checked, not run: a `dpfl ...` line parses against the typer app (the command
exists, its options and arguments are accepted), and a repository file any command names exists (issue 66, item 3).
A config a `dpfl` command names is loaded with the command's `--set` overrides (it validates); a `make` target
and a `pip install -e '.[extras]'` exist. Paper-scale, Flower and make commands are never run."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import click
import pytest
import typer

from dpfl.cli.root import app
from doc_blocks import commands, dpfl_args, segments, words
from dpfl.experiment.config import load_config

ROOT = Path(__file__).resolve().parents[1]
REPO_DIRS = ("configs/", "docs/", "examples/", "scripts/", "benchmarks/", "src/", "tests/")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]


def parse(args: list[str]) -> dict:
    """Resolve the command path and parse its options and arguments as click would, without running it; the
    parsed parameters (none for --help)."""
    command: click.Command = typer.main.get_command(app)
    path = ["dpfl"]
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):
        sub = command.get_command(click.Context(command), args[0])
        if sub is None:
            raise click.UsageError(f"no command {' '.join([*path[1:], args[0]])!r}")
        path.append(args[0])
        command, args = sub, args[1:]
    if "--help" in args:
        return {}
    return command.make_context(" ".join(path), list(args), resilient_parsing=False).params


def named_files(parts: list[str]) -> list[str]:
    """Words that name a repository file (configs/..., docs/..., ...), not globs, placeholders or outputs."""
    return [p for p in parts if p.startswith(REPO_DIRS) and not re.search(r"[*<>$]|\{", p)]


CASES = [(page, line) for page in pages() for line in commands(page.read_text(encoding="utf-8"))]


def test_the_docs_show_commands():
    assert sum(dpfl_args(words(line)) is not None for _, line in CASES) > 50


MAKE_TARGETS = set(re.findall(r"^(\w[\w-]*):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M))
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"])


@pytest.mark.parametrize("page, line", CASES, ids=[f"{p.relative_to(ROOT)}:{i}" for i, (p, _) in enumerate(CASES)])
def test_each_shown_command_parses_and_names_existing_files(page: Path, line: str):
    where = f"{page.relative_to(ROOT)}: `{line}`"
    for parts in segments(words(line)):
        missing = [p for p in named_files(parts) if not (ROOT / p.split(":")[0]).exists()]
        assert not missing, f"{where} names {missing}, which do not exist"
        if parts[0] == "make":
            assert set(parts[1:]) <= MAKE_TARGETS, f"{where}: no such make target"
        if parts[:3] == ["pip", "install", "-e"] and len(parts) > 3:
            asked = re.fullmatch(r"\.(?:\[([\w,]+)\])?", parts[3])
            assert asked and set(filter(None, (asked.group(1) or "").split(","))) <= EXTRAS, f"{where}: no such extra"
        args = dpfl_args(parts)
        if args is None:
            continue
        try:
            params = parse(args)
        except click.ClickException as err:
            pytest.fail(f"{where} does not parse: {err.format_message()}")
        config = params.get("config")
        if isinstance(config, (str, Path)) and str(config).endswith((".yaml", ".yml")) and (ROOT / config).is_file():
            load_config(ROOT / config, list(params.get("set_") or []))  # the config and its overrides validate


def test_a_bad_command_or_option_fails_the_check():
    for bad in (["run", "configs/demo.yaml", "--no-such-option"], ["nosuchcommand"], ["data", "nosuch"]):
        with pytest.raises(click.ClickException):
            parse(bad)
    parse(["run", "configs/demo.yaml", "--set", "training.rounds=2", "--out", "runs/x"])
    assert words("OMP_NUM_THREADS=1 dpfl privacy epsilon [--json]  # note") == ["dpfl", "privacy", "epsilon", "--json"]
    assert words("pip install -e '.[ray,flower]'")[-1] == ".[ray,flower]"
    assert segments(words("mkdir -p x && make demo")) == [["mkdir", "-p", "x"], ["make", "demo"]]

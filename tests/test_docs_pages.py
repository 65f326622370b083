"""The getting-started pages, the concept pages and the FAQ run as written.

Each page's python blocks are executed in order as one script, in a temporary working directory that sees the
repository's configs (as tests/test_docs_api.py does for docs/api.md). Each ```bash line a user types is checked
without running it: a `dpfl ...` command parses against the typer app (command, options, types, required values),
the config files it names exist, and a `dpfl run` / `dpfl audit` config validates with its --set overrides; a
`make` target exists in the Makefile; a `pip install -e '.[...]'` names extras pyproject.toml defines. The
accountant outputs the pages print are what `dpfl privacy epsilon` prints today.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import click
import pytest
import typer.main

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*(ROOT / "docs" / "getting-started").glob("*.md"), *(ROOT / "docs" / "concepts").glob("*.md"),
                ROOT / "docs" / "faq.md"])
PYTHON = re.compile(r"```python\n(.*?)```", re.S)
BASH = re.compile(r"```bash\n(.*?)```", re.S)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _bash_lines(page: Path) -> list[str]:
    """The commands of a page's bash blocks, one per line, without comments."""
    lines = []
    for block in BASH.findall(page.read_text(encoding="utf-8")):
        for line in block.splitlines():
            command = line.split(" #")[0].strip()
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def parse_dpfl(args: list[str]) -> tuple[str, dict]:
    """Parse `dpfl ARGS` with the app's click command, as the CLI would, without invoking it: (command, params)."""
    from dpfl.cli.root import app

    group = typer.main.get_command(app)
    ctx = group.make_context("dpfl", list(args))
    leaf: click.Command = group
    while isinstance(leaf, click.Group):
        name, leaf, rest = leaf.resolve_command(ctx, [*getattr(ctx, "_protected_args", []), *ctx.args])
        ctx = leaf.make_context(name, rest, parent=ctx)
    return leaf.name or "", ctx.params


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    return tmp_path


@pytest.mark.parametrize("page", [p for p in PAGES if PYTHON.search(p.read_text(encoding="utf-8"))], ids=_name)
def test_the_python_blocks_run_as_written(page, in_tmp, capsys):
    if page.name == "run-directory.md":  # the page reads the demo's run directory: a short demo first
        import dpfl

        dpfl.run("configs/demo.yaml", overrides=["training.rounds=2"], out="runs/demo")
    namespace: dict = {"__name__": "docs_pages"}
    for i, block in enumerate(PYTHON.findall(page.read_text(encoding="utf-8"))):
        exec(compile(block, f"{_name(page)} block {i + 1}", "exec"), namespace)  # noqa: S102 - our own docs
    out = capsys.readouterr().out
    if page.name == "budgets.md":
        assert out.strip() == "6 0.99"
    if page.name == "accountants.md":
        assert out.split() == ["3.847", "3.527", "1.695"]
    if page.name == "rigorous.md":
        assert out.splitlines()[0] == "True ()" and out.splitlines()[1].startswith("False heuristic calibration")


def test_the_parser_check_refuses_what_the_cli_refuses():
    assert parse_dpfl(["privacy", "epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "2",
                       "--delta", "1e-5"])[0] == "epsilon"
    for bad in (["run", "configs/demo.yaml", "--bogus"], ["privacy", "epsilon", "--steps", "x"], ["nosuch"],
                ["run"]):
        with pytest.raises(click.ClickException):
            parse_dpfl(bad)


@pytest.mark.parametrize("page", [p for p in PAGES if _bash_lines(p)], ids=_name)
def test_the_shell_commands_parse_and_name_existing_files(page, capsys):
    from dpfl.experiment.config import load_config

    targets = set(re.findall(r"^(\w[\w-]*):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M))
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
                 ["project"]["optional-dependencies"])
    checked = 0
    for line in _bash_lines(page):
        for command in (c.strip() for c in line.split("&&")):
            words = shlex.split(command)
            if words[0] == "dpfl":
                try:
                    name, params = parse_dpfl(words[1:])
                except click.exceptions.Exit as done:  # --help
                    assert done.exit_code == 0, command
                    continue
                config = params.get("config")
                if config is not None:
                    assert (ROOT / config).is_file(), f"{_name(page)}: {command}: no {config}"
                    load_config(ROOT / config, list(params.get("set_") or []))  # the overrides validate
            elif words[0] == "make":
                assert set(words[1:]) <= targets, f"{_name(page)}: {command}: no such make target"
            elif words[:2] == ["pip", "install"] and words[2:3] == ["-e"]:
                asked = re.fullmatch(r"\.(?:\[([\w,]+)\])?", words[3])
                assert asked, command
                assert set(filter(None, (asked.group(1) or "").split(","))) <= extras, command
            checked += 1
            for word in words:  # every file of the repository a command names exists
                if word.startswith(("configs/", "src/", "scripts/", "benchmarks/")):
                    assert (ROOT / word).exists(), f"{_name(page)}: {command}: no {word}"
    capsys.readouterr()
    assert checked


def test_the_accountant_outputs_shown_are_todays():
    """The `dpfl privacy epsilon` lines pasted in the pages are what the command prints."""
    from cli_runner import cli

    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for line in _bash_lines(page):
            words = shlex.split(line)
            if words[:3] == ["dpfl", "privacy", "epsilon"]:
                code, out, _ = cli(*words[1:])
                assert code == 0 and out.strip() in text, f"{_name(page)}: {line} now prints {out.strip()}"

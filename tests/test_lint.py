"""The repository's Python passes its lint (ruff, configured in pyproject.toml): no unused or undefined names, no
line over 120 characters, no `zip` that does not say whether its inputs must be the same length, no closure made in
a loop that reads the loop variable late (flake8-bugbear's rules). Why a test: the suite is what CI runs, so a
finding fails CI instead of waiting for a reviewer to notice it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("src", "tests", "benchmarks", "scripts")


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_code_passes_its_lint():
    done = _ruff("check", "--no-cache", *CHECKED)
    assert done.returncode == 0, f"ruff check found problems (fix them, or `ruff check --fix`):\n{done.stdout}"


def test_the_lint_reads_the_repository_config(tmp_path):
    """The check above means something only if ruff applies pyproject.toml's rules: a file with an unused import,
    a 121-character line, a zip without strict= and a loop's closure that reads the loop variable late, checked with
    the repository's config, gives the four findings."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nx = " + repr("a" * 115) + "\ny = list(zip([1], [2]))\n"
                   "z = [lambda: i for i in range(3)]\n")
    assert len(bad.read_text().splitlines()[2]) == 121
    done = _ruff("check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad), cwd=tmp_path)
    assert done.returncode == 1
    assert all(code in done.stdout for code in ("F401", "E501", "B905", "B023")), done.stdout

"""dpfl's subpackages keep their layers (docs/layout.md): cli > reproduce > evaluate, flower > api >
experiment > algorithms, attacks, results > models > engine, data > privacy > seeding. A module imports only from
a lower layer or from a peer of its own layer, and no import cycle forms between subpackages. import-linter checks
the two contracts in pyproject.toml; why a test: the suite is what CI runs, so an import against the layers fails CI
instead of waiting for a reviewer to notice it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter on the `dpfl` package under root/src, with root's pyproject.toml (no cache: a copy in a
    temporary folder must not read the repository's graph)."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    return subprocess.run([str(LINT), str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_package_keeps_its_layers_and_has_no_cycle():
    done = _lint(ROOT)
    assert done.returncode == 0, f"an import breaks dpfl's layers (docs/layout.md):\n{done.stdout}"
    assert "2 kept, 0 broken" in done.stdout, done.stdout


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "src" / "dpfl", tmp_path / "src" / "dpfl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_an_import_from_a_higher_layer_breaks_the_layers(tmp_path):
    """The check above means something only if it fails on a real violation: privacy importing experiment (even
    inside a function, where the import runs late) is reported, naming the two subpackages."""
    root = _copy(tmp_path)
    with (root / "src/dpfl/privacy/budgets.py").open("a") as f:
        f.write("\n\ndef _late():\n    from dpfl.experiment.config import RunConfig\n    return RunConfig\n")
    done = _lint(root)
    assert done.returncode == 1, done.stdout
    assert "dpfl.privacy is not allowed to import dpfl.experiment" in done.stdout, done.stdout
    assert "dpfl's layers BROKEN" in done.stdout  # (and a cycle: experiment imports privacy)


def test_a_cycle_between_peers_breaks_the_acyclic_contract(tmp_path):
    """Peers of one layer may import each other one way: attacks -> results is allowed, but adding results ->
    attacks closes a cycle, which the second contract reports."""
    root = _copy(tmp_path)
    with (root / "src/dpfl/attacks/figures.py").open("a") as f:
        f.write("\nfrom dpfl.results.run_files import write_json_atomic  # noqa: E402,F401\n")
    with (root / "src/dpfl/results/formatting.py").open("a") as f:
        f.write("\nfrom dpfl.attacks.one_run import lower_bound  # noqa: E402,F401\n")
    done = _lint(root)
    assert done.returncode == 1, done.stdout
    assert "no import cycle between dpfl's subpackages BROKEN" in done.stdout, done.stdout
    assert "dpfl's layers KEPT" in done.stdout, done.stdout

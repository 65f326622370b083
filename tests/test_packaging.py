"""The wheel is what a user installs: build it, look inside, install it into a fresh venv and run `dpfl demo`.

The project is copied first (pyproject.toml, README, src/), so the build neither writes build/ or egg-info into
the working tree nor picks up files the project does not declare. The fresh venv gets no dependency downloads:
a .pth file puts this environment's site-packages (torch, numpy, ...) after its own, and the wheel is
installed with --no-deps. Build isolation fetches setuptools from the package index (or pip's cache).
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import dpfl

pytestmark = pytest.mark.integration  # every test builds the wheel (subprocesses, a fresh venv)

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300  # per command: a guard against a hung install, not a speed requirement


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(cmd: list[str | Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """(the wheel, what `pip wheel -v` printed)."""
    tmp = tmp_path_factory.mktemp("packaging")
    project = tmp / "project"
    project.mkdir()
    for name in ["pyproject.toml", "README.md", *(p.name for p in ROOT.glob("LICEN[CS]E*"))]:
        shutil.copy2(ROOT / name, project / name)
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    proc = _run([sys.executable, "-m", "pip", "wheel", project, "--no-deps", "-v", "-w", tmp / "dist"], cwd=tmp)
    wheels = list((tmp / "dist").glob("dpfl-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], proc.stdout + proc.stderr


def test_wheel_builds_without_setuptools_deprecation_warnings(built):
    _, output = built
    assert "Running command" in output  # -v: the backend's own output is in there
    bad = [line for line in output.splitlines() if re.search(r"deprecat|BuildBackendWarning", line, re.I)]
    assert not bad, "\n".join(bad)


def test_wheel_holds_the_package_data_entry_point_and_metadata(built):
    wheel, _ = built
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = f"dpfl-{dpfl.__version__}.dist-info"
        entry_points = configparser.ConfigParser()
        entry_points.read_string(zf.read(f"{info}/entry_points.txt").decode())
        metadata = zf.read(f"{info}/METADATA").decode()
    assert {"dpfl/py.typed", "dpfl/results/FORMATS.md", "dpfl/cli/__init__.py", "dpfl/__init__.py",
            "dpfl/flower/project/pyproject.toml", "dpfl/flower/project/dpfl_config.yaml"} <= names  # the guide's
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
    assert entry_points["console_scripts"]["dpfl"] == "dpfl.cli:main"
    assert f"\nVersion: {dpfl.__version__}\n" in metadata  # pyproject reads the version from dpfl.__version__
    assert "\nLicense-Expression: Apache-2.0\n" in metadata
    for extra in ("test", "bench", "ray", "flower", "parquet", "docs"):
        assert f"\nProvides-Extra: {extra}\n" in metadata


def test_installed_wheel_runs_the_demo_from_site_packages(built, tmp_path):
    wheel, _ = built
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path).stdout.strip())
    # this environment's dependencies, searched after the venv's own site-packages (a plain path: its .pth
    # files, such as an editable install of dpfl, are not processed)
    (site / "_dpfl_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel], cwd=tmp_path)

    where = _run([python, "-c", "import dpfl, dpfl.cli; print(dpfl.__file__); print(dpfl.cli.__file__)"],
                 cwd=tmp_path).stdout.split()
    for f in where:
        assert Path(f).resolve().is_relative_to(site.resolve()), f"{f} is not from the wheel installed in {site}"
        assert not Path(f).resolve().is_relative_to(ROOT), f"{f} is the source tree"
    assert (Path(where[0]).parent / "py.typed").is_file()

    run = tmp_path / "run"
    proc = _run([venv / "bin" / "dpfl", "demo", "--out", run], cwd=tmp_path)
    assert (run / "summary.json").is_file() and (run / "privacy.json").is_file()
    assert f"run directory: {run}" in proc.stdout

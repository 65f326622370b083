"""The ordered list of places a dataset may live: explicit root, $DPFL_DATA, user cache, system.

Kept apart from loading and downloading so the error message, ``available()`` and ``fetch`` all
describe the same places in the same order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dpfl.data.catalog import SourceSpec

DATA_ENV = "DPFL_DATA"
OFFLINE_ENV = "DPFL_OFFLINE"


@dataclass(frozen=True)
class Place:
    """One group of candidate directories and the source label they report (explicit, env, cache, system)."""

    source: str
    label: str
    dirs: tuple[Path, ...]


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/dpfl`` (default ``~/.cache/dpfl``): where ``fetch`` stores downloads."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "dpfl"


def offline() -> bool:
    """True when ``$DPFL_OFFLINE`` is set to a true value: resolution then never downloads."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def places(spec: SourceSpec, root: str | Path | None = None) -> list[Place]:
    """Candidate directories for ``spec``, in resolution order."""
    out = []
    if root is not None:
        base = Path(root).expanduser()
        out.append(Place("explicit", f"root={base}", _under(base, spec, include_base=True)))
    env = os.environ.get(DATA_ENV)
    if env:
        base = Path(env).expanduser()
        out.append(Place("env", f"${DATA_ENV}={base}", _under(base, spec, include_base=True)))
    cache = cache_root()
    out.append(Place("cache", f"user cache {cache}", _under(cache, spec, include_base=False)))
    if spec.system_dirs:
        out.append(Place("system", "system", tuple(spec.system_dirs)))
    return out


def find_file(directory: Path, name: str) -> Path | None:
    """``directory/name`` or, failing that, ``directory/name.gz``."""
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def match_dir(directory: Path, spec: SourceSpec) -> dict[str, Path] | None:
    """Map each required file to its path if ``directory`` holds all of them, else None."""
    if not directory.is_dir():
        return None
    found = {}
    for name in spec.files:
        path = find_file(directory, name)
        if path is None:
            return None
        found[name] = path
    return found


def _under(base: Path, spec: SourceSpec, include_base: bool) -> tuple[Path, ...]:
    dirs = [base / sub for sub in spec.subdirs]
    if include_base:
        dirs.append(base)
    return tuple(dirs)

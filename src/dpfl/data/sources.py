"""Resolve where a dataset's files are: explicit root, $DPFL_DATA, user cache, system, then download.

The first directory holding every required file wins. When none does and a download is allowed
and possible, the files are fetched into the user cache. Otherwise the error names every directory
tried and the command that gets the data, because "file not found" alone sends users searching.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dpfl.data.catalog import EMBEDDED, EMNIST_SPLITS, FILE_BACKED, SourceSpec, source_spec
from dpfl.data.download import fetch
from dpfl.data.errors import DatasetNotFoundError
from dpfl.data.locations import cache_root, match_dir, offline, places

__all__ = ["Location", "locate", "available", "fetch", "DatasetNotFoundError"]


@dataclass(frozen=True)
class Location:
    """Where a dataset was found: its directory, which rule found it, and the path of each file."""

    name: str
    path: Path
    source: str  # "explicit" | "env" | "cache" | "system" | "download"
    files: dict[str, Path] = field(default_factory=dict)

    def file(self, name: str) -> Path:
        return self.files[name]


def find_local(spec: SourceSpec, root: str | Path | None = None) -> Location | None:
    """The first local directory holding all of ``spec``'s files, without downloading."""
    for place in places(spec, root):
        for directory in place.dirs:
            files = match_dir(directory, spec)
            if files is not None:
                return Location(spec.name, directory, place.source, files)
    return None


def locate(
    name: str, root: str | Path | None = None, *, download: bool = True, split: str | None = None
) -> Location:
    """Find ``name``'s files (downloading into the cache as a last resort) or raise DatasetNotFoundError.

    ``download=False`` or ``$DPFL_OFFLINE=1`` skips the download step.
    """
    spec = source_spec(name, split=split)
    found = find_local(spec, root)
    if found is not None:
        return found
    failure = None
    if spec.fetchable and download and not offline():
        try:
            directory = fetch(name)
        except OSError as exc:  # network failure; a ChecksumError (ValueError) propagates as is
            failure = str(exc)
        else:
            files = match_dir(directory, spec)
            if files is not None:
                return Location(spec.name, directory, "download", files)
            failure = f"downloaded into {directory} but the files are incomplete"
    raise DatasetNotFoundError(_not_found_message(spec, root, download, failure))


def available(root: str | Path | None = None) -> list[dict]:
    """One row per dataset (and per EMNIST split found) describing what is usable without a download.

    Each row has ``name``, ``path`` (a Path, or None), ``source`` (explicit/env/cache/system,
    embedded/generated, or ``missing``), ``fetchable`` and ``options`` (e.g. the EMNIST split).
    """
    rows: list[dict] = []
    for name, source in EMBEDDED.items():
        rows.append({"name": name, "path": None, "source": source, "fetchable": False, "options": {}})
    for name in FILE_BACKED:
        splits = list(EMNIST_SPLITS) if name == "emnist" else [None]
        found_any = False
        for split in splits:
            spec = source_spec(name, split=split)
            loc = find_local(spec, root)
            if loc is not None:
                found_any = True
                rows.append(
                    {"name": name, "path": loc.path, "source": loc.source, "fetchable": spec.fetchable,
                     "options": dict(spec.options)}
                )
        if not found_any:
            spec = source_spec(name)
            rows.append(
                {"name": name, "path": None, "source": "missing", "fetchable": spec.fetchable,
                 "options": dict(spec.options)}
            )
    return rows


def _not_found_message(spec: SourceSpec, root: str | Path | None, download: bool, failure: str | None) -> str:
    options = "".join(f" ({k}={v})" for k, v in spec.options.items())
    wanted = ", ".join(f"{f}[.gz]" for f in spec.files)
    lines = [f"dataset {spec.name!r}{options} not found. Looked for {wanted} in:"]
    if root is None:
        lines.append("  - explicit root: not given")
    if not any(p.source == "env" for p in places(spec, root)):
        lines.append("  - $DPFL_DATA: not set")
    for place in places(spec, root):
        lines.append(f"  - {place.label}:")
        lines.extend(f"      {d}" for d in place.dirs)
    if not spec.system_dirs:
        lines.append(f"  - system: no known OS package installs {spec.name}")
    if spec.fetchable:
        if failure is not None:
            lines.append(f"  - download from {spec.base_url}: failed: {failure}")
        elif not download:
            lines.append(f"  - download from {spec.base_url}: skipped (download=False)")
        else:
            lines.append(f"  - download from {spec.base_url}: skipped ($DPFL_OFFLINE is set)")
    lines.append("To get it:")
    if spec.fetchable:
        lines.append(f"  dpfl data fetch {spec.name}    (downloads into {cache_root() / spec.name})")
    if spec.name == "fashion_mnist":
        lines.append("  or, on Debian/Ubuntu: sudo apt-get install dataset-fashion-mnist")
    if spec.manual:
        lines.append(f"  {spec.manual}")
    lines.append(f"  or put the files in $DPFL_DATA/{spec.name}/ or pass root=<directory>.")
    return "\n".join(lines)

"""Download a dataset into the cache, all-or-nothing, keeping only bytes whose checksum matches.

Files are fetched into a staging directory next to the target, verified, and only then renamed
into place (a rename within one filesystem is atomic), so an interrupted or tampered download
never leaves a file that a later load would trust.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import shutil
import tempfile
import urllib.request
import zlib
from pathlib import Path
from typing import BinaryIO

from dpfl.data.catalog import RemoteFile, SourceSpec, source_spec
from dpfl.data.errors import ChecksumError
from dpfl.data.locations import cache_root

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


def _open_url(url: str, timeout: float) -> BinaryIO:
    """Open ``url`` for reading; a seam that tests replace to serve bytes without a network."""
    return urllib.request.urlopen(url, timeout=timeout)  # noqa: S310 (http/file URLs are intended)


def content_matches(data: bytes, remote: RemoteFile) -> bool:
    """True if ``data`` is the official archive, or a (re)compressed/uncompressed copy of its content."""
    if hashlib.sha256(data).hexdigest() == remote.sha256 and hashlib.md5(data).hexdigest() == remote.md5:
        return True
    if remote.raw_sha256 is None:
        return False
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error):
            return False
    return hashlib.sha256(data).hexdigest() == remote.raw_sha256


def verify_file(path: str | Path, remote: RemoteFile) -> None:
    """Raise ChecksumError unless the file at ``path`` is the official content of ``remote``."""
    if not content_matches(Path(path).read_bytes(), remote):
        raise ChecksumError(
            f"{path}: checksum mismatch for {remote.filename} (expected sha256 {remote.sha256} / md5 {remote.md5}"
            + (f", or sha256 {remote.raw_sha256} once decompressed" if remote.raw_sha256 else "")
            + ")"
        )


def fetch(name: str, root: str | Path | None = None, *, base_url: str | None = None, timeout: float = 60.0) -> Path:
    """Download ``name`` into ``root/<name>`` (default: the user cache) and return that directory.

    Files already present with the right checksum are kept. ``base_url`` replaces the official
    server (a mirror, or a ``file://`` directory); checksums are verified either way.
    """
    spec = source_spec(name)
    if not spec.fetchable:
        raise ValueError(f"dataset {name!r} has no download URL; to get it: {spec.manual}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    base = (Path(root).expanduser() if root is not None else cache_root())
    target = base / spec.name
    missing = [r for r in spec.remote if not _valid_in(target, r)]
    if not missing:
        return target
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}-download-", dir=base))
    try:
        for remote in missing:
            _download_one(spec, remote, staging, base_url or spec.base_url, timeout)
        target.mkdir(parents=True, exist_ok=True)
        for remote in missing:
            os.replace(staging / remote.filename, target / remote.filename)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _valid_in(directory: Path, remote: RemoteFile) -> bool:
    path = directory / remote.filename
    return path.is_file() and content_matches(path.read_bytes(), remote)


def _download_one(spec: SourceSpec, remote: RemoteFile, staging: Path, base_url: str, timeout: float) -> None:
    url = base_url.rstrip("/") + "/" + remote.filename
    log.info("downloading %s", url)
    dest = staging / remote.filename
    try:
        with _open_url(url, timeout) as response, open(dest, "wb") as out:
            while chunk := response.read(_CHUNK):
                out.write(chunk)
    except OSError as exc:  # URLError, HTTPError, timeouts and disk errors are all OSErrors
        raise OSError(f"could not download {url} for dataset {spec.name!r}: {exc}") from exc
    data = dest.read_bytes()
    if not content_matches(data, remote):
        raise ChecksumError(
            f"checksum mismatch for {url} ({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}); "
            f"expected sha256 {remote.sha256}. Nothing was written to the cache."
        )

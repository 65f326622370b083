"""Reader and writer for the IDX format of MNIST-family files (idx1 labels, idx3 images).

Compression is detected from the gzip magic bytes, not from the file name, because people gunzip
files and keep the name (or the reverse). Every size is checked against the header so a truncated
download is reported as such instead of producing a mis-shaped array.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

GZIP_MAGIC = b"\x1f\x8b"

# IDX type byte -> big-endian numpy dtype.
_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


class IdxFormatError(ValueError):
    """The bytes are not a well-formed IDX file (bad magic, wrong size, corrupt compression)."""


def read_bytes(path: str | Path) -> bytes:
    """The file's content, decompressed when it starts with the gzip magic."""
    path = Path(path)
    data = path.read_bytes()
    if data[:2] != GZIP_MAGIC:
        return data
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as exc:
        raise IdxFormatError(f"{path}: corrupt or truncated gzip data ({exc})") from None


def parse_idx(data: bytes, source: str = "<bytes>", ndim: int | None = None) -> np.ndarray:
    """Decode IDX bytes into an array in native byte order; ``ndim`` pins the expected rank."""
    if len(data) < 4:
        raise IdxFormatError(f"{source}: {len(data)} bytes is too short for an IDX header")
    zero, type_code, rank = struct.unpack(">HBB", data[:4])
    if zero != 0 or type_code not in _DTYPES or rank == 0:
        raise IdxFormatError(
            f"{source}: bad IDX magic number 0x{data[:4].hex()}; expected 0x0000TTNN with a type byte "
            f"TT in {{08, 09, 0b, 0c, 0d, 0e}} and NN >= 1 dimensions (e.g. 00000801 labels, 00000803 images)"
        )
    if ndim is not None and rank != ndim:
        kind = {1: "an idx1 label", 3: "an idx3 image"}.get(ndim, f"a {ndim}-d IDX")
        raise IdxFormatError(f"{source}: expected {kind} file, but the header declares {rank} dimensions")
    header = 4 + 4 * rank
    if len(data) < header:
        raise IdxFormatError(f"{source}: truncated header ({len(data)} bytes, need {header})")
    shape = struct.unpack(f">{rank}I", data[4:header])
    dtype = _DTYPES[type_code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "has trailing bytes"
        raise IdxFormatError(
            f"{source}: file {what}: header declares shape {shape} ({expected} bytes in all), "
            f"found {len(data)} bytes"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    # A copy: frombuffer views are read-only and torch warns on them.
    return array.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: str | Path, ndim: int | None = None) -> np.ndarray:
    """Read an IDX file, gzipped or not."""
    path = Path(path)
    return parse_idx(read_bytes(path), source=str(path), ndim=ndim)


def write_idx(path: str | Path, array: np.ndarray, compress: bool = False) -> Path:
    """Write ``array`` as IDX (gzipped if ``compress``); used to build fixtures and small exports."""
    array = np.asarray(array)
    codes = {dt.newbyteorder("="): code for code, dt in _DTYPES.items()}
    native = array.dtype.newbyteorder("=")
    if native not in codes:
        raise ValueError(
            f"array dtype {array.dtype} has no IDX type; allowed: uint8, int8, int16, int32, float32, float64"
        )
    if array.ndim == 0:
        raise ValueError("array must have at least one dimension")
    code = codes[native]
    header = struct.pack(">HBB", 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + np.ascontiguousarray(array, dtype=_DTYPES[code]).tobytes()
    if compress:
        payload = gzip.compress(payload, mtime=0)
    path = Path(path)
    path.write_bytes(payload)
    return path

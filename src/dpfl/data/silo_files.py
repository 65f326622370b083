"""One client's records from its own file or folder, checked against the declared schema: `load_silo`.

Formats, chosen by the path: ``.csv`` (a header row naming the declared feature columns and the label column),
``.npz`` (arrays ``x`` [N, *shape] and ``y`` [N]), a folder with ``x.npy`` and ``y.npy``, ``.parquet``/``.pq``
(through pyarrow, the ``parquet`` extra), and a folder of images with one sub-folder per class.

Every silo is read alone, so a federated node can load only its own (`load_silo`), and every check is made on it:
the same columns and dtypes as declared, integer labels within the declared classes, no NaN or infinity, at least
one record. Each failure is one `DataError` line naming the file and the line, record or column.
"""

from __future__ import annotations

import csv
import math
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpfl.data.errors import DataError
from dpfl.data.federated import ClientData
from dpfl.data.schema import Scaling, SiloSchema, as_scaling

__all__ = ["FORMATS", "load_silo", "read_records", "silo_format"]

FORMATS = ("csv", "npz", "npy", "parquet", "images")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def silo_format(source: str | Path) -> str:
    """The format of a silo path (one of FORMATS), from its suffix or, for a folder, its contents."""
    path = Path(source)
    if path.is_dir():
        return "npy" if (path / "x.npy").exists() or (path / "y.npy").exists() else "images"
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        raise DataError(f"{path}: a .npy file holds one array; put x.npy (records) and y.npy (labels) in one folder "
                        "and name the folder")
    formats = {".csv": "csv", ".npz": "npz", ".parquet": "parquet", ".pq": "parquet"}
    if suffix not in formats:
        raise DataError(f"{path}: unknown format {suffix or '(no suffix)'!r}; a silo is a .csv, .npz, .parquet file, "
                        "a folder with x.npy and y.npy, or a folder of images with one sub-folder per class")
    return formats[suffix]


def read_records(source: str | Path, schema: SiloSchema,
                 scaling: Scaling | Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 [N, *record_shape], y int64 [N]) from one file or folder, checked against `schema`, then scaled
    (`scaling`: a `Scaling`, ``{"mean": [...], "std": [...]}``, or None / "none")."""
    scaling = as_scaling(scaling)
    path = Path(source)
    kind = silo_format(path)
    if schema.is_table != (kind in ("csv", "parquet")):
        want = "a table (.csv or .parquet)" if schema.is_table else "arrays or images (the schema declares a shape)"
        raise DataError(f"{path}: a {kind} silo, but the schema's features describe {want}")
    try:
        x, y = {"csv": _read_csv, "npz": _read_npz, "npy": _read_npy, "parquet": _read_parquet,
                "images": _read_images}[kind](path, schema)
    except DataError:
        raise
    except (OSError, ValueError, EOFError, csv.Error, zipfile.BadZipFile) as err:  # unreadable, truncated, not
        # the format its name says
        raise DataError(f"{path}: cannot read it as {kind} ({type(err).__name__}: {' '.join(str(err).split())})") \
            from None
    _check(path, x, y, schema)
    if scaling is not None:
        scaling.check(schema)
        x = scaling.apply(x)
    return x.astype(np.float32, copy=False), y.astype(np.int64, copy=False)


def load_silo(source: str | Path, schema: SiloSchema, *, scaling: Scaling | Any = None) -> ClientData:
    """One client's data from its file or folder, checked against `schema`: every record is a training record.

    A node of a federated deployment calls this on its own silo only; `dpfl.data.silos.federated_files` calls it on
    each silo of a simulation. Raises `DataError` (one line naming the file and the row or column).
    """
    x, y = read_records(source, schema, scaling)
    xt, yt = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))
    return ClientData(xt, yt, xt[:0].clone(), yt[:0].clone())


# ---- checks shared by every format -----------------------------------------------------------------------------


def _check(path: Path, x: np.ndarray, y: np.ndarray, schema: SiloSchema) -> None:
    unit, first = "record", 0  # a CSV's cells and labels are checked as they are read, with their line numbers
    if len(y) == 0:
        raise DataError(f"{path}: no records (a silo needs at least one)")
    if tuple(x.shape[1:]) != schema.record_shape:
        raise DataError(f"{path}: records have shape {list(x.shape[1:])}, the schema declares "
                        f"{list(schema.record_shape)}")
    if x.dtype.kind == "f":
        bad = ~np.isfinite(x.reshape(len(x), -1))
        if bad.any():
            row, col = map(int, np.argwhere(bad)[0])
            where = f"column {schema.features[col][0]!r}" if schema.features else f"value {col}"
            raise DataError(f"{path}, {unit} {row + first}, {where}: NaN or infinite value")
    outside = (y < 0) | (y >= schema.n_classes)
    if outside.any():
        row = int(np.flatnonzero(outside)[0])
        raise DataError(f"{path}, {unit} {row + first}: label {int(y[row])} is outside the {schema.n_classes} "
                        f"declared classes (0..{schema.n_classes - 1}; schema n_classes)")


def _columns(path: Path, have: list[str], schema: SiloSchema) -> None:
    """The file's columns are exactly the declared features and the label (in any order), each once."""
    assert schema.features is not None
    wanted = [n for n, _ in schema.features] + [schema.label]
    for name in have:
        if have.count(name) > 1:
            raise DataError(f"{path}: column {name!r} appears {have.count(name)} times")
    missing = [c for c in wanted if c not in have]
    if missing:
        raise DataError(f"{path}: column {missing[0]!r} is missing (declared: {', '.join(wanted)}; the file has: "
                        f"{', '.join(have)})")
    extra = [c for c in have if c not in wanted]
    if extra:
        raise DataError(f"{path}: column {extra[0]!r} is not declared in the schema (declared: {', '.join(wanted)})")


def _int_range(path: Path, lines: list[int], column: str, values: np.ndarray, dtype: str) -> None:
    info = np.iinfo(np.dtype(dtype))
    out = (values < info.min) | (values > info.max)
    if out.any():
        row = int(np.flatnonzero(out)[0])
        raise DataError(f"{path}, line {lines[row]}, column {column!r}: {int(values[row])} does not fit {dtype}")


# ---- the formats -----------------------------------------------------------------------------------------------


def _read_csv(path: Path, schema: SiloSchema) -> tuple[np.ndarray, np.ndarray]:
    assert schema.features is not None
    with path.open(newline="", encoding="utf-8-sig") as file:
        reader = csv.reader(file)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file (a CSV silo starts with a header row naming its columns)")
        header = [h.strip() for h in header]
        _columns(path, header, schema)
        cols = [(header.index(n), n, k) for n, k in schema.features]
        label_at = header.index(schema.label)
        rows: list[list[float | int]] = []
        labels: list[int] = []
        lines: list[int] = []
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue  # a blank line
            line = reader.line_num
            if len(row) != len(header):
                raise DataError(f"{path}, line {line}: {len(row)} fields, the header has {len(header)}")
            rows.append([_cell(path, line, name, row[i], kind) for i, name, kind in cols])
            labels.append(_label(path, line, schema.label, row[label_at], schema.n_classes))
            lines.append(line)
    x = np.array(rows, dtype=np.float64).reshape(len(rows), len(cols))
    for j, (_, name, kind) in enumerate(cols):
        if kind.startswith(("int", "uint")):
            _int_range(path, lines, name, x[:, j], kind)
    return x, np.array(labels, dtype=np.int64)


def _cell(path: Path, line: int, column: str, text: str, kind: str) -> float | int:
    text = text.strip()
    if not text:
        raise DataError(f"{path}, line {line}, column {column!r}: missing value")
    try:
        value: float | int = int(text) if kind.startswith(("int", "uint")) else float(text)
    except ValueError:
        what = "an integer" if kind.startswith(("int", "uint")) else "a number"
        raise DataError(f"{path}, line {line}, column {column!r}: {text!r} is not {what} (declared {kind})") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise DataError(f"{path}, line {line}, column {column!r}: NaN or infinite value {text!r}")
    return value


def _label(path: Path, line: int, column: str, text: str, n_classes: int) -> int:
    text = text.strip()
    try:
        label = int(text)
    except ValueError:
        raise DataError(f"{path}, line {line}, column {column!r}: label {text!r} is not an integer class index") \
            from None
    if not 0 <= label < n_classes:
        raise DataError(f"{path}, line {line}, column {column!r}: label {label} is outside the {n_classes} declared "
                        f"classes (0..{n_classes - 1}; schema n_classes)")
    return label


def _arrays(path: Path, x: np.ndarray, y: np.ndarray, schema: SiloSchema) -> tuple[np.ndarray, np.ndarray]:
    if x.dtype != np.dtype(schema.dtype):
        raise DataError(f"{path}: x has dtype {x.dtype}, the schema declares {schema.dtype}")
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise DataError(f"{path}: y must be a 1-d array of integer class indices, got {y.dtype} of shape "
                        f"{list(y.shape)}")
    if x.ndim < 1 or x.shape[0] != y.shape[0]:
        raise DataError(f"{path}: x has {x.shape[0] if x.ndim else 0} records and y {y.shape[0]} labels")
    return x, y


def _read_npz(path: Path, schema: SiloSchema) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path, allow_pickle=False) as archive:
        missing = [k for k in ("x", "y") if k not in archive.files]
        if missing:
            raise DataError(f"{path}: array {missing[0]!r} is missing (an NPZ silo holds x and y; it has: "
                            f"{', '.join(archive.files) or 'nothing'})")
        return _arrays(path, archive["x"], archive["y"], schema)


def _read_npy(path: Path, schema: SiloSchema) -> tuple[np.ndarray, np.ndarray]:
    for name in ("x.npy", "y.npy"):
        if not (path / name).exists():
            raise DataError(f"{path}: {name} is missing (an NPY silo is a folder with x.npy and y.npy)")
    return _arrays(path, np.load(path / "x.npy", allow_pickle=False), np.load(path / "y.npy", allow_pickle=False),
                   schema)


def _read_parquet(path: Path, schema: SiloSchema) -> tuple[np.ndarray, np.ndarray]:
    assert schema.features is not None
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow: pip install 'dpfl[parquet]'") from None
    table = pq.read_table(path)
    _columns(path, list(table.column_names), schema)
    columns = []
    for name, kind in [*schema.features, (schema.label, "int64")]:
        col = table.column(name)
        if col.null_count:
            row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise DataError(f"{path}, record {row}, column {name!r}: missing value (null)")
        try:
            stored = np.dtype(col.type.to_pandas_dtype())
        except (NotImplementedError, TypeError):
            stored = None
        if name == schema.label:
            if stored is None or stored.kind not in "iu":
                raise DataError(f"{path}: label column {name!r} is {col.type}, not integer class indices")
        elif stored != np.dtype(kind):
            raise DataError(f"{path}: column {name!r} is {col.type} ({stored}), the schema declares {kind}")
        columns.append(col.to_numpy())
    x = np.stack(columns[:-1], axis=1) if len(table) else np.empty((0, len(columns) - 1))
    return x.astype(np.float64), columns[-1].astype(np.int64)


def _read_images(path: Path, schema: SiloSchema) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image, UnidentifiedImageError  # matplotlib's dependency, so always installed with dpfl

    shape = schema.shape or ()
    if len(shape) != 3 or shape[0] not in (1, 3):
        raise DataError(f"{path}: an image folder needs schema shape [channels, height, width] with 1 or 3 channels, "
                        f"got {list(shape)}")
    names = list(schema.classes) if schema.classes else [str(k) for k in range(schema.n_classes)]
    folders = sorted(p for p in path.iterdir() if not p.name.startswith("."))
    for p in folders:
        if not p.is_dir():
            raise DataError(f"{path}: {p.name!r} is not a class folder (an image silo holds one sub-folder per class: "
                            f"{', '.join(names)})")
        if p.name not in names:
            raise DataError(f"{p}: folder {p.name!r} is not a declared class (label outside the classes; declared: "
                            f"{', '.join(names)})")
    images, labels = [], []
    mode = "L" if shape[0] == 1 else "RGB"
    for folder in folders:
        for file in sorted(f for f in folder.iterdir() if not f.name.startswith(".")):
            if file.suffix.lower() not in IMAGE_SUFFIXES:
                raise DataError(f"{file}: not an image ({', '.join(IMAGE_SUFFIXES)})")
            try:
                with Image.open(file) as img:
                    pixels = np.asarray(img.convert(mode), dtype=np.uint8)
            except (UnidentifiedImageError, OSError) as err:
                raise DataError(f"{file}: cannot read the image ({' '.join(str(err).split())})") from None
            if pixels.shape[:2] != shape[1:]:
                raise DataError(f"{file}: image is {pixels.shape[0]}x{pixels.shape[1]} (height x width), the schema "
                                f"declares {shape[1]}x{shape[2]}")
            images.append(pixels.reshape(shape[1], shape[2], -1).transpose(2, 0, 1))
            labels.append(names.index(folder.name))
    x = np.stack(images).astype(np.float32) / 255.0 if images else np.empty((0, *shape), dtype=np.float32)
    return x, np.array(labels, dtype=np.int64)

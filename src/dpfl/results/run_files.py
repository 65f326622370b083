"""Read and write the files of a run directory (formats: ``FORMATS.md`` in this folder).

Readers turn a directory that is not a dpfl run, or a missing or corrupt file, into one
:class:`RunDirError` that names the directory and the file. Writers are crash-safe in the way the
experiment layer needs:

- :func:`write_json_atomic` / :func:`write_text_atomic`: a temporary file in the same directory,
  fsync, ``os.replace``; a reader sees the old file or the new one, never half of one.
- :func:`append_jsonl`: one line per call, flushed and fsynced before returning.
- :func:`truncate_jsonl`: on resume, keep the rows the checkpoint knows about and drop any partial
  line left by a killed writer. It refuses (and changes nothing) when a complete line is damaged: a
  damaged middle line is not the trace of a kill, and cutting there could destroy good rows.

A damaged file is never repaired or rewritten by a reader: the error says what is wrong and what the
user can do (usually: delete the file and resume, which rebuilds it from ``checkpoint.pt``).

JSON numbers: Python's ``json`` writes ``Infinity``/``NaN`` for non-finite floats and reads them back;
the privacy ledger writes them as the strings ``"inf"``/``"nan"``. :func:`as_float` accepts both.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CONFIG_FILE",
    "SAVED_CONFIG_END",
    "SAVED_CONFIG_HEADER",
    "METRICS_FILE",
    "PRIVACY_FILE",
    "SUMMARY_FILE",
    "REPORT_FILE",
    "PLOTS_DIR",
    "RunDirError",
    "as_float",
    "as_number",
    "is_run_dir",
    "last_number",
    "read_metrics",
    "read_privacy",
    "read_summary",
    "read_config_text",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
    "append_jsonl",
    "truncate_jsonl",
    "complete_jsonl_rows",
    "canonical_json",
    "stale_temp_files",
    "training_time",
]

CONFIG_FILE = "config.yaml"
# dpfl writes a resolved config between these two lines (dpfl.config_to_yaml); older run directories have neither
SAVED_CONFIG_HEADER = "# dpfl resolved config: every field; the last line ends it\n"
SAVED_CONFIG_END = "# end of config\n"
METRICS_FILE = "metrics.jsonl"
PRIVACY_FILE = "privacy.json"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
PLOTS_DIR = "plots"

# Any of these marks a directory as a dpfl run directory.
_MARKERS = (CONFIG_FILE, METRICS_FILE, PRIVACY_FILE, SUMMARY_FILE)


class RunDirError(ValueError):
    """A directory is not a dpfl run directory, or one of its files is missing or corrupt."""

    def __init__(self, run_dir: str | os.PathLike[str], problem: str, file: str | None = None):
        self.run_dir = Path(run_dir)
        self.file = file
        self.problem = problem
        where = f"{self.run_dir / file}" if file else f"{self.run_dir}"
        super().__init__(f"{where}: {problem}")


# ---------------------------------------------------------------------------------------- helpers
def as_float(x: Any) -> float | None:
    """A number from a run file as a float: ``None`` stays ``None``; ``"inf"``/``"-inf"``/``"nan"``
    (the ledger's encoding) become floats. Anything else is a ``ValueError``."""
    if x is None:
        return None
    if isinstance(x, bool):
        raise ValueError(f"expected a number, got {x!r}")
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and x in ("inf", "-inf", "nan", "Infinity", "-Infinity", "NaN"):
        return float(x.replace("Infinity", "inf"))
    raise ValueError(f"expected a number, got {x!r}")


def as_number(x: Any) -> float | None:
    """``as_float`` for ranking and tables: None for missing, non-numeric or NaN values (inf is kept)."""
    try:
        v = as_float(x)
    except ValueError:
        return None
    return None if v is None or math.isnan(v) else v


def last_number(rows: Iterable[Mapping[str, Any]], key: str) -> float | None:
    """The last numeric value of `key` over metrics rows (rounds without it, or with null or NaN, are skipped)."""
    found = None
    for row in rows:
        value = as_number(row.get(key))
        if value is not None:
            found = value
    return found


def is_run_dir(run_dir: str | os.PathLike[str]) -> bool:
    """True when ``run_dir`` is a directory holding at least one of the run files."""
    d = Path(run_dir)
    return d.is_dir() and any((d / m).is_file() for m in _MARKERS)


def _require_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    d = Path(run_dir)
    if not d.exists():
        raise RunDirError(d, "no such directory")
    if not d.is_dir():
        raise RunDirError(d, "not a directory")
    if not is_run_dir(d):
        raise RunDirError(d, f"not a dpfl run directory (none of {', '.join(_MARKERS)} is there)")
    return d


def _read_text(d: Path, name: str) -> str:
    path = d / name
    if not path.is_file():
        raise RunDirError(d, "missing (is this a dpfl run directory?)", name)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise _damaged(d, name, f"corrupt: not UTF-8 text ({_one_line(e)})") from e
    except OSError as e:
        raise RunDirError(d, f"cannot be read: {_one_line(e)}", name) from e


def _rebuild_hint(d: Path, name: str) -> str:
    """What the user can do about a damaged ``name`` (one clause, no newline)."""
    if name == CONFIG_FILE:
        return ("nothing was changed; the run's saved config is lost: restore config.yaml from a copy, or re-run "
                "the experiment into a new --out")
    also = "" if name == SUMMARY_FILE else " (and summary.json, if present)"
    return (f"nothing was changed; if checkpoint.pt is still there, delete {name}{also} and resume with "
            f"`dpfl run CONFIG --out {d} --resume` to rebuild it from the checkpoint, otherwise the run must be re-run")


def _damaged(d: Path, name: str, problem: str) -> RunDirError:
    return RunDirError(d, f"{problem}; {_rebuild_hint(d, name)}", name)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or _one_line(e)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


def _read_json_object(d: Path, name: str) -> dict[str, Any]:
    text = _read_text(d, name)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        what = "corrupt: empty" if not text.strip() else f"corrupt: not valid JSON ({e})"
        raise _damaged(d, name, what) from e
    if not isinstance(obj, dict):
        raise _damaged(d, name, f"corrupt: expected a JSON object, found {type(obj).__name__}")
    return obj


# ---------------------------------------------------------------------------------------- readers
def read_metrics(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The per-round rows of ``metrics.jsonl``, in order.

    An empty file gives ``[]`` (no round finished yet). A last line without its newline that is not
    valid JSON is the trace of a writer killed mid-append: it is ignored (resuming truncates it).
    Any other bad line, or rounds out of order, is a :class:`RunDirError` with the line number.
    """
    d = _require_run_dir(run_dir)
    text = _read_text(d, METRICS_FILE)
    lines = text.split("\n")
    partial = lines.pop()  # "" when the file ends with a newline
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines + ([partial] if partial.strip() else []), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) + 1:  # trailing partial line
                break
            raise _damaged(d, METRICS_FILE, f"corrupt: line {i} is not valid JSON ({e})") from e
        if not isinstance(row, dict) or not isinstance(row.get("round"), int) or isinstance(row["round"], bool):
            raise _damaged(d, METRICS_FILE,
                           f"corrupt: line {i} is not a metrics row (a JSON object with an integer 'round')")
        if rows and row["round"] <= rows[-1]["round"]:
            raise _damaged(d, METRICS_FILE,
                           f"corrupt: line {i}: round {row['round']} follows round {rows[-1]['round']}")
        rows.append(row)
    return rows


def read_privacy(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``privacy.json``: the declared threat model and, when accounted, each client's budget and spend."""
    d = _require_run_dir(run_dir)
    obj = _read_json_object(d, PRIVACY_FILE)
    if not isinstance(obj.get("accounted"), bool):
        raise _damaged(d, PRIVACY_FILE, "corrupt: has no boolean 'accounted' field")
    clients = obj.get("clients")
    if clients is not None and not (isinstance(clients, list) and all(isinstance(c, dict) for c in clients)):
        raise _damaged(d, PRIVACY_FILE, "corrupt: 'clients' must be a list of objects")
    return obj


def read_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``summary.json``, or ``None`` when it is absent (the run did not finish)."""
    d = _require_run_dir(run_dir)
    if not (d / SUMMARY_FILE).exists():
        return None
    return _read_json_object(d, SUMMARY_FILE)


def read_config_text(run_dir: str | os.PathLike[str]) -> str:
    """The resolved config saved with the run, as text.

    Checked, not interpreted: it must be a YAML mapping that ends with a newline (dpfl writes it whole,
    so a missing final newline means the file was cut short). Whether it is a valid dpfl config is the
    experiment layer's question (``dpfl run --resume`` validates it).
    """
    d = _require_run_dir(run_dir)
    text = _read_text(d, CONFIG_FILE)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise _damaged(d, CONFIG_FILE, f"corrupt: not valid YAML ({_yaml_problem(e)})") from e
    if not isinstance(data, dict):
        what = "empty" if data is None else f"not a mapping of fields (a {type(data).__name__})"
        raise _damaged(d, CONFIG_FILE, f"corrupt: {what}")
    if text.startswith(SAVED_CONFIG_HEADER) and not text.endswith(SAVED_CONFIG_END):
        raise _damaged(d, CONFIG_FILE, "corrupt: truncated (its last line, '# end of config', is missing; dpfl "
                       "writes config.yaml whole)")
    if not text.endswith("\n"):
        raise _damaged(d, CONFIG_FILE, "corrupt: truncated (no final newline; dpfl writes config.yaml whole)")
    return text


# ---------------------------------------------------------------------------------------- writers
def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):  # numpy arrays and scalars, torch tensors
        return o.tolist()
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    flags = getattr(os, "O_DIRECTORY", None)
    if flags is None:
        return
    try:
        fd = os.open(directory, os.O_RDONLY | flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask (read by setting it and restoring it at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory + fsync + os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it 0600: a colleague reads it as any file the user writes
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)
    return path


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 text atomically (see :func:`write_bytes_atomic`)."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically. Serialised before any file is touched, so an
    unserialisable object leaves the old file in place. numpy/torch values are converted with
    ``tolist()``; non-finite floats are written as ``Infinity``/``NaN`` (Python's json reads them)."""
    text = json.dumps(obj, indent=2, default=_json_default) + "\n"
    return write_text_atomic(path, text)


def append_jsonl(path: str | os.PathLike[str], row: dict[str, Any]) -> None:
    """Append ``row`` as one JSON line, then flush and fsync.

    Refuses (``ValueError``) to append to a file whose last line is partial: the new row would be glued
    to it. Call :func:`truncate_jsonl` first (the resume path does).
    """
    path = Path(path)
    line = json.dumps(row, default=_json_default)  # no indent: never contains a raw newline
    with open(path, "ab+") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                raise ValueError(f"{path} ends with a partial line; truncate it (truncate_jsonl) before appending")
        f.write(line.encode("utf-8") + b"\n")
        f.flush()
        os.fsync(f.fileno())


def _complete_lines(path: Path, data: bytes) -> list[tuple[int, dict[str, Any]]]:
    """(end offset, row) of every newline-terminated line of ``data``; ``ValueError`` naming the first
    complete line that is not a JSON object (empty lines included: the writer never writes one)."""
    out: list[tuple[int, dict[str, Any]]] = []
    start = 0
    while True:
        nl = data.find(b"\n", start)
        if nl < 0:
            return out
        i = len(out) + 1
        try:
            row = json.loads(data[start:nl].decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            problem = "is empty" if not data[start:nl].strip() else f"is not valid JSON ({_one_line(e)})"
            raise ValueError(f"{path}: line {i} {problem}; it is complete (not the trace of a killed append), "
                             "so the file is damaged") from e
        if not isinstance(row, dict):
            raise ValueError(f"{path}: line {i} is not a JSON object; the file is damaged")
        out.append((nl + 1, row))
        start = nl + 1


def complete_jsonl_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of the newline-terminated lines of a JSONL file (a trailing partial line, the trace of a
    killed append, is left out). ``ValueError`` if a complete line is damaged; ``[]`` for a missing file."""
    path = Path(path)
    if not path.exists():
        return []
    return [row for _, row in _complete_lines(path, path.read_bytes())]


def truncate_jsonl(path: str | os.PathLike[str], n_rows: int) -> None:
    """Keep the first ``n_rows`` complete lines of ``path`` and drop everything after them, including
    a trailing partial line. ``ValueError`` if fewer than ``n_rows`` complete lines exist (the file and
    the checkpoint disagree) or if any complete line is not a JSON object (a damaged file: cutting it
    could destroy good rows); the file is then left untouched. A missing file is accepted when
    ``n_rows`` is 0 (it is created empty).
    """
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    path = Path(path)
    if not path.exists():
        if n_rows == 0:
            path.touch()
            return
        raise FileNotFoundError(f"{path} does not exist; cannot keep {n_rows} rows")
    with open(path, "rb+") as f:
        data = f.read()
        lines = _complete_lines(path, data)  # refuses before anything is cut
        if len(lines) < n_rows:
            raise ValueError(f"{path} has only {len(lines)} complete lines; cannot keep {n_rows}")
        end = lines[n_rows - 1][0] if n_rows else 0
        if end != len(data):
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())


def canonical_json(obj: Any) -> str:
    """``obj`` as the JSON text a reader of the run files would get back, with sorted keys: two rows are
    the same row exactly when their canonical texts are equal (numpy/torch values as lists, NaN as NaN)."""
    return json.dumps(json.loads(json.dumps(obj, default=_json_default)), sort_keys=True)


_TEMP = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]{8}\.tmp$")  # write_bytes_atomic's mkstemp names


def stale_temp_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Temporary files that :func:`write_bytes_atomic` left in ``directory`` when its process died before
    the rename (``.NAME.XXXXXXXX.tmp``). Safe to delete once no writer is running."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return [p for p in sorted(d.iterdir()) if _TEMP.match(p.name) and p.is_file()]


def _finite(x: Any) -> float | None:
    """``as_float`` restricted to finite values (None otherwise); never raises."""
    try:
        v = as_float(x)
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) else None


def training_time(history: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """The rounds' wall and CPU time summed over every round, whichever execution ran it (a resumed run's
    `seconds` counts only its last execution). CPU time is None when a round lacks it (a remote backend, or rounds
    recorded before dpfl measured it): a partial sum would understate it. Rows read back from metrics.jsonl go
    through `as_number`, as every table of them does."""
    cpu = [as_number(row.get("cpu_seconds")) for row in history]
    return {"train_seconds": float(sum(as_number(row.get("seconds")) or 0.0 for row in history)),
            "train_cpu_seconds": float(sum(cpu)) if cpu and None not in cpu else None}

"""Merge the results.csv files of one grid computed in pieces (machines, sessions, `--only-seeds`) into one.

A run directory does not always survive until the whole grid has run, so a grid's published CSV (docs/results/)
grows by appending the rows of later pieces. This does it as a command instead of by hand, and refuses what a
hand merge could get wrong silently: different columns, a key column missing, or two different rows for the same
run (the same key). A row present in several inputs with the same cells is kept once, so merging twice changes
nothing. Cells are copied as text, never re-formatted.

Some published CSVs open with `#` lines before the header (the command that made them, the date): such leading
comment lines of every input are kept, once each, in input order, above the merged header, so the merged file keeps
the provenance of each piece and merging again still changes nothing.

With `new_columns=True` the inputs may differ in columns that only some of them have (a column a newer dpfl added
to results.csv, such as `cpu_seconds`): the merged header is the widest input's (the first with every column, else
the first input's with the others appended in order of appearance) and rows of inputs without a column get an empty
cell. Two rows for one key then agree when they are equal on the columns both inputs have; the row of the input with
more columns is kept. Inputs with the same columns in another order are still refused.

Rows are sorted by the key columns in the order given: a column whose every value is a number sorts numerically,
any other column by the order in which its values first appear in the inputs (the first input first), which keeps
the grid's own order of settings and methods.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DEFAULT_KEY", "MergeError", "csv_rows", "merge_csv_texts", "merge_csv_files", "row_count"]

DEFAULT_KEY = ("setting", "seed", "method")  # one row per run in every `dpfl reproduce` results.csv


class MergeError(ValueError):
    """The inputs cannot be merged without losing or inventing a row; the message says which input and why."""


def _split_comments(text: str) -> tuple[list[str], str, int]:
    """The leading `#` lines (provenance), the CSV text after them, and how many lines they took."""
    lines = text.splitlines(keepends=True)
    n = 0
    while n < len(lines) and lines[n].startswith("#"):
        n += 1
    return [line.rstrip("\r\n") for line in lines[:n]], "".join(lines[n:]), n


def csv_rows(text: str) -> list[dict[str, str]]:
    """The rows of a published results CSV (its leading `#` provenance lines skipped), values as text."""
    return list(csv.DictReader(io.StringIO(_split_comments(text)[1])))


def _read(name: str, text: str) -> tuple[list[str], list[str], list[dict[str, str]]]:
    comments, text, skipped = _split_comments(text)
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise MergeError(f"{name}: empty, no header")
    rows = list(reader)
    for i, row in enumerate(rows, start=2 + skipped):
        if None in row or any(v is None for v in row.values()):
            raise MergeError(f"{name}, line {i}: {len(reader.fieldnames)} columns in the header, not in this row")
    return comments, list(reader.fieldnames), rows


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _sort_key(rows: Sequence[dict[str, str]], key: Sequence[str]):
    """Numbers numerically, other values by first appearance (column by column, in `key`'s order)."""
    numeric = {k: all(_is_number(r[k]) for r in rows) for k in key}
    first_seen: dict[str, dict[str, int]] = {k: {} for k in key}
    for r in rows:
        for k in key:
            first_seen[k].setdefault(r[k], len(first_seen[k]))
    return lambda r: tuple(float(r[k]) if numeric[k] else first_seen[k][r[k]] for k in key)


def _merged_header(inputs: Sequence[tuple[str, list[str]]], new_columns: bool) -> list[str]:
    """The header every input must have, or (new_columns) the widest one (module docstring); MergeError if none."""
    first_name, header = inputs[0]
    for name, cols in inputs[1:]:
        if cols == header:
            continue
        only_here = [c for c in cols if c not in header]
        only_first = [c for c in header if c not in cols]
        if not (only_here or only_first):
            raise MergeError(f"{name}: not the columns of {first_name} (the same columns in another order)")
        if not new_columns:
            raise MergeError(f"{name}: not the columns of {first_name} (columns only here: "
                             f"{', '.join(only_here) or '-'}; only in {first_name}: {', '.join(only_first) or '-'}; "
                             "--new-columns keeps both, empty where an input lacks a column)")
    union = list(dict.fromkeys(c for _, cols in inputs for c in cols))
    return next((list(cols) for _, cols in inputs if len(cols) == len(union)), union)


def merge_csv_texts(named_texts: Sequence[tuple[str, str]], key: Sequence[str] = DEFAULT_KEY, *,
                    new_columns: bool = False) -> str:
    """The union of the CSVs (name, text), one row per key, sorted (module docstring); MergeError if not possible."""
    if len(named_texts) < 2:
        raise MergeError("give at least two CSV files to merge")
    if not key or len(set(key)) != len(key):
        raise MergeError(f"the key must name distinct columns, got {', '.join(key) or 'none'}")
    comments: dict[str, None] = {}  # ordered set
    inputs = []
    for name, text in named_texts:
        these_comments, cols, rows = _read(name, text)
        missing = [k for k in key if k not in cols]
        if missing:
            raise MergeError(f"{name}: no column {', '.join(missing)} (the key); its columns: {', '.join(cols)}")
        comments.update(dict.fromkeys(these_comments))
        inputs.append((name, cols, rows))
    header = _merged_header([(name, cols) for name, cols, _ in inputs], new_columns)
    by_key: dict[tuple[str, ...], tuple[str, list[str], dict[str, str]]] = {}
    for name, cols, rows in inputs:
        for row in rows:
            k = tuple(row[c] for c in key)
            if k not in by_key:
                by_key[k] = (name, cols, row)
                continue
            seen_in, seen_cols, seen = by_key[k]
            diff = [c for c in header if c in cols and c in seen_cols and seen[c] != row[c]]
            if diff:
                raise MergeError(f"{name}: the row {dict(zip(key, k, strict=True))} differs from the one in {seen_in} "
                                 f"(columns {', '.join(diff)}): two different results for one run, or two runs "
                                 f"the key ({', '.join(key)}) does not tell apart (then add the column that does "
                                 "with --key)")
            if len(cols) > len(seen_cols):
                by_key[k] = (name, cols, row)
    rows = [{c: row.get(c, "") for c in header} for _, _, row in by_key.values()]
    rows.sort(key=_sort_key(rows, key))
    buf = io.StringIO()
    buf.writelines(f"{line}\n" for line in comments)
    writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def merge_csv_files(inputs: Sequence[Path], key: Sequence[str] = DEFAULT_KEY, *, new_columns: bool = False) -> str:
    """merge_csv_texts of files; MergeError names a file that cannot be read."""
    named = []
    for path in inputs:
        try:
            named.append((str(path), Path(path).read_text(encoding="utf-8")))
        except OSError as err:
            raise MergeError(f"{path}: {err.strerror or err}") from None
    return merge_csv_texts(named, key, new_columns=new_columns)


def row_count(text: str) -> int:
    """Data rows of a CSV text after its leading `#` lines (what a merge wrote; quoted newlines are one row)."""
    return sum(1 for _ in csv.DictReader(io.StringIO(_split_comments(text)[1])))

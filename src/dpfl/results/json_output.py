"""Strict JSON for what dpfl prints or writes for other programs to read.

Python's ``json`` writes ``Infinity``/``NaN`` for non-finite floats, which strict parsers (``jq``,
JavaScript) reject. Here non-finite numbers become the strings ``"inf"``, ``"-inf"``, ``"nan"``, the
encoding privacy.json's ledger already uses, and :func:`dpfl.results.run_files.as_float` reads both.
"""

from __future__ import annotations

import json
import math
import sys
from typing import IO, Any

__all__ = ["emit_json", "json_safe", "strict_json"]


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float (in nested dicts, lists, tuples) replaced by "inf", "-inf" or "nan",
    so that ``json.dumps(..., allow_nan=False)`` accepts it."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def strict_json(obj: Any, **dumps_kwargs: Any) -> str:
    """``json.dumps`` of :func:`json_safe` (``obj``) that refuses NaN/Infinity literals (keyword arguments go to
    ``json.dumps``)."""
    return json.dumps(json_safe(obj), allow_nan=False, **dumps_kwargs)


def emit_json(obj: Any, file: IO[str] | None = None) -> None:
    """Exactly one JSON object on one line of ``file`` (default: the current ``sys.stdout``), so scripts can read
    it. Values json cannot encode (paths, ...) are written as their ``str``."""
    (sys.stdout if file is None else file).write(strict_json(obj, default=str) + "\n")

"""Formatting a number that may be missing, the one way every table and printed line of dpfl does it."""

from __future__ import annotations

from typing import Any


def or_na(value: Any, spec: str) -> str:
    """`value` formatted with `spec`, or "n/a" when it was not measured (None)."""
    return "n/a" if value is None else format(value, spec)

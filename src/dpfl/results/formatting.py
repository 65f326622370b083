"""Formatting a number that may be missing, the one way every table and printed line of dpfl does it."""

from __future__ import annotations

from typing import Any


def or_na(value: Any, spec: str) -> str:
    """`value` formatted with `spec`, or "n/a" when it was not measured (None)."""
    return "n/a" if value is None else format(value, spec)


LARGE_EPSILON = 1e6  # from here on an epsilon is printed in scientific notation


def format_epsilon(value: float) -> str:
    """An epsilon as every printed line shows it: 3 decimals, or 4 significant digits in scientific notation
    from 1e6 on (an unprivate run's 2.4e+20 would otherwise print as 21 digits, which a narrow table cuts to a
    plausible-looking prefix)."""
    value = float(value)
    if value != value or abs(value) == float("inf"):
        return str(value)  # nan, inf, -inf
    return f"{value:.4g}" if abs(value) >= LARGE_EPSILON else f"{value:.3f}"

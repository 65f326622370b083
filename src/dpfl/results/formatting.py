"""Formatting a number that may be missing, the one way every table and printed line of dpfl does it."""

from __future__ import annotations

from typing import Any


def or_na(value: Any, spec: str) -> str:
    """`value` formatted with `spec`, or "n/a" when it was not measured (None)."""
    return "n/a" if value is None else format(value, spec)


def round_accuracy(row: Any) -> tuple[str, float] | None:
    """The accuracy a progress line shows for a metrics row: ("personal accuracy", acc_personal) for methods with
    personal models (clustered DP-FL, PPSGD, CENTAUR: their clients use their own models, and the server's
    averaged model can sit near chance while they do well), else ("accuracy", test_accuracy); None on a round
    without evaluation."""
    if row.get("acc_personal") is not None:
        return "personal accuracy", float(row["acc_personal"])
    if row.get("test_accuracy") is not None:
        return "accuracy", float(row["test_accuracy"])
    return None


def accuracy_words(last: tuple[str, float] | None, digits: int = 3) -> str:
    """What a progress line says of the last `round_accuracy`: "accuracy 0.812", "personal accuracy 0.776",
    or "accuracy -" before any evaluation."""
    return "accuracy -" if last is None else f"{last[0]} {last[1]:.{digits}f}"


LARGE_EPSILON = 1e6  # from here on an epsilon is printed in scientific notation


def format_epsilon(value: float) -> str:
    """An epsilon as every printed line shows it: 3 decimals, or 4 significant digits in scientific notation
    from 1e6 on (an unprivate run's 2.4e+20 would otherwise print as 21 digits, which a narrow table cuts to a
    plausible-looking prefix)."""
    value = float(value)
    if value != value or abs(value) == float("inf"):
        return str(value)  # nan, inf, -inf
    return f"{value:.4g}" if abs(value) >= LARGE_EPSILON else f"{value:.3f}"

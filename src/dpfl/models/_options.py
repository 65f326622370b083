"""Validation of builder options (the registry adds the model name to the message)."""

from __future__ import annotations


def positive_int(value: object, what: str) -> int:
    """`value` if it is an int >= 1 (bools rejected), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def positive_ints(value: object, what: str) -> tuple[int, ...]:
    """`value` as a tuple if it is a non-empty sequence (list or tuple) of positive ints, else ValueError."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{what} must be a non-empty list of positive integers, got {value!r}")
    return tuple(positive_int(v, f"each of {what}") for v in value)


def dropout_rate(value: object) -> float:
    """`value` as a float in [0, 1), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"dropout must be a number in [0, 1), got {value!r}")
    return float(value)


def flag(value: object, what: str) -> bool:
    """`value` if it is a bool, else ValueError (so a YAML string "false" is not silently truthy)."""
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be true or false, got {value!r}")
    return value

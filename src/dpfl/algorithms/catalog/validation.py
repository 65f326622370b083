"""The checks an algorithm's params model shares with the config sections, kept below the experiment layer so that
the params can live with their algorithm: the strict `Params` base, the one-line error convention (`fail`) that
`dpfl.experiment.config.errors` renders as ``<field.path>: <problem> (got <value>; allowed: <...>)``, and the
bounds on the algorithms' own sizes (restated in `dpfl.experiment.config.limits`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

__all__ = ["ERROR_TYPE", "MAX_ITERATIONS", "MAX_LOCAL_EPOCHS", "Params", "at_most", "fail", "is_number", "show",
           "too_big"]

ERROR_TYPE = "dpfl_config"
MAX_LOCAL_EPOCHS = 10_000  # training.local_epochs, CENTAUR's head_epochs
MAX_ITERATIONS = 1_000_000  # iteration caps of server-side solvers (Robust-HDP's max_iter), splitting periods


class Params(BaseModel):
    """Strict (no silent type coercion), no unknown fields, no NaN/inf unless a field says so: as a config section."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, revalidate_instances="always")


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def too_big(v: Any) -> bool:
    """An integer no float can hold (above about 1.8e308): float(v) and math.isnan(v) would raise."""
    if not isinstance(v, int) or isinstance(v, bool):
        return False
    try:
        float(v)
    except OverflowError:
        return True
    return False


def finite(v: Any) -> bool:
    return not too_big(v) and math.isfinite(v)


def show(value: Any, limit: int = 80) -> str:
    """A short, single-line rendering of a value, in YAML words for null/true/false."""
    if value is None:
        text = "null"
    elif value is True or value is False:
        text = "true" if value else "false"
    elif isinstance(value, BaseModel):
        text = _repr_prefix(value.model_dump(), 2 * limit + 2)
    else:
        text = _repr_prefix(value, 2 * limit + 2)
    text = " ".join(text.splitlines())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _repr_prefix(value: Any, at_least: int) -> str:
    """repr(value), or its first `at_least`+ characters when longer: a YAML alias 'bomb' (a billion items
    built from a few shared lists) or a list that contains itself renders in the time of its first items."""
    parts, n = [], 0
    for chunk in _repr_chunks(value, set()):
        parts.append(chunk)
        n += len(chunk)
        if n > at_least:
            break
    return "".join(parts)


def _repr_chunks(value: Any, open_: set[int]) -> Iterator[str]:
    """repr(value) piece by piece; exact for the containers YAML builds (list, dict; tuple for good measure)."""
    kind = type(value)
    if kind not in (list, tuple, dict):
        try:
            yield repr(value)
        except Exception:  # noqa: BLE001 - an exotic object (or an int of 5,000 digits) must never break the message
            yield f"<{kind.__name__}>"
        return
    brackets = {list: "[]", tuple: "()", dict: "{}"}[kind]
    if id(value) in open_:  # a container inside itself, as repr() writes it
        yield f"{brackets[0]}...{brackets[1]}"
        return
    open_.add(id(value))
    try:
        yield brackets[0]
        items = value.items() if kind is dict else value
        for i, item in enumerate(items):
            if i:
                yield ", "
            if kind is dict:
                yield from _repr_chunks(item[0], open_)
                yield ": "
                yield from _repr_chunks(item[1], open_)
            else:
                yield from _repr_chunks(item, open_)
        if kind is tuple and len(value) == 1:
            yield ","
        yield brackets[1]
    finally:
        open_.discard(id(value))


def fail(field: str, problem: str, got: Any = ..., allowed: str | None = None, more: int = 0) -> NoReturn:
    """Raise a validation error for `field` (a dotted path relative to where the validator runs)."""
    raise PydanticCustomError(
        ERROR_TYPE,
        "{problem}",
        {"problem": problem, "field": field, "got": None if got is ... else show(got), "allowed": allowed,
         "more": more},
    )


def at_most(value: Any, bound: int, what: str, field: str = "") -> Any:
    """`value` unless it exceeds `bound`; then a one-line error naming dpfl's limit (None passes)."""
    if value is not None and value > bound:
        fail(field, f"above dpfl's limit of {bound} {what}", value, f"at most {bound}")
    return value

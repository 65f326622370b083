"""DpEvents to and from plain JSON-able dicts, exactly (checkpoints must resume to the same ledger).

dp_accounting's ``to_named_tuple``/``from_named_tuple`` import whatever module a payload names; a
checkpoint is data, so this codec only builds classes of ``dp_accounting.dp_event``. Floats survive
JSON exactly (Python writes the shortest repr that round-trips); ints stay ints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attr
import dp_accounting as dpa
from dp_accounting import dp_event as dp_event_module

__all__ = ["decode_float", "encode_float", "event_from_dict", "event_to_dict"]

_TYPE = "type"


def _event_classes() -> dict[str, type]:
    out = {}
    for name in dir(dp_event_module):
        cls = getattr(dp_event_module, name)
        if isinstance(cls, type) and issubclass(cls, dpa.DpEvent) and cls is not dpa.DpEvent:
            out[name] = cls
    return out


_CLASSES = _event_classes()


def encode_float(x: float) -> float | str:
    """Finite floats as they are; inf/-inf/nan as strings, so the JSON stays standard."""
    return float(x) if math.isfinite(x) else repr(float(x))


def decode_float(x: float | int | str) -> float:
    if isinstance(x, str):
        if x not in ("inf", "-inf", "nan"):
            raise ValueError(f"expected a number or 'inf'/'-inf'/'nan', got {x!r}")
        return float(x)
    return float(x)


def _encode(value: Any) -> Any:
    if isinstance(value, dpa.DpEvent):
        return event_to_dict(value)
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, float):
        return encode_float(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    raise ValueError(f"cannot serialise event field value {value!r} of type {type(value).__name__}")


def event_to_dict(event: dpa.DpEvent) -> dict[str, Any]:
    """``{"type": <class name>, <field>: <value>, ...}``, nested events as nested dicts."""
    name = type(event).__name__
    if _CLASSES.get(name) is not type(event):
        raise ValueError(f"only dp_accounting.dp_event classes can be serialised, got {type(event)!r}")
    out: dict[str, Any] = {_TYPE: name}
    for field in attr.fields(type(event)):
        out[field.name] = _encode(getattr(event, field.name))
    return out


def _decode(value: Any) -> Any:
    if isinstance(value, Mapping):
        return event_from_dict(value)
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def event_from_dict(data: Mapping[str, Any]) -> dpa.DpEvent:
    """Inverse of ``event_to_dict``; raises ValueError on unknown classes or fields."""
    name = data.get(_TYPE)
    cls = _CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown DpEvent type {name!r}; known: {sorted(_CLASSES)}")
    names = {f.name for f in attr.fields(cls)}
    given = set(data) - {_TYPE}
    if given != names:
        raise ValueError(f"{name} needs fields {sorted(names)}, got {sorted(given)}")
    return cls(**{k: _decode(data[k]) for k in names})

"""Config errors as ONE line: ``<field.path>: <problem> (got <value>; allowed: <...>)``.

`ConfigError` is what every config problem raises. The rest turns a pydantic `ValidationError` into that
line: `_fail` raises a problem from inside a validator (its path relative to where the validator runs; it lives
with the algorithms' params, `dpfl.algorithms.catalog.validation`, which raise with it too),
`_describe` reads one pydantic error dict (unknown fields with a close match, types in words, numeric
ranges from the field's declared bounds), `_line` renders it and `_sub_validate` validates a nested
model from a plain validator, keeping the nested path.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from dpfl.algorithms.catalog.validation import ERROR_TYPE as _ERROR_TYPE
from dpfl.algorithms.catalog.validation import fail as _fail  # noqa: F401 - the sections raise with it
from dpfl.algorithms.catalog.validation import show as _show


class ConfigError(ValueError):
    """A config problem, as ONE line: ``<field.path>: <problem> (got <value>; allowed: <...>)``.

    ``path`` is the dotted field path ("config" for the document itself, the file name for I/O problems).
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        line = " ".join(str(message).splitlines())
        super().__init__(line)
        self.path = path


def _allowed(names: tuple[str, ...]) -> str:
    """pydantic's wording for a Literal's values, for names known only at validation time: 'a', 'b' or 'c'."""
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


_TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "a string",
    "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
    "model_attributes_type": "a mapping", "none_required": "null",
}
_BOUNDS = {"greater_than": ("gt", "> {}"), "greater_than_equal": ("ge", ">= {}"),
           "less_than": ("lt", "< {}"), "less_than_equal": ("le", "<= {}")}


def _model_at(root: type[BaseModel] | None, loc: Sequence[Any]) -> type[BaseModel] | None:
    """The model class reached by following field names `loc` from `root` (None if not a model)."""
    cur: Any = root
    for key in loc:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)) or key not in cur.model_fields:
            return None
        models = [m for m in _models_in(cur.model_fields[key].annotation)]
        cur = models[0] if len(models) == 1 else None
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _models_in(annotation: Any) -> Iterable[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType, Annotated):
        for arg in typing.get_args(annotation):
            yield from _models_in(arg)


def _interval(root: type[BaseModel] | None, loc: Sequence[Any]) -> str | None:
    """A field's full numeric range, e.g. "(0, 1)" or ">= 1", from its declared bounds (None if unknown)."""
    parent = _model_at(root, loc[:-1]) if loc else None
    field = parent.model_fields.get(loc[-1]) if parent is not None else None
    if field is None:
        return None
    b: dict[str, Any] = {}
    for m in field.metadata:
        for key in ("gt", "ge", "lt", "le"):
            if getattr(m, key, None) is not None:
                b[key] = getattr(m, key)
    low = ("(", b["gt"]) if "gt" in b else ("[", b["ge"]) if "ge" in b else None
    high = (b["lt"], ")") if "lt" in b else (b["le"], "]") if "le" in b else None
    if low and high:
        return f"{low[0]}{low[1]}, {high[0]}{high[1]}"
    if low:
        return f"{'>' if low[0] == '(' else '>='} {low[1]}"
    if high:
        return f"{'<' if high[1] == ')' else '<='} {high[0]}"
    return None


def _first(errors: list[Any]) -> Any:
    """The error to report: an unknown field first (often the typo behind a 'missing' one), else the first."""
    return next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])


def _describe(err: Mapping[str, Any],
              root: type[BaseModel] | None) -> tuple[list[str], str, str | None, str | None, int]:
    """(path, problem, got, allowed, more) for one pydantic error dict."""
    loc = [str(p) for p in err.get("loc", ())]
    typ = err.get("type", "")
    ctx = err.get("ctx") or {}
    raw = err.get("input", None)
    got: str | None = _show(raw)
    allowed: str | None = None
    if typ == _ERROR_TYPE:
        field = ctx.get("field") or ""
        return loc + [p for p in field.split(".") if p], str(ctx.get("problem")), ctx.get("got"), \
            ctx.get("allowed"), int(ctx.get("more") or 0)
    if typ == "missing":
        return loc, "required field is missing", None, None, 0
    if typ == "extra_forbidden":
        parent = _model_at(root, err.get("loc", ())[:-1])
        names = list(parent.model_fields) if parent is not None else []
        close = difflib.get_close_matches(loc[-1] if loc else "", names, n=1)
        problem = "unknown field" + (f", did you mean {close[0]!r}?" if close else "")
        return loc, problem, got, ", ".join(names) or None, 0
    if typ == "literal_error":
        return loc, "not an allowed value", got, str(ctx.get("expected")), 0
    if typ in _BOUNDS:
        key, fmt = _BOUNDS[typ]
        return loc, "out of range", got, _interval(root, err.get("loc", ())) or fmt.format(ctx.get(key)), 0
    if typ in _TYPE_WORDS:
        if typ == "float_type" and isinstance(raw, int) and not isinstance(raw, bool):  # beyond a float64
            return loc, "too large for a number (a float holds at most about 1.8e308)", got, \
                _interval(root, err.get("loc", ())) or "a finite number", 0
        if typ == "float_type" and isinstance(raw, str) and _looks_like_float(raw):
            return loc, "a number written as text (YAML 1.1 reads 1e-5 as text: load with dpfl's parse_yaml or " \
                "write 1.0e-5)", got, "a number", 0
        return loc, "wrong type", got, _TYPE_WORDS[typ], 0
    if typ in ("too_short", "too_long"):
        bound = f"at least {ctx.get('min_length')}" if typ == "too_short" else f"at most {ctx.get('max_length')}"
        return loc, "wrong length", got, f"{bound} item(s)", 0
    if typ == "string_pattern_mismatch":
        return loc, "invalid format", got, f"text matching {ctx.get('pattern')}", 0
    msg = str(err.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return loc, msg[:1].lower() + msg[1:], got, allowed, 0


def _looks_like_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _segment(name: str) -> str:
    """A path segment as written, or quoted when it holds spaces or control characters."""
    return name if name and name.isprintable() and not any(c.isspace() for c in name) else repr(name)


def _line(path: Sequence[str], problem: str, got: str | None, allowed: str | None, more: int = 0) -> str:
    parts = [f"got {got}"] if got is not None else []
    if allowed:
        parts.append(f"allowed: {allowed}")
    text = f"{'.'.join(map(_segment, path)) or 'config'}: {problem}"
    if parts:
        text += f" ({'; '.join(parts)})"
    if more:
        text += f" (+{more} more)"
    return text


def _config_error(exc: ValidationError, root: type[BaseModel]) -> ConfigError:
    errors = exc.errors(include_url=False)
    if not errors:
        return ConfigError(f"config: {exc}", "config")
    path, problem, got, allowed, more = _describe(_first(errors), root)
    return ConfigError(_line(path, problem, got, allowed, more + len(errors) - 1),
                       ".".join(map(_segment, path)) or "config")


def _sub_validate(model: type[BaseModel], value: Any, field: str = "") -> Any:
    """Validate `value` as `model`; an error is re-raised with its path under `field` (for plain validators)."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        path, problem, got, allowed, more = _describe(_first(errors), model)
        raise PydanticCustomError(
            _ERROR_TYPE,
            "{problem}",
            {"problem": problem, "field": ".".join([field, *path]).strip("."), "got": got, "allowed": allowed,
             "more": more + len(errors) - 1},
        ) from None

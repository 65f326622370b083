"""`--set FIELD.PATH=VALUE` overrides: parsed as YAML and applied to the config data before validation."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dpfl.experiment.config.errors import ConfigError, _show
from dpfl.experiment.config.yaml_io import _load_yaml


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """``"a.b=c"`` -> (("a", "b"), value), the value read as YAML: 5, 0.1, 1e-5, true, null, [1, 2], {k: v}."""
    if not isinstance(text, str) or "=" not in text:
        raise ConfigError(f"--set {_show(text)}: expected FIELD.PATH=VALUE, e.g. training.rounds=5", "--set")
    key, _, raw = text.partition("=")
    path = tuple(p.strip() for p in key.strip().split("."))
    if not key.strip() or any(not p for p in path):
        raise ConfigError(f"--set {_show(text)}: empty field name in {key.strip()!r}; expected FIELD.PATH=VALUE",
                          "--set")
    value = _load_yaml(raw, f"--set {'.'.join(path)}") if raw.strip() else None
    return path, value


def device_override(device: str | None) -> list[str]:
    """`--device D` (the CLI) or `device=D` (`dpfl.run`) as the override it stands for, `device=D`, to go after
    any --set so it wins; none without it."""
    return [] if device is None else [f"device={device}"]


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of `data` with each ``FIELD.PATH=VALUE`` set in turn (missing mappings are created).

    Unknown field names are not rejected here: they fail validation like any other field. A list item
    can be addressed by its index (``privacy.budgets.2=8``).
    """
    import copy

    out = copy.deepcopy(dict(data))
    for text in overrides:
        path, value = parse_override(text)
        cur: Any = out
        for depth, key in enumerate(path):
            last = depth == len(path) - 1
            where = ".".join(path[: depth + 1])
            if isinstance(cur, dict):
                if last:
                    cur[key] = value
                else:
                    if key not in cur or cur[key] is None:
                        cur[key] = {}
                    cur = cur[key]
            elif isinstance(cur, list) and _index(key, len(cur)) is not None:
                if last:
                    cur[int(key)] = value
                else:
                    cur = cur[int(key)]
            else:
                parent = ".".join(path[:depth])
                raise ConfigError(
                    f"{where}: cannot set {'.'.join(path)}: {parent} is not a mapping"
                    + (f" (a list of {len(cur)}; index it with 0..{len(cur) - 1})" if isinstance(cur, list) else "")
                    + f" (got {_show(cur)})", where)
    return out


def _index(key: str, length: int) -> int | None:
    """`key` as an index into a list of `length` (negative from the end), or None when it is not one."""
    digits = key[1:] if key.startswith("-") else key
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 18:
        return None
    i = int(key)
    return i if -length <= i < length else None

"""The public entry points: validate data, load a YAML file with overrides, dump a resolved config."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from dpfl.experiment.config.errors import ConfigError, _config_error, _segment, _show
from dpfl.experiment.config.legacy_mpdp import (convert_legacy_mpdp, is_legacy_mpdp, legacy_notice,
                                                refuse_flat_overrides)
from dpfl.experiment.config.limits import MAX_CONFIG_CHARS, MAX_DEPTH
from dpfl.experiment.config.overrides import apply_overrides
from dpfl.experiment.config.own_data import resolve_paths
from dpfl.experiment.config.run import RunConfig
from dpfl.experiment.config.yaml_io import _load_yaml
from dpfl.results.run_files import SAVED_CONFIG_END, SAVED_CONFIG_HEADER


def validate_config(data: Any) -> RunConfig:
    """Validate a config mapping; every problem is a one-line ConfigError."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"config: the config must be a mapping of fields (got {_show(data)})", "config")
    _refuse_deep(data)
    try:
        return RunConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise _config_error(exc, RunConfig) from None


def load_config(path: Path | str, overrides: Sequence[str] = (),
                notice: Callable[[str], None] | None = None) -> RunConfig:
    """Read a YAML config, apply ``FIELD.PATH=VALUE`` overrides in order, validate.

    An MP-DP config in the old flat schema (`scheme: mpdp`) is converted (`legacy_mpdp`), and `notice` gets one line
    saying so (default: a FutureWarning). Raises ConfigError (one line) for a missing/unreadable file, invalid YAML,
    a document that is not a mapping, a malformed override, and any invalid field. Relative paths of data.silos and
    data.test (the file's, or an override's) are relative to the config file's folder.
    """
    data = read_config_mapping(path)
    if is_legacy_mpdp(data):
        refuse_flat_overrides(overrides)
        data = convert_legacy_mpdp(data)
        message = legacy_notice(str(path))
        if notice is not None:
            notice(message)
        else:
            warnings.warn(message, FutureWarning, stacklevel=2)
    return validate_config(resolve_paths(apply_overrides(data, overrides), Path(path).parent))


def read_config_mapping(path: Path | str) -> dict[str, Any]:
    """A config file's top-level mapping (bounded read, dpfl's YAML reading, depth limit); one-line ConfigErrors."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as file:
            text = file.read(MAX_CONFIG_CHARS + 1)  # bounded: `dpfl run /dev/zero` must not fill the memory
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found", str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config file ({type(exc).__name__}: {exc})", str(path)) from None
    if len(text) > MAX_CONFIG_CHARS:
        raise ConfigError(f"{path}: not a config file: longer than {MAX_CONFIG_CHARS} characters", str(path))
    data = _load_yaml(text, str(path))
    if data is None:
        raise ConfigError(f"{path}: the config file is empty", str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config must be a YAML mapping of fields (got {_show(data)})", str(path))
    _refuse_deep(data)  # before the overrides copy it
    return data


def _refuse_deep(data: Any) -> None:
    """A one-line error for data nested deeper than MAX_DEPTH, e.g. a YAML list alias that contains itself.

    Containers are visited once per depth (memoised by identity), so an alias 'bomb' of a billion items
    built from a few shared lists costs a few hundred steps.
    """
    deepest: dict[int, int] = {}
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(data, 0, ())]
    while stack:
        node, depth, path = stack.pop()
        if not isinstance(node, (dict, list, tuple)) or deepest.get(id(node), -1) >= depth:
            continue
        if depth > MAX_DEPTH:
            where = ".".join(map(_segment, path[:3])) + (".(...)" if len(path) > 3 else "")
            raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep (a YAML alias inside itself?) "
                              f"(got {_show(node)}; allowed: at most {MAX_DEPTH} levels of mappings and lists)", where)
        deepest[id(node)] = depth
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((value, depth + 1, (*path, str(key))) for key, value in items)


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    """The resolved config as plain data (every field, defaults and inferred values filled in)."""
    return cfg.model_dump(mode="python")


def config_to_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML; ``load_config`` of it gives back an equal RunConfig.

    It opens with `SAVED_CONFIG_HEADER` and closes with `SAVED_CONFIG_END` (comments), so that a copy cut short at a
    line boundary, still valid YAML with fewer sections, is told from a whole one (`read_config_text`)."""
    body = yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=None, allow_unicode=True,
                          width=100)
    return SAVED_CONFIG_HEADER + body + SAVED_CONFIG_END

"""YAML text -> data: 1e-5 read as a float, duplicate keys refused, errors as one-line `ConfigError`s."""

from __future__ import annotations

import re
from typing import Any

import yaml

from dpfl.experiment.config.errors import ConfigError
from dpfl.experiment.config.limits import MAX_DEPTH


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads 1e-5 as a float (YAML 1.1 wants 1.0e-5) and rejects duplicate keys."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _no_duplicates(loader: _Loader, node: yaml.MappingNode) -> dict:
    loader.flatten_mapping(node)
    seen: set = set()
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode):
            key = loader.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{where}invalid YAML: {problem}"


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """YAML text -> data, reading 1e-5 as a float and refusing duplicate keys; errors are one-line ConfigErrors."""
    return _load_yaml(text, source)


def _load_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {_yaml_problem(exc)}", source) from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid YAML: nested too deeply (a config is at most {MAX_DEPTH} levels deep)",
                          source) from None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a scalar PyYAML cannot build: !!bool maybe, 2001-13-45, 5,000 digits
        raise ConfigError(f"{source}: invalid YAML: a value cannot be read ({_value_problem(exc)})", source) from None


def _value_problem(exc: Exception) -> str:
    text = str(exc).split("; use sys.set_int_max_str_digits")[0]  # Python's advice is not for config authors
    return text if isinstance(exc, ValueError) and text else f"{type(exc).__name__}: {text}"

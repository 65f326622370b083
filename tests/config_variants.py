"""Configs for tests: a base mapping with some fields changed, validated (shared by the run-level tests)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dpfl.experiment.config import RunConfig, validate_config


def variant(base: Mapping[str, Any], **changes: Any) -> RunConfig:
    """`base` with each ``section__field=value`` set (double underscores separate path parts), validated."""
    cfg = copy.deepcopy(dict(base))
    for path, value in changes.items():
        *head, last = path.split("__")
        node = cfg
        for key in head:
            node = node.setdefault(key, {})
        node[last] = value
    return validate_config(cfg)

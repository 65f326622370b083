"""What every config section shares: the strict `_Section` base and the small value checks of several sections."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from dpfl.experiment.config.errors import _fail


class _Section(BaseModel):
    """Strict (no silent type coercion), no unknown fields, no NaN/inf unless a field says so."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, revalidate_instances="always")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _too_big(v: Any) -> bool:
    """An integer no float can hold (above about 1.8e308): float(v) and math.isnan(v) would raise."""
    if not isinstance(v, int) or isinstance(v, bool):
        return False
    try:
        float(v)
    except OverflowError:
        return True
    return False


def _check_probs(probs: list[float] | None, values: list[Any]) -> None:
    if probs is None:
        return
    if len(probs) != len(values):
        _fail("probs", f"needs one probability per value ({len(values)})", probs, "non-negative numbers summing to 1")
    if abs(math.fsum(probs) - 1.0) > 1e-9:
        _fail("probs", "probabilities must sum to 1", probs, "non-negative numbers summing to 1")

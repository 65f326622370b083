"""What every config section shares: the strict `_Section` base and the small value checks of several sections
(`_is_number`, `_too_big`: shared with the algorithms' params, `dpfl.algorithms.catalog.validation`)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from dpfl.algorithms.catalog.validation import is_number as _is_number  # noqa: F401 - for the sections
from dpfl.algorithms.catalog.validation import too_big as _too_big  # noqa: F401 - for the sections
from dpfl.experiment.config.errors import _fail


class _Section(BaseModel):
    """Strict (no silent type coercion), no unknown fields, no NaN/inf unless a field says so."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, revalidate_instances="always")


def _check_probs(probs: list[float] | None, values: list[Any]) -> None:
    if probs is None:
        return
    if len(probs) != len(values):
        _fail("probs", f"needs one probability per value ({len(values)})", probs, "non-negative numbers summing to 1")
    if abs(math.fsum(probs) - 1.0) > 1e-9:
        _fail("probs", "probabilities must sum to 1", probs, "non-negative numbers summing to 1")

"""`untimed(x)`: a run's files without their wall-clock fields (`seconds`, `*_seconds`), the only thing two
executions of the same run may differ in (shared by the resume, damage and twin-run tests)."""

from __future__ import annotations

from typing import Any


def untimed(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: untimed(v) for k, v in x.items() if k != "seconds" and not str(k).endswith("_seconds")}
    if isinstance(x, (list, tuple)):
        return [untimed(v) for v in x]
    return x

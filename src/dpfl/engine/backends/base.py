"""The one call a backend answers: train these plans from this start and give back the stacked results."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch
from torch import nn

from dpfl.engine.local_training import ClientPlan, LocalResult, LocalSpec
from dpfl.engine.pooled import PooledData


class Backend(Protocol):
    """`run_local`'s contract (engine/local_training.py), wherever the work runs."""

    name: str

    def train(self, model: nn.Module, spec: LocalSpec, plans: Sequence[ClientPlan], data: PooledData,
              start: Mapping[str, torch.Tensor], *, seed: int, round_: int, stacked_start: bool,
              max_elements: int, anchor: Mapping[str, torch.Tensor] | None) -> LocalResult: ...

    def close(self) -> None:
        """Release workers (a no-op in process); the backend starts them again if trained after."""

    # optional: describe() -> dict, what the run used (summary.json `backend`: name, actors, where Ray ran)

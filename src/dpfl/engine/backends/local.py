"""The default backend: the whole cohort vectorised in this process."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from dpfl.engine.local_training import ClientPlan, LocalResult, LocalSpec, run_local
from dpfl.engine.pooled import PooledData


class LocalBackend:
    name = "local"

    def train(self, model: nn.Module, spec: LocalSpec, plans: Sequence[ClientPlan], data: PooledData,
              start: Mapping[str, torch.Tensor], *, seed: int, round_: int, stacked_start: bool,
              max_elements: int, anchor: Mapping[str, torch.Tensor] | None) -> LocalResult:
        return run_local(model, spec, plans, data, start, seed=seed, round_=round_, stacked_start=stacked_start,
                         max_elements=max_elements, anchor=anchor)

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, str]:
        """What the run used (summary.json `backend`)."""
        return {"name": self.name}

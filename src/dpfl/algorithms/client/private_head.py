"""CENTAUR's private heads (Shen et al. 2023; spec fedceo.md §6.3): share the representation only.

The model is h_k ∘ φ. Each client keeps its own head h_k (a copy of the common initial head at its
first participation) and never uploads it; only φ's update is clipped, noised and averaged. The
global model's head is the mean of the stored heads, a diagnostic only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dpfl.engine import params as P


@dataclass
class PrivateHead:
    """Client-side heads for the parameter tensors named in `head` (e.g. ("fc2.weight",))."""

    head: tuple[str, ...]
    initial: P.Params | None = field(default=None, repr=False)  # h(0), taken from the first global model
    heads: dict[int, P.Params] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.head:
            raise ValueError("CENTAUR needs the names of the head's parameter tensors")
        self.head = tuple(self.head)

    def _own(self, client: int) -> P.Params:
        assert self.initial is not None
        return self.heads.get(client, self.initial)

    def start_points(self, global_params: P.Params, clients: Sequence[int], round_: int) -> P.Params:
        """The global representation φ with each client's own head."""
        missing = [n for n in self.head if n not in global_params]
        if missing:
            raise ValueError(f"head tensors {missing} are not parameters of the model ({list(global_params)})")
        if self.initial is None:
            self.initial = {n: global_params[n].clone() for n in self.head}
        return {n: torch.stack([self._own(c)[n] if n in self.head else w for c in clients])
                for n, w in global_params.items()}

    def shared_update(self, deltas: P.Params, clients: Sequence[int]) -> P.Params:
        """Keep each head's change on its client; return φ's update only (no head key is ever uploaded)."""
        for j, c in enumerate(clients):
            self.heads[c] = {n: self._own(c)[n] + deltas[n][j] for n in self.head}
        return {n: d for n, d in deltas.items() if n not in self.head}

    def global_model(self, params: P.Params) -> P.Params:
        """φ with the mean of the stored heads (the diagnostic `acc_global` of spec §6.3)."""
        if not self.heads:
            return params
        mean = {n: torch.stack([h[n] for h in self.heads.values()]).mean(0) for n in self.head}
        return {**params, **mean}

    def personal_models(self, global_params: P.Params) -> dict[int, P.Params]:
        """h_k ∘ φ for every client with a head."""
        return {c: {**global_params, **h} for c, h in self.heads.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"initial": self.initial, "heads": self.heads}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.initial = None if state is None else state["initial"]
        self.heads = {} if state is None else {int(c): dict(h) for c, h in state["heads"].items()}

"""PPSGD's additive personalisation (Bietti et al. 2022; spec fedceo.md §6.2): θ_k = w + u_k.

The shared part w is trained, privatised and averaged as usual; the local part u_k never leaves the
client. Each local step takes g = ∇_θ L(v + u_k) and moves v by −η·g and u_k by −α·η·g, each with its
own momentum buffer. Both buffers start at zero and see the same g, so u_k's move is exactly α times
v's, and θ = v + u_k moves as plain SGD at step (1 + α)·η. The engine therefore trains θ from w + u_k at
lr (1 + α)·η and splits the change Δθ afterwards: the shared update is Δθ / (1 + α) (what is clipped,
noised and uploaded), and u_k += α·Δθ / (1 + α). Under DP-SGD g is the privatised gradient, so u_k is
post-processing of it and the client's guarantee is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dpfl.engine import params as P


@dataclass
class AdditivePersonal:
    """Each client's local part u_k (0 before its first participation), kept on the client side."""

    alpha: float = 1.0
    local: dict[int, P.Params] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.alpha > 0:
            raise ValueError(f"PPSGD alpha (local / global step size) must be > 0, got {self.alpha}")

    @property
    def lr_factor(self) -> float:
        """θ = v + u moves at (1 + α) times the shared step size."""
        return 1.0 + self.alpha

    def start_points(self, global_params: P.Params, clients: Sequence[int], round_: int) -> P.Params:
        """θ_k = w + u_k, stacked in client order."""
        return {n: torch.stack([w + self.local[c][n] if c in self.local else w.clone() for c in clients])
                for n, w in global_params.items()}

    def shared_update(self, deltas: P.Params, clients: Sequence[int]) -> P.Params:
        """Split Δθ: keep α/(1+α) of it in u_k, return the shared 1/(1+α) (the update that is uploaded)."""
        shared = {n: d / self.lr_factor for n, d in deltas.items()}
        for j, c in enumerate(clients):
            own = {n: self.alpha * shared[n][j] for n in shared}
            self.local[c] = P.axpy(1.0, own, self.local[c]) if c in self.local else own
        return shared

    def global_model(self, params: P.Params) -> P.Params:
        """The shared part w is the whole global model."""
        return params

    def personal_models(self, global_params: P.Params) -> dict[int, P.Params]:
        """w + u_k for every client that has a local part."""
        return {c: P.axpy(1.0, u, global_params) for c, u in self.local.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"local": self.local}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.local = {} if state is None else {int(c): dict(u) for c, u in state["local"].items()}

"""MR-MTL (clustered_dpfl.md §6): personal models pulled towards their mean.

Each client keeps a personal model theta_i (the server holds the population's, [n, ...]) and trains it with DP-SGD on
its loss plus (lambda / 2) ||theta_i - thetabar||^2, thetabar held fixed: the local program's prox term with
`prox_to="anchor"` (the engine adds its data-independent gradient after clipping and noise). The server then sets
thetabar = (1/n) sum_i theta_i over all clients (post-processing of the uploads). lambda = 0 is Local training.

The step is its configuration only; its state is {"personal": the stacked personal models [n, ...]}, every one the
initial model at `init` (a checkpoint written before the first round may hold None: they are then built from the
global model when first handed out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
from dpfl.engine import params as P


@dataclass(frozen=True)
class MeanRegularized(ServerStep):
    """Aggregate stage of MR-MTL over `n_clients` personal models (all start at the initial model)."""

    n_clients: int

    personalises_starts = True
    linear_in_updates = False

    def init(self, params: P.Params) -> dict[str, Any]:
        """Every client's personal model is the initial model."""
        return {"personal": _stacked(params, self.n_clients)}

    def start_points(self, state: Any, global_params: P.Params, clients: Sequence[int],
                     round_: int) -> tuple[P.Params, Any]:  # noqa: ARG002
        """Each client starts from its own personal model theta_i."""
        if _personal(state) is None:
            state = {**(state or {}), "personal": _stacked(global_params, self.n_clients)}
        idx = torch.as_tensor([int(c) for c in clients], dtype=torch.int64)
        return {n: t.index_select(0, idx.to(t.device)) for n, t in state["personal"].items()}, state

    def update(self, state: Any, params: P.Params, uploads: P.Params, inputs: RoundInputs) -> ServerUpdate:
        """theta_i <- start_i + upload_i for the participants (in new tensors: `state` stays as it was); the new
        thetabar is the mean over every client."""
        personal, starts = _personal(state), inputs.starts
        assert personal is not None and starts is not None
        idx = inputs.view.clients.to(torch.int64)
        new = {n: t.index_copy(0, idx.to(t.device), (starts[n] + uploads[n]).to(t.dtype)) for n, t in personal.items()}
        return ServerUpdate({n: t.mean(dim=0) for n, t in new.items()}, {**state, "personal": new}, {})

    def personal_models(self, state: Any, global_params: P.Params | None = None) -> dict[int, P.Params]:  # noqa: ARG002
        """client -> its personal model theta_i in `state` ({} where the state holds none)."""
        personal = _personal(state)
        if personal is None:
            return {}
        return {c: {n: t[c] for n, t in personal.items()} for c in range(self.n_clients)}


def _personal(state: Any) -> P.Params | None:
    return None if state is None else state.get("personal")


def _stacked(params: P.Params, n: int) -> P.Params:
    """n copies of `params`, stacked [n, ...] (own memory: never a view of the global model)."""
    return {name: t.clone() for name, t in P.broadcast(params, n).items()}

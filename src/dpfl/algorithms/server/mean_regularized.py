"""MR-MTL (clustered_dpfl.md §6): personal models pulled towards their mean.

Each client keeps a personal model theta_i (the server holds the population's, [n, ...]) and trains it with DP-SGD on
its loss plus (lambda / 2) ||theta_i - thetabar||^2, thetabar held fixed: the local program's prox term with
`prox_to="anchor"` (the engine adds its data-independent gradient after clipping and noise). The server then sets
thetabar = (1/n) sum_i theta_i over all clients (post-processing of the uploads). lambda = 0 is Local training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import CheckpointedServerStep, RoundInputs
from dpfl.engine import params as P


@dataclass
class MeanRegularized(CheckpointedServerStep):
    """Aggregate stage of MR-MTL over `n_clients` personal models (all start at the initial model)."""

    n_clients: int
    personal: P.Params | None = field(default=None, repr=False)  # stacked [n, ...]

    personalises_starts = True
    linear_in_updates = False

    def starts(self, global_params: P.Params, clients: Sequence[int], round_: int) -> P.Params:  # noqa: ARG002
        """Each client starts from its own personal model theta_i."""
        if self.personal is None:
            self.personal = P.broadcast(global_params, self.n_clients)
            self.personal = {n: t.clone() for n, t in self.personal.items()}
        idx = torch.as_tensor([int(c) for c in clients], dtype=torch.int64)
        return {n: t.index_select(0, idx) for n, t in self.personal.items()}

    def step(self, params: P.Params, uploads: P.Params, inputs: RoundInputs) -> P.Params:
        return self.aggregate(params, uploads, inputs.view, inputs.seed, inputs.round_, starts=inputs.starts)

    def aggregate(self, global_params: P.Params, uploads: P.Params, view: ServerView, seed: int, round_: int,
                  starts: P.Params | None = None) -> P.Params:  # noqa: ARG002
        """theta_i <- start_i + upload_i for the participants; the new thetabar is the mean over every client."""
        assert self.personal is not None and starts is not None
        idx = view.clients.to(torch.int64)
        for n, t in self.personal.items():
            t.index_copy_(0, idx, (starts[n] + uploads[n]).to(t.dtype))
        return {n: t.mean(dim=0) for n, t in self.personal.items()}

    def personal_models(self, global_params: P.Params | None = None) -> dict[int, P.Params]:  # noqa: ARG002
        if self.personal is None:
            return {}
        return {c: {n: t[c] for n, t in self.personal.items()} for c in range(self.n_clients)}

    def state_dict(self) -> dict[str, Any]:
        return {"personal": None if self.personal is None else {n: t.clone() for n, t in self.personal.items()}}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore `state_dict()` output; None resets to the state before round 1."""
        self.personal = None if state is None or state["personal"] is None else {
            n: t.clone() for n, t in state["personal"].items()}

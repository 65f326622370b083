"""The splitting scheme as the aggregate stage of the federated round loop (networks trained by the engine).

The engine is the local operator: a prox preset's client runs (DP-)SGD on f_i(x) + ||x - u_i||^2 / (2 eta) from
its own start u_i (the local program's proximal term mu = 1/eta, relative to the start: the inexact prox with warm
start u), a gradient preset's client runs its local SGD steps from u_i. The server stage keeps the population's
u and z (float64, [n, p]: the per-client state this algorithm needs), sends each participant its u_i
(`start_points`), receives L_i(u_i) - u_i (the upload stage may clip and noise it: that is the DP release) and runs
`SplittingServer.step` with the schedule's eta_t (the local program follows the same schedule: its `round_specs`).
Its new global model is xbar (or the ergodic average / shadow, as configured).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dpfl.algorithms.server.splitting.privacy import NO_CONVERGENCE_GUARANTEE
from dpfl.algorithms.server.splitting.scheme import SplittingServer, UnifiedSplitting
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import CheckpointedServerStep, RoundInputs
from dpfl.engine import params as P


@dataclass(frozen=True)
class EngineOperator:
    """The local operator of a network run: the engine's local program (a marker for the scheme's checks)."""

    kind: str

    def inner_steps(self, n_records: int) -> int:
        return 1  # the engine's DP-SGD steps are accounted by the local program itself

    def apply(self, fns, idx, U, eta, call):  # noqa: ARG002
        raise ValueError("a network's local operator runs in the engine (FederatedRun), not on a convex problem")


@dataclass
class SplittingAggregator(CheckpointedServerStep):
    """Aggregate stage of a splitting preset over a population of `n_clients` (uniform lambda_i = 1/n)."""

    scheme: UnifiedSplitting
    n_clients: int
    noisy: bool = False  # the local program or the upload adds DP noise (rows then carry the §9 label)
    server: SplittingServer | None = field(default=None, repr=False)
    last: dict[str, Any] = field(default_factory=dict, repr=False)

    personalises_starts = True
    linear_in_updates = False  # reflections of stale z: no sum_i w_i^2 sigma_i^2 noise statistic

    def __post_init__(self) -> None:
        if isinstance(self.n_clients, bool) or not isinstance(self.n_clients, int) or self.n_clients < 1:
            raise ValueError(f"the population must have >= 1 client, got {self.n_clients!r}")
        if self.scheme.weights != "uniform":
            raise ValueError("splitting on networks weights clients uniformly (lambda_i = 1/n)")

    def _server(self, global_params: P.Params) -> SplittingServer:
        if self.server is None:
            x0 = P.flatten(global_params, leading=0).to(torch.float64)
            self.server = self.scheme.server(x0, torch.ones(self.n_clients, dtype=torch.int64))
        return self.server

    def starts(self, global_params: P.Params, clients: Sequence[int], round_: int) -> P.Params:  # noqa: ARG002
        """Each participant's u_i, stacked [K, ...] in the model's dtype."""
        server = self._server(global_params)
        idx = torch.as_tensor([int(c) for c in clients], dtype=torch.int64)
        return _unflatten(server.broadcast(idx), global_params)

    def step(self, params: P.Params, uploads: P.Params, inputs: RoundInputs) -> P.Params:
        return self.aggregate(params, uploads, inputs.view, inputs.seed, inputs.round_, starts=inputs.starts)

    def aggregate(self, global_params: P.Params, uploads: P.Params, view: ServerView, seed: int, round_: int,
                  starts: P.Params | None = None) -> P.Params:  # noqa: ARG002
        """z, xbar, w, u from the released L_i(u_i) = u_i + upload_i; returns the reported model."""
        server = self._server(global_params)
        idx = view.clients.to(torch.int64)
        start = server.broadcast(idx)
        outputs = start + P.flatten(uploads).to(torch.float64)
        eta = self.scheme.schedule(round_)
        result = server.step(idx, outputs, eta)
        self.last = {"eta": eta, "residual": result.residual, "anderson": result.anderson,
                     "anderson_fallbacks": server.window.fallbacks if server.window is not None else 0}
        if not math.isfinite(result.residual):
            self.last["diverged"] = True
        if self.noisy and self.scheme.reflects:
            self.last["label"] = NO_CONVERGENCE_GUARANTEE
        return _unflatten(result.reported, global_params)

    def diagnostics(self) -> dict[str, Any]:
        return dict(self.last)

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.server is None else self.server.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore `state_dict()` output; None resets to the state before round 1 (built from the first model)."""
        if state is None:
            self.server = None
            return
        x0 = state["xbar"]
        self.server = self.scheme.server(x0, torch.ones(self.n_clients, dtype=torch.int64))
        self.server.load_state_dict(state)


def _unflatten(flat: torch.Tensor, like: P.Params) -> P.Params:
    """[D] or [K, D] float64 rows as parameter tensors shaped and typed like the model's."""
    dtype = next(iter(like.values())).dtype
    return {n: t.contiguous() for n, t in P.unflatten(flat.to(dtype), like, leading=0).items()}

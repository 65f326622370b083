"""The splitting scheme as the aggregate stage of the federated round loop (networks trained by the engine).

The engine is the local operator: a prox preset's client runs (DP-)SGD on f_i(x) + ||x - u_i||^2 / (2 eta) from
its own start u_i (the local program's proximal term mu = 1/eta, relative to the start: the inexact prox with warm
start u), a gradient preset's client runs its local SGD steps from u_i. The server stage sends each participant its u_i
(`start_points`), receives L_i(u_i) - u_i (the upload stage may clip and noise it: that is the DP release) and runs
`SplittingServer.step` with the schedule's eta_t (the local program follows the same schedule: its `round_specs`).
Its new global model is xbar (or the ergodic average / shadow, as configured).

State (explicit, the loop holds and checkpoints it): `SplittingServer.state_dict()`, a dict with the population's
"u" and "z" (float64, [n, p]: the per-client state this algorithm needs), "xbar" ([p]), "anderson" (the window's
{"pairs": [(u^s, T u^s), ...], "fallbacks": running count}, or None without Anderson), "ergodic" ({"total",
"mean"}, or None), and for fedpi_admm "theta" and "dual". Each call builds a working `SplittingServer` over the
state's tensors (`UnifiedSplitting.server_at`), cloning only what its step writes in place, so a state passed in is
never changed and the per-round copy is one [n, p] tensor (z), not the whole state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpfl.algorithms.server.splitting.privacy import NO_CONVERGENCE_GUARANTEE
from dpfl.algorithms.server.splitting.scheme import UnifiedSplitting
from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
from dpfl.engine import params as P


@dataclass(frozen=True)
class EngineOperator:
    """The local operator of a network run: the engine's local program (a marker for the scheme's checks)."""

    kind: str

    def inner_steps(self, n_records: int) -> int:
        return 1  # the engine's DP-SGD steps are accounted by the local program itself

    def apply(self, fns, idx, U, eta, call):  # noqa: ARG002
        raise ValueError("a network's local operator runs in the engine (FederatedRun), not on a convex problem")


@dataclass(frozen=True)
class SplittingAggregator(ServerStep):
    """Aggregate stage of a splitting preset over a population of `n_clients` (uniform lambda_i = 1/n).

    Config only: the state is the server's `state_dict()` (see the module docstring), None in a checkpoint written
    before round 1 (the state was then built from the first global model, which is the initial one)."""

    scheme: UnifiedSplitting
    n_clients: int
    noisy: bool = False  # the local program or the upload adds DP noise (rows then carry the §9 label)

    personalises_starts = True
    linear_in_updates = False  # reflections of stale z: no sum_i w_i^2 sigma_i^2 noise statistic

    def __post_init__(self) -> None:
        if isinstance(self.n_clients, bool) or not isinstance(self.n_clients, int) or self.n_clients < 1:
            raise ValueError(f"the population must have >= 1 client, got {self.n_clients!r}")
        if self.scheme.weights != "uniform":
            raise ValueError("splitting on networks weights clients uniformly (lambda_i = 1/n)")

    def init(self, params: P.Params) -> dict[str, Any]:
        """u_i = z_i = xbar = x0 (the initial global model, flattened, float64) for every client."""
        x0 = P.flatten(params, leading=0).to(torch.float64)
        return self.scheme.server(x0, self._records()).state_dict(clone=False)  # fresh tensors: no copy needed

    def start_points(self, state: dict[str, Any] | None, global_params: P.Params, clients: Sequence[int],
                     round_: int) -> tuple[P.Params, dict[str, Any]]:  # noqa: ARG002
        """Each participant's u_i, stacked [K, ...] in the model's dtype; the state is unchanged (built from the
        global model if it is None)."""
        state = self._state(state, global_params)
        idx = torch.as_tensor([int(c) for c in clients], dtype=torch.int64)
        starts = self.scheme.server_at(state, self._records(), read_only=True).broadcast(idx)
        return _unflatten(starts, global_params), state

    def update(self, state: dict[str, Any] | None, params: P.Params, uploads: P.Params,
               inputs: RoundInputs) -> ServerUpdate:
        """z, xbar, w, u from the released L_i(u_i) = u_i + upload_i; the reported model, the new state (a working
        server's, built from `state` without writing it) and the round's metrics."""
        server = self.scheme.server_at(self._state(state, params), self._records())
        idx = inputs.view.clients.to(torch.int64)
        start = server.broadcast(idx)
        outputs = start + P.flatten(uploads).to(torch.float64)
        eta = self.scheme.schedule(inputs.round_)
        result = server.step(idx, outputs, eta)
        metrics: dict[str, Any] = {"eta": eta, "residual": result.residual, "anderson": result.anderson,
                                   "anderson_fallbacks": server.window.fallbacks if server.window is not None else 0}
        if not math.isfinite(result.residual):
            metrics["diverged"] = True
        if self.noisy and self.scheme.reflects:
            metrics["label"] = NO_CONVERGENCE_GUARANTEE
        # the working server is dropped: its tensors become the new state's (those it shares with `state` were
        # never written)
        return ServerUpdate(_unflatten(result.reported, params), server.state_dict(clone=False), metrics)

    def _records(self) -> torch.Tensor:
        return torch.ones(self.n_clients, dtype=torch.int64)  # uniform lambda_i = 1/n

    def _state(self, state: dict[str, Any] | None, global_params: P.Params) -> dict[str, Any]:
        """`state`, or for a checkpoint written before round 1 (None) the state built from the global model."""
        return self.init(global_params) if state is None else state


def _unflatten(flat: torch.Tensor, like: P.Params) -> P.Params:
    """[D] or [K, D] float64 rows as parameter tensors shaped and typed like the model's (a copy: never a view of
    the state, even for a float64 model)."""
    dtype = next(iter(like.values())).dtype
    return {n: t.contiguous() for n, t in P.unflatten(flat.to(dtype, copy=True), like, leading=0).items()}

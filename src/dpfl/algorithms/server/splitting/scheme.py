"""The grand unified splitting scheme (operator_splitting.md §3-4): one round of every preset.

State: one point u_i per client. Round t with step eta_t and participants S_t:

    z_i = (1 - alpha) u_i + alpha L_i(u_i)                  for i in S_t (the others keep their z_i)
    xbar = sum_{S_t} lambda_i z_i / sum_{S_t} lambda_i       (= P_H(z) under full participation)
    w_i = (1 - beta) z_i + beta xbar,   u_i <- (1 - gamma) u_i + gamma w_i     for every client

The map u -> u' is nonexpansive for convex f_i, alpha, beta in [0, 2] and gamma in [0, 1]; outside these
ranges the scheme runs with a warning (the paper's guarantees do not apply). The reported model is xbar (or,
with report="shadow", the participants' mean of L_i(u_i)). FedAvg, FedProx, FedSplit, FedPi, FedRP are presets
(`presets.py`). The per-client state u (and z) is the population store this algorithm keeps.

Modes give the same iterates and differ in who computes what and what travels: "centralized" (client i gets
u_i, returns L_i(u_i); the server keeps z and u) and "decentralized" (clients keep u_i and z_i and upload z_i;
the server only averages and broadcasts xbar). Partial participation needs the server to hold z and u
whenever beta != 1 or gamma != 1, so decentralized mode refuses it there.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.client.local_operators import KINDS, LocalOperator, OperatorCall
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.splitting.anderson import AndersonII, AndersonWindow, weighted_norm
from dpfl.algorithms.server.splitting.privacy import NO_CONVERGENCE_GUARANTEE, SplittingDP
from dpfl.algorithms.server.splitting.schedules import ErgodicAverage, StepSchedule

MODES: tuple[str, ...] = ("centralized", "decentralized")
REPORTS: tuple[str, ...] = ("xbar", "shadow")
WEIGHTINGS: tuple[str, ...] = ("uniform", "samples")


@dataclass(frozen=True)
class UnifiedSplitting:
    """(alpha, beta, gamma, local operator) plus how the rounds run. See the module docstring."""

    alpha: float
    beta: float
    gamma: float
    local: LocalOperator
    schedule: StepSchedule
    name: str = "custom"
    weights: str = "uniform"
    mode: str = "centralized"
    participation: Selection = field(default_factory=Selection)
    report: str = "xbar"
    ergodic: bool = False
    anderson: AndersonII | None = None
    dp: SplittingDP | None = None

    def __post_init__(self) -> None:
        for name, value in (("alpha", self.alpha), ("beta", self.beta), ("gamma", self.gamma)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if getattr(self.local, "kind", None) not in KINDS:
            raise ValueError(f"the local operator must be a gradient or prox operator, got {self.local!r}")
        for name, value, allowed in (("weights", self.weights, WEIGHTINGS), ("mode", self.mode, MODES),
                                     ("report", self.report, REPORTS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        partial = self.participation.kind != "all"
        in_h = self.beta == 1 and self.gamma == 1  # u is in the consensus subspace after round 0
        if self.mode == "decentralized" and partial and not in_h:
            raise ValueError("decentralized mode with partial participation needs beta = gamma = 1: the server must "
                             "hold z and u to update non-participants (use mode: centralized)")
        if self.anderson is not None and self.anderson.memory > 0:
            if self.anderson.scope == "global" and not in_h:
                raise ValueError("Anderson scope 'global' accelerates the server model only, which needs u in the "
                                 "consensus subspace (beta = gamma = 1: fedavg, fedprox, fedrp); use scope 'state'")
            if self.anderson.scope == "state" and self.mode == "decentralized" and not in_h:
                raise ValueError("Anderson scope 'state' needs mode 'centralized' unless beta = gamma = 1")
        if self.dp is not None and self.dp.mode == "dpsgd" and self.local.inner_steps(1) < 1:
            raise ValueError("dp mode 'dpsgd' runs inside the local operator's steps; the exact least-squares prox "
                             "has none (use dp mode 'update_gaussian')")
        if not (0 <= self.alpha <= 2 and 0 <= self.beta <= 2 and 0 <= self.gamma <= 1):
            warnings.warn(f"{self.name}: alpha={self.alpha}, beta={self.beta}, gamma={self.gamma} is outside "
                          "alpha, beta in [0, 2], gamma in [0, 1]: the round map need not be nonexpansive and the "
                          "paper's guarantees do not apply", stacklevel=2)

    @property
    def reflects(self) -> bool:
        """A reflection preset (alpha or beta != 1: fedsplit, fedpi, fedrp, ...), whose noisy runs carry the §9
        label."""
        return self.alpha != 1 or self.beta != 1

    @property
    def guarantee_label(self) -> str | None:
        """The label a DP run of a reflection preset carries (§9)."""
        if self.dp is not None and self.dp.noise_multiplier != 0 and self.reflects:
            return NO_CONVERGENCE_GUARANTEE
        return None

    def lambdas(self, n_records: torch.Tensor) -> torch.Tensor:
        if self.weights == "uniform":
            return torch.full((len(n_records),), 1.0 / len(n_records), dtype=torch.float64)
        n = n_records.to(torch.float64)
        return n / n.sum()

    def server(self, x0: torch.Tensor, n_records: torch.Tensor) -> SplittingServer:
        """The state of a fresh run: u_i^0 = z_i^0 = x0 for every client."""
        return SplittingServer(self, x0, self.lambdas(n_records))

    def server_at(self, state: dict[str, Any], n_records: torch.Tensor, *, read_only: bool = False) -> SplittingServer:
        """A server at `state` (its `state_dict()`), leaving `state` unchanged (`SplittingServer.from_state`)."""
        return SplittingServer.from_state(self, self.lambdas(n_records), state, read_only=read_only)


@dataclass
class RoundResult:
    """One round as the server saw it."""

    xbar: torch.Tensor  # the consensus average of this round's z
    reported: torch.Tensor  # the reported model (xbar, its shadow, or the ergodic average)
    residual: float  # ||u^t - T u^t||_lambda (un-accelerated T)
    anderson: str  # plain / accelerated / fallback: why / skipped (empty round)
    participants: int
    bytes_up: int
    bytes_down: int


class SplittingServer:
    """The per-run state of a `UnifiedSplitting`: u and z for every client, the Anderson window, the ergodic mean."""

    def __init__(self, alg: UnifiedSplitting, x0: torch.Tensor, lambdas: torch.Tensor) -> None:
        n = len(lambdas)
        self.alg, self.lam = alg, lambdas
        self.u = x0.to(torch.float64).expand(n, -1).clone()
        self.z = self.u.clone()
        self.xbar = x0.to(torch.float64).clone()
        self.window: AndersonWindow | None = alg.anderson.window() if alg.anderson is not None else None
        self.average = ErgodicAverage() if alg.ergodic else None

    def average_of(self, rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The lambda-weighted mean of `rows` of clients idx, weights renormalised over them."""
        w = self.lam[idx]
        return (w / w.sum()) @ rows

    def round(self, fns: Any, idx: torch.Tensor, eta: float, seed: int, round_: int) -> RoundResult:
        """Round round_ on a convex problem with participants idx (sorted ids): the local operators, the DP release,
        then the server step."""
        alg = self.alg
        if len(idx) == 0:
            return self.step(idx, torch.zeros(0, self.u.shape[1], dtype=self.u.dtype), eta)
        start = self.broadcast(idx)
        call = OperatorCall(seed, round_, self.xbar, alg.dp.inner() if alg.dp is not None else None)
        local = alg.local.apply(fns, idx, start, eta, call)
        if alg.dp is not None:
            local = alg.dp.release(start, local, idx, seed, round_)
        return self.step(idx, local, eta)

    def broadcast(self, idx: torch.Tensor) -> torch.Tensor:
        """The points participants idx start from: u_i (sent by the server in centralized mode, held by the clients
        in decentralized mode)."""
        return self.u[idx]

    def step(self, idx: torch.Tensor, local: torch.Tensor, eta: float) -> RoundResult:
        """The server's part of a round, given what participants idx released: L_i(u_i) (rows in idx order)."""
        alg = self.alg
        itemsize = self.u.element_size()
        p = self.u.shape[1]
        if len(idx) == 0:  # a no-op round (state unchanged), logged
            return RoundResult(self.xbar, self._report(self.xbar, None, eta), 0.0, "skipped", 0, 0, 0)
        local = local.to(self.u.dtype)
        u_before = self.u  # the updates below assign a new self.u (never in place), so no copy is needed
        if alg.mode == "centralized":
            xbar, bytes_down = self._centralized(idx, local), len(idx) * p * itemsize  # u_i to each participant
        else:
            xbar, bytes_down = self._decentralized(idx, local), len(self.lam) * p * itemsize  # xbar to every client
        tu = self.u
        residual = weighted_norm(u_before - tu, self.lam)
        status = "plain"
        if self.window is not None:
            if alg.anderson.scope == "state":
                self.u, status = self.window.next(u_before, tu, self.lam)
            else:  # u is (xbar, ..., xbar): accelerate the server model and broadcast it
                accelerated, status = self.window.next(u_before[0], tu[0])
                self.u = accelerated.expand_as(tu).clone()
        self.xbar = xbar
        shadow = self.average_of(local, idx) if alg.report == "shadow" else None
        return RoundResult(xbar, self._report(xbar, shadow, eta), residual, status, len(idx),
                           len(idx) * p * itemsize, bytes_down)

    def _centralized(self, idx: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """The server received L_i(u_i) from each participant and does everything else."""
        a, b, g = self.alg.alpha, self.alg.beta, self.alg.gamma
        self.z[idx] = (1 - a) * self.u[idx] + a * local
        xbar = self.average_of(self.z[idx], idx)
        w = (1 - b) * self.z + b * xbar
        self.u = (1 - g) * self.u + g * w
        return xbar

    def _decentralized(self, idx: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """Participants form and upload z_i; the server averages; every client updates its own u_i from xbar."""
        a, b, g = self.alg.alpha, self.alg.beta, self.alg.gamma
        uploads = (1 - a) * self.u[idx] + a * local  # computed on each participant
        self.z[idx] = uploads  # (client-held)
        xbar = self.average_of(uploads, idx)  # the server's only computation
        client_z, client_u = self.z, self.u  # each client's own rows
        self.u = (1 - g) * client_u + g * ((1 - b) * client_z + b * xbar)
        return xbar

    def _report(self, xbar: torch.Tensor, shadow: torch.Tensor | None, eta: float) -> torch.Tensor:
        model = shadow if shadow is not None else xbar
        if self.average is not None:
            return self.average.add(model, eta).clone()
        return model

    @classmethod
    def from_state(cls, alg: UnifiedSplitting, lambdas: torch.Tensor, state: dict[str, Any], *,
                   read_only: bool = False) -> SplittingServer:
        """A server at `state` (a `state_dict()`) that shares its tensors and leaves it unchanged: `step` assigns new
        u, xbar and Anderson pairs instead of writing them, so only what it writes in place is cloned (z's rows, the
        ergodic mean), and z not even that when `read_only` (the server only broadcasts)."""
        server = cls.__new__(cls)
        server.alg, server.lam = alg, lambdas
        server.u, server.xbar = state["u"], state["xbar"]
        server.z = state["z"] if read_only else state["z"].clone()
        server.window = AndersonWindow.from_state(alg.anderson, state["anderson"]) if alg.anderson is not None else None
        server.average = ErgodicAverage.from_state(state["ergodic"]) if alg.ergodic else None
        return server

    def state_dict(self, *, clone: bool = True) -> dict[str, Any]:
        """The state; `clone=False` hands over this server's own tensors (for a caller that drops the server)."""
        def own(t: torch.Tensor) -> torch.Tensor:
            return t.clone() if clone else t

        return {"u": own(self.u), "z": own(self.z), "xbar": own(self.xbar),
                "anderson": self.window.state_dict(clone=clone) if self.window is not None else None,
                "ergodic": self.average.state_dict(clone=clone) if self.average is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.u, self.z, self.xbar = state["u"].clone(), state["z"].clone(), state["xbar"].clone()
        if self.window is not None:
            self.window.load_state_dict(state["anderson"])
        if self.average is not None:
            self.average.load_state_dict(state["ergodic"])


def participants(alg: UnifiedSplitting, n_clients: int, seed: int, round_: int) -> torch.Tensor:
    """S_t: every client, Bernoulli(p) each (selection poisson), or a fixed-size sample; recorded by the caller."""
    drawn = alg.participation.select(np.arange(n_clients), seed, round_)
    return torch.as_tensor(drawn, dtype=torch.int64)

"""The named members of the splitting family: each is (alpha, beta, gamma, local operator) (§3).

| preset   | alpha | beta | gamma | L         | method                                               |
| fedavg   | 1     | 1    | 1     | G_{f,k}   | forward-backward; fixed point depends on eta (k - 1) |
| fedprox  | 1     | 1    | 1     | P_f       | backward-backward; constant eta solves the envelope problem (2.6) |
| fedsplit | 2     | 2    | 1     | P_f       | Peaceman-Rachford u <- R_H R_f u; linear rate needs strong convexity |
| fedpi    | 2     | 2    | 1/2   | P_f       | Douglas-Rachford / partial inverse; exact for convex f_i, constant eta |
| fedrp    | 2     | 1    | 1     | P_f       | reflection-projection u <- P_H R_f u; fixed points solve (2.6) |
| rh_g     | 1     | 2    | 1     | G_{f,k}   | u <- R_H G_f u (expected to converge only under strong convexity) |
| rh_p     | 1     | 2    | 1     | P_f       | u <- R_H P_f u (same)                                 |

`fedpi_admm` is FedPi in its ADMM form (the server holds theta and duals u_i in H^perp); it produces the
same iterates as `fedpi` with u = theta + u_dual.
"""

from __future__ import annotations

from typing import Any

import torch

from dpfl.algorithms.client.local_operators import GradientSteps, InexactProx, LocalOperator
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.splitting.anderson import weighted_norm
from dpfl.algorithms.server.splitting.scheme import RoundResult, SplittingServer, UnifiedSplitting
from dpfl.algorithms.server.splitting.schedules import StepSchedule

# name -> (alpha, beta, gamma, operator kind)
PRESETS: dict[str, tuple[float, float, float, str]] = {
    "fedavg": (1.0, 1.0, 1.0, "gradient"),
    "fedprox": (1.0, 1.0, 1.0, "prox"),
    "fedsplit": (2.0, 2.0, 1.0, "prox"),
    "fedpi": (2.0, 2.0, 0.5, "prox"),
    "fedrp": (2.0, 1.0, 1.0, "prox"),
    "rh_g": (1.0, 2.0, 1.0, "gradient"),
    "rh_p": (1.0, 2.0, 1.0, "prox"),
}
ADMM = "fedpi_admm"  # FedPi's (alpha, beta, gamma) in ADMM form
NAMES: tuple[str, ...] = (*PRESETS, ADMM)


def make(name: str, eta: float, local: LocalOperator | None = None, *, k: int = 1, schedule: str = "constant",
         period: int = 500, participation: Selection | None = None, **options: Any) -> UnifiedSplitting:
    """The preset `name` at step eta. `local` defaults to k gradient steps (gradient presets) or the inexact
    prox (prox presets); `options` are UnifiedSplitting's (weights, mode, report, ergodic, anderson, dp)."""
    base = "fedpi" if name == ADMM else name
    if base not in PRESETS:
        raise ValueError(f"unknown splitting preset {name!r}; choose one of {', '.join(NAMES)}")
    alpha, beta, gamma, kind = PRESETS[base]
    if local is None:
        local = GradientSteps(k) if kind == "gradient" else InexactProx()
    elif getattr(local, "kind", None) != kind:
        raise ValueError(f"preset {name!r} needs a {kind} operator, got {type(local).__name__} "
                         f"({getattr(local, 'kind', 'no kind')})")
    scheme = FedPiADMM if name == ADMM else UnifiedSplitting
    return scheme(alpha, beta, gamma, local, StepSchedule(eta, schedule, period), name=name,
                  participation=participation or Selection(), **options)


def fedavg(eta: float, k: int = 1, local: LocalOperator | None = None, **kw: Any) -> UnifiedSplitting:
    return make("fedavg", eta, local, k=k, **kw)


def fedprox(eta: float, local: LocalOperator | None = None, **kw: Any) -> UnifiedSplitting:
    return make("fedprox", eta, local, **kw)


def fedsplit(eta: float, local: LocalOperator | None = None, **kw: Any) -> UnifiedSplitting:
    return make("fedsplit", eta, local, **kw)


def fedpi(eta: float, local: LocalOperator | None = None, **kw: Any) -> UnifiedSplitting:
    return make("fedpi", eta, local, **kw)


def fedrp(eta: float, local: LocalOperator | None = None, **kw: Any) -> UnifiedSplitting:
    return make("fedrp", eta, local, **kw)


def rh_g(eta: float, k: int = 1, local: LocalOperator | None = None, **kw: Any) -> UnifiedSplitting:
    return make("rh_g", eta, local, k=k, **kw)


def rh_p(eta: float, local: LocalOperator | None = None, **kw: Any) -> UnifiedSplitting:
    return make("rh_p", eta, local, **kw)


def fedpi_admm(eta: float, local: LocalOperator | None = None, **kw: Any) -> UnifiedSplitting:
    return make(ADMM, eta, local, **kw)


class FedPiADMM(UnifiedSplitting):
    """FedPi as ADMM: client i receives theta + u_i and returns z_i = P(theta + u_i); the server sets
    theta' = sum_i lambda_i z_i (= P_H(z - u) since u is in H^perp) and u_i' = u_i + theta' - z_i. The duals
    double the server's memory. Full participation only (the paper's form)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.participation.kind != "all":
            raise ValueError("fedpi_admm runs with full participation; use fedpi for partial participation")
        if self.anderson is not None and self.anderson.memory > 0:
            raise ValueError("fedpi_admm has no Anderson acceleration; use fedpi with anderson")
        if self.report != "xbar" or self.mode != "centralized":
            raise ValueError("fedpi_admm reports theta and runs centralized")

    def server(self, x0: torch.Tensor, n_records: torch.Tensor) -> SplittingServer:
        return ADMMServer(self, x0, self.lambdas(n_records))

    def server_at(self, state: dict[str, Any], n_records: torch.Tensor, *, read_only: bool = False) -> SplittingServer:
        return ADMMServer.from_state(self, self.lambdas(n_records), state, read_only=read_only)


class ADMMServer(SplittingServer):
    """State: theta (the global model) and the duals u_i (start 0). `u` exposes theta + u_dual, the unified state."""

    def __init__(self, alg: UnifiedSplitting, x0: torch.Tensor, lambdas: torch.Tensor) -> None:
        super().__init__(alg, x0, lambdas)
        self.theta = x0.to(torch.float64).clone()
        self.dual = torch.zeros_like(self.u)

    def round(self, fns: Any, idx: torch.Tensor, eta: float, seed: int, round_: int) -> RoundResult:
        self.xbar = self.theta  # the inexact prox's warm start "server_avg" is theta
        return super().round(fns, idx, eta, seed, round_)

    def broadcast(self, idx: torch.Tensor) -> torch.Tensor:
        """What each participant receives: theta + u_i (personalised)."""
        return (self.theta + self.dual)[idx]

    def step(self, idx: torch.Tensor, z: torch.Tensor, eta: float) -> RoundResult:
        before = self.theta + self.dual
        theta = self.lam @ z.to(self.u.dtype)
        self.dual = self.dual + theta - z
        self.theta = theta
        self.u = self.theta + self.dual
        self.xbar = theta
        size = self.u.numel() * self.u.element_size()
        return RoundResult(theta, self._report(theta, None, eta), weighted_norm(before - self.u, self.lam), "plain",
                           len(idx), size, size)

    @classmethod
    def from_state(cls, alg: UnifiedSplitting, lambdas: torch.Tensor, state: dict[str, Any], *,
                   read_only: bool = False) -> ADMMServer:
        """As `SplittingServer.from_state`; `step` assigns new theta and duals, so they are shared."""
        server = super().from_state(alg, lambdas, state, read_only=read_only)
        server.theta, server.dual = state["theta"], state["dual"]
        return server

    def state_dict(self, *, clone: bool = True) -> dict[str, Any]:
        theta, dual = (self.theta.clone(), self.dual.clone()) if clone else (self.theta, self.dual)
        return {**super().state_dict(clone=clone), "theta": theta, "dual": dual}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.theta, self.dual = state["theta"].clone(), state["dual"].clone()

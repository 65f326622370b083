"""Server optimizers on the aggregate: FedAvgM, FedAdam, FedYogi, FedAdagrad (issue 68, item 2).

Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2, run on top of any server step: the
step computes its new global model x'_t from the uploads as it always does, the pseudo-gradient is
Delta_t = x'_t - x_t, and the server moves by its optimizer instead of by Delta_t:

    m_t = b1 m_{t-1} + (1 - b1) Delta_t
    v_t = v_{t-1} + Delta_t^2                                    (FedAdagrad)
    v_t = v_{t-1} - (1 - b2) Delta_t^2 sign(v_{t-1} - Delta_t^2)     (FedYogi)
    v_t = b2 v_{t-1} + (1 - b2) Delta_t^2                          (FedAdam)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

with m_{-1} = 0 and v_{-1} = tau^2 (Algorithm 2 asks v_{-1} >= tau^2; we take the bound, which is also the initial
accumulator 1e-6 of the paper's Yogi runs at tau = 1e-3), elementwise, no bias correction (Algorithm 2 has none).
FedAvgM (Hsu et al. 2019; Reddi et al.'s server momentum): m_t = beta m_{t-1} + Delta_t, x_{t+1} = x_t + eta m_t.

Privacy: the optimizer reads only x_t and x'_t, i.e. what the server step released, so it is post-processing of the
aggregate and changes no guarantee. `with_server_optimizer` refuses it where it would not be post-processing or would
change what the method is (`refusal`). Its state (m, v, the step count) is explicit, beside the wrapped step's own,
and checkpointed by the run loop with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
from dpfl.engine import params as P

if TYPE_CHECKING:
    from dpfl.algorithms.algorithm import Algorithm
    from dpfl.algorithms.server.oracle import NoiseChannel
    from dpfl.algorithms.server.view import ServerView

__all__ = ["DEFAULTS", "OPTIMIZERS", "OptimizedServerStep", "ServerOptimizer", "fedadagrad", "fedadam", "fedavgm",
           "fedyogi", "refusal", "unwrapped", "with_server_optimizer"]

OPTIMIZERS = ("fedavgm", "fedadam", "fedyogi", "fedadagrad")
# Each optimizer's settings and their defaults: eta as Flower's strategies (the paper tunes it per task on a grid),
# b1 0.9 / b2 0.99 / tau 1e-3 as the paper's experiments; FedAdagrad without momentum (b1 0) as the paper's runs
# (Keras Adagrad) and Flower; FedAvgM's momentum 0.9 as Hsu et al. and Reddi et al.'s FedAvgM.
DEFAULTS: dict[str, dict[str, float]] = {
    "fedavgm": {"lr": 1.0, "momentum": 0.9},
    "fedadam": {"lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3},
    "fedyogi": {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3},
    "fedadagrad": {"lr": 0.1, "beta1": 0.0, "tau": 1e-3},
}


@dataclass(frozen=True)
class ServerOptimizer:
    """One of `OPTIMIZERS` and its settings, optax-style: `init(params) -> state`, then each round
    `step(state, x, x_new) -> (x_{t+1}, new state, metrics)` (the module docstring's rules). A setting the
    optimizer does not use is left None. Build one with `fedavgm`, `fedadam`, `fedyogi` or `fedadagrad`."""

    name: str
    lr: float
    momentum: float | None = None
    beta1: float | None = None
    beta2: float | None = None
    tau: float | None = None

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"server optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.name!r}")
        used = DEFAULTS[self.name]
        for key in ("momentum", "beta1", "beta2", "tau"):
            value = getattr(self, key)
            if key in used and value is None:
                raise ValueError(f"{self.name}: {key} is required")
            if key not in used and value is not None:
                raise ValueError(f"{self.name}: does not use {key} (got {value!r})")
        if not (_finite(self.lr) and self.lr > 0):
            raise ValueError(f"{self.name}: lr must be > 0, got {self.lr!r}")
        for key in ("momentum", "beta1", "beta2"):
            value = getattr(self, key)
            if value is not None and not (_finite(value) and 0 <= value < 1):
                raise ValueError(f"{self.name}: {key} must be in [0, 1), got {value!r}")
        if self.tau is not None and not (_finite(self.tau) and self.tau > 0):
            raise ValueError(f"{self.name}: tau must be > 0, got {self.tau!r}")

    @property
    def adaptive(self) -> bool:
        """Whether the step divides by sqrt(v) + tau (FedAdam, FedYogi, FedAdagrad)."""
        return self.name != "fedavgm"

    def settings(self) -> dict[str, float]:
        """The settings this optimizer uses (for reports): lr and its others."""
        return {"lr": self.lr, **{k: getattr(self, k) for k in DEFAULTS[self.name] if k != "lr"}}

    def init(self, params: P.Params) -> dict[str, Any]:
        """m_{-1} = 0 (and v_{-1} = tau^2 for the adaptive ones), shaped as the global parameters; count 0."""
        state: dict[str, Any] = {"m": {n: torch.zeros_like(t) for n, t in params.items()}, "count": 0}
        if self.adaptive:
            assert self.tau is not None
            state["v"] = {n: torch.full_like(t, self.tau * self.tau) for n, t in params.items()}
        return state

    def step(self, state: dict[str, Any], x: P.Params, x_new: P.Params) -> tuple[P.Params, dict[str, Any],
                                                                                 dict[str, Any]]:
        """x_{t+1} from x_t = `x` and the wrapped step's x'_t = `x_new`; the new state (`state` is not changed) and
        the round's metrics: the norms of the pseudo-gradient Delta_t and of the server's move x_{t+1} - x_t.

        x_{t+1} is written x'_t + (s_t - Delta_t), s_t the optimizer's move: the same number as x_t + s_t, and
        exactly x'_t when s_t is Delta_t (FedAvgM with momentum 0 and lr 1 reproduces the wrapped step bit for bit).
        """
        out: P.Params = {}
        m_new: dict[str, torch.Tensor] = {}
        v_new: dict[str, torch.Tensor] = {}
        delta_sq = move_sq = 0.0
        for name, xt in x.items():
            delta = x_new[name] - xt
            m = state["m"][name]
            if self.adaptive:
                b1 = float(self.beta1)  # type: ignore[arg-type]
                m = b1 * m + (1.0 - b1) * delta
                v, d2 = state["v"][name], delta * delta
                if self.name == "fedadam":
                    b2 = float(self.beta2)  # type: ignore[arg-type]
                    v = b2 * v + (1.0 - b2) * d2
                elif self.name == "fedyogi":
                    v = v - (1.0 - float(self.beta2)) * d2 * torch.sign(v - d2)  # type: ignore[arg-type]
                else:  # fedadagrad
                    v = v + d2
                move = self.lr * m / (torch.sqrt(v) + float(self.tau))  # type: ignore[arg-type]
                v_new[name] = v
            else:
                m = float(self.momentum) * m + delta  # type: ignore[arg-type]
                move = self.lr * m
            m_new[name] = m
            out[name] = x_new[name] + (move - delta)
            delta_sq += float(delta.double().pow(2).sum())
            move_sq += float(move.double().pow(2).sum())
        new: dict[str, Any] = {"m": m_new, "count": int(state["count"]) + 1}
        if self.adaptive:
            new["v"] = v_new
        metrics = {"server_optimizer_delta_norm": math.sqrt(delta_sq),
                   "server_optimizer_step_norm": math.sqrt(move_sq)}
        return out, new, metrics


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fedavgm(lr: float = 1.0, momentum: float = 0.9) -> ServerOptimizer:
    """Server momentum (FedAvgM): m_t = momentum m_{t-1} + Delta_t, x_{t+1} = x_t + lr m_t."""
    return ServerOptimizer("fedavgm", lr, momentum=momentum)


def fedadam(lr: float = 0.1, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> ServerOptimizer:
    """FedAdam (Reddi et al. 2021, Algorithm 2): v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2."""
    return ServerOptimizer("fedadam", lr, beta1=beta1, beta2=beta2, tau=tau)


def fedyogi(lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> ServerOptimizer:
    """FedYogi (Reddi et al. 2021, Algorithm 2): v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)."""
    return ServerOptimizer("fedyogi", lr, beta1=beta1, beta2=beta2, tau=tau)


def fedadagrad(lr: float = 0.1, beta1: float = 0.0, tau: float = 1e-3) -> ServerOptimizer:
    """FedAdagrad (Reddi et al. 2021, Algorithm 2): v_t = v_{t-1} + Delta_t^2 (no momentum by default)."""
    return ServerOptimizer("fedadagrad", lr, beta1=beta1, tau=tau)


# ---- the wrapped server step ------------------------------------------------------------------------------------
def _inner(state: Any) -> Any:
    """The wrapped step's part of an `OptimizedServerStep` state (None before the run has one)."""
    return None if state is None else state["inner"]


def _with_inner(state: Any, inner: Any) -> Any:
    """`state` with its wrapped part replaced (itself when unchanged: the state passed in is never written)."""
    return state if inner is _inner(state) else {**state, "inner": inner}


@dataclass(frozen=True)
class OptimizedServerStep(ServerStep):
    """A server step followed by a server optimizer on its output (the module docstring).

    The loop sees the wrapped step unchanged: every optional ability and class flag of `ServerStep` is the wrapped
    step's, read on its part of the state, and any other attribute (a central step's `clip`, `noise_multiplier`)
    is read through. State: {"inner": the wrapped step's state, "optimizer": the optimizer's}.
    """

    inner: ServerStep
    optimizer: ServerOptimizer

    def __getattr__(self, name: str) -> Any:  # only for names not found on the wrapper itself
        if name.startswith("__") or name in ("inner", "optimizer"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    # the class flags (privileged, secure, ...), adaptive_clipping and noise are properties reading the wrapped
    # step's: set on the class below (`_FLAGS`), one line each instead of one property written out per flag

    def with_noise(self, noise: float) -> OptimizedServerStep:
        return replace(self, inner=self.inner.with_noise(noise))

    # -- explicit state ---------------------------------------------------------------------------------------
    def init(self, params: P.Params) -> dict[str, Any]:
        return {"inner": self.inner.init(params), "optimizer": self.optimizer.init(params)}

    def update(self, state: Any, params: P.Params, uploads: Any, inputs: RoundInputs) -> ServerUpdate:
        """The wrapped step's update gives x'_t; the optimizer moves x_t by its rule on Delta_t = x'_t - x_t."""
        inner = self.inner.update(state["inner"], params, uploads, inputs)
        new_params, opt_state, metrics = self.optimizer.step(state["optimizer"], params, inner.params)
        return ServerUpdate(new_params, {"inner": inner.state, "optimizer": opt_state}, {**inner.metrics, **metrics})

    # -- the optional abilities, as the wrapped step's ---------------------------------------------------------
    def fit_split(self, clients: Any, eps_reported: Any, seed: int = 0) -> ServerStep:
        fitted = self.inner.fit_split(clients, eps_reported, seed)
        return self if fitted is self.inner else replace(self, inner=fitted)

    def accounted_selection(self, selection: Any) -> Any:
        return self.inner.accounted_selection(selection)

    def accepts_selection(self, selected: Sequence[int]) -> bool:
        return self.inner.accepts_selection(selected)

    @property
    def public_clients(self) -> tuple[int, ...] | None:
        return self.inner.public_clients

    def start_points(self, state: Any, global_params: P.Params, clients: Sequence[int],
                     round_: int) -> tuple[P.Params | None, Any]:
        starts, inner = self.inner.start_points(_inner(state), global_params, clients, round_)
        return starts, _with_inner(state, inner)

    def broadcast(self, state: Any, global_params: P.Params, clients: Sequence[int], seed: int, round_: int,
                  attempt: int = 0) -> tuple[Any, Any]:
        sent, inner = self.inner.broadcast(_inner(state), global_params, clients, seed, round_, attempt)
        return sent, _with_inner(state, inner)

    def client_payload(self, state: Any, uploads: P.Params, view: ServerView, seed: int = 0) -> Any:
        return self.inner.client_payload(_inner(state), uploads, view, seed)

    def model_choice(self, state: Any, round_: int, global_params: P.Params) -> Any:
        return self.inner.model_choice(_inner(state), round_, global_params)

    def chosen(self, state: Any, round_: int, picks: dict[int, int]) -> tuple[Any, dict[str, Any]]:
        inner, metrics = self.inner.chosen(_inner(state), round_, picks)
        return _with_inner(state, inner), metrics

    def personal_models(self, state: Any, global_params: P.Params) -> dict[int, P.Params]:
        return self.inner.personal_models(_inner(state), global_params)

    def privacy_notes(self, state: Any, history: Sequence[dict[str, Any]] = ()) -> dict[str, Any] | None:
        return self.inner.privacy_notes(_inner(state), history)

    def protocol_description(self) -> dict[str, Any] | None:
        return self.inner.protocol_description()

    def aggregation_weights(self, state: Any, view: ServerView, channel: NoiseChannel | None,
                            dim: int) -> torch.Tensor | None:
        return self.inner.aggregation_weights(_inner(state), view, channel, dim)

    def public_mask(self, view: ServerView, seed: int = 0) -> torch.Tensor | None:
        return self.inner.public_mask(view, seed)

    def noise_passthrough(self, uploads: P.Params, noise: P.Params, view: ServerView, seed: int,
                          round_: int) -> P.Params | None:
        return self.inner.noise_passthrough(uploads, noise, view, seed, round_)


# the wrapped step's flags as the wrapper's (linear_in_updates: the noise statistic describes Delta_t, the aggregate
# the optimizer reads); adaptive_clipping and noise: what the wrapped step runs and charges
_FLAGS = ("privileged", "secure", "linear_in_updates", "asks_clients", "personalises_starts", "encodes_broadcast",
          "encodes_uploads", "replays_noise", "central_noise", "calibration_family", "adaptive_clipping", "noise",
          "server_lr")
for _flag in _FLAGS:
    setattr(OptimizedServerStep, _flag, property(lambda self, _name=_flag: getattr(self.inner, _name)))


def unwrapped(step: ServerStep) -> ServerStep:
    """The server step under any server optimizer (what isinstance checks of a step's kind look at)."""
    while isinstance(step, OptimizedServerStep):
        step = step.inner
    return step


# ---- where it is allowed ------------------------------------------------------------------------------------------
def refusal(algorithm: Algorithm) -> str | None:
    """Why a server optimizer cannot run on `algorithm`'s server step, or None if it can.

    Allowed where the step releases one global model that the optimizer only post-processes. Refused: a step with
    personal or cluster models or its own iterates (it personalises the clients' start models: FedCEO, the
    clustered methods, MR-MTL, the splitting preset), one that asks the clients after aggregating (R-DPCFL), MP-DP's
    perturbed broadcast (the update is recovered inside the protocol), client-side personal state (PPSGD,
    CENTAUR), a server_lr other than 1 (the optimizer's lr replaces it), and Noisy-FedAvg/FedProx's
    shifted-interpolation bound (release final with smoothness_L), which follows the plain average's iterates.
    """
    step = algorithm.aggregator
    name = algorithm.name
    if isinstance(step, OptimizedServerStep):
        return f"algorithm {name!r} already has a server optimizer ({step.optimizer.name})"
    if algorithm.personal is not None:
        return (f"algorithm {name!r} keeps a personal part of each model on its clients: its server step is part of "
                "the method, not a post-processing of one global model")
    if step.encodes_broadcast:
        return (f"algorithm {name!r} broadcasts a perturbed model and recovers the update inside its protocol "
                "(MP-DP): there is no released global step to post-process")
    if step.asks_clients or step.personalises_starts:
        return (f"algorithm {name!r} keeps personal or cluster models (or its own iterates) in its server step: a "
                "server optimizer on one global model would change the method")
    if step.server_lr != 1.0:
        return (f"algorithm {name!r} has server_lr {step.server_lr:g}: the server optimizer's lr replaces it; leave "
                "algorithm.params.server_lr at 1")
    fdp = algorithm.upload.fdp_accounting
    if fdp is not None and fdp.view == "aggregate" and fdp.release == "final" and fdp.rho is not None:
        return (f"algorithm {name!r} with privacy.release final and smoothness_L is accounted by the "
                "shifted-interpolation bound, which follows the plain average's iterates; use release transcript")
    return None


def with_server_optimizer(algorithm: Algorithm, optimizer: ServerOptimizer) -> Algorithm:
    """`algorithm` with `optimizer` on its server step's output (`OptimizedServerStep`); a ValueError naming the
    reason where it is refused (`refusal`). Config: `algorithm.server_optimizer`."""
    if not isinstance(optimizer, ServerOptimizer):
        raise TypeError(f"a server optimizer is made by fedavgm, fedadam, fedyogi or fedadagrad; got "
                        f"{type(optimizer).__name__}")
    problem = refusal(algorithm)
    if problem is not None:
        raise ValueError(f"server optimizer {optimizer.name}: {problem}")
    return replace(algorithm, aggregator=OptimizedServerStep(algorithm.aggregator, optimizer))

"""Local operators L_i of the operator-splitting family (operator_splitting.md §5), for convex problems.

Each operator maps the clients' points U [k, d] (rows are clients `idx`) to L_i(u_i) at step eta. "gradient"
operators are G^eta_{f,k} (k gradient steps of size eta), "prox" operators approximate or compute
P^eta_f(u) = argmin_x f(x) + ||x - u||^2 / (2 eta). f_i is a sum over the client's samples, so a minibatch
gradient is the unbiased (N_i / B) sum over the batch.

DP-SGD inside an operator (operator_splitting §9, dp="dpsgd"): at every inner step each record joins the batch
independently with probability q = b / N_i (Poisson, as the accountant's event), its data gradient is clipped to
C, N(0, z^2 C^2 I) is added to the sum, and the estimate is (N_i / b) (clipped sum + noise). Terms that do not
touch data (the logistic regulariser, the prox pull) are added exactly: post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from dpfl.algorithms.client.convex_clients import ConvexClients
from dpfl.seeding import Purpose, torch_generator

KINDS = ("gradient", "prox")
WARM_STARTS = ("u", "server_avg")


@dataclass(frozen=True)
class InnerDPSGD:
    """Sample-level DP-SGD settings of an operator's inner steps: clip C, noise multiplier z, expected batch b."""

    clip: float
    noise_multiplier: float
    batch: int

    def __post_init__(self) -> None:
        if not self.clip > 0:
            raise ValueError(f"DP-SGD clip must be > 0, got {self.clip}")
        if not self.noise_multiplier >= 0:
            raise ValueError(f"DP-SGD noise multiplier must be >= 0, got {self.noise_multiplier}")
        if self.batch < 1:
            raise ValueError(f"DP-SGD batch size must be >= 1, got {self.batch}")


@dataclass
class OperatorCall:
    """What one application of an operator may need besides the points: randomness keys and the server average."""

    seed: int = 0
    round: int = 0
    center: torch.Tensor | None = None  # the current server average (InexactProx warm_start="server_avg")
    dpsgd: InnerDPSGD | None = None


class LocalOperator(Protocol):
    kind: str

    def apply(self, fns: ConvexClients, idx: torch.Tensor, U: torch.Tensor, eta: float,
              call: OperatorCall) -> torch.Tensor: ...
    def inner_steps(self, n_records: int) -> int: ...


class _DataGradient:
    """Full, minibatch or DP-SGD gradients of the data terms of clients `idx`, one inner step at a time."""

    def __init__(self, fns: ConvexClients, idx: torch.Tensor, batch: int | None, call: OperatorCall) -> None:
        self.rows, self.batch, self.call = fns.rows(idx), batch, call
        self.step = 0
        n_min, n_max = int(self.rows.n_records.min()), int(self.rows.n_records.max())
        dp = call.dpsgd
        if dp is not None:
            if dp.batch > n_min:
                raise ValueError(f"DP-SGD batch {dp.batch} exceeds a client's {n_min} records")
            self.rates = (dp.batch / self.rows.n_records.to(torch.float64)).unsqueeze(1)
            self.scale = (self.rows.n_records.to(torch.float64) / dp.batch).unsqueeze(1)
        elif batch is not None:
            if n_min != n_max:
                raise ValueError("minibatch local steps need clients with equal numbers of records")
            if batch > n_min:
                raise ValueError(f"batch {batch} exceeds the clients' {n_min} records")
        random = batch is not None or dp is not None
        self.gens = [torch_generator(call.seed, Purpose.BATCH, call.round, int(i)) for i in idx] if random else []
        self.noise_gens = [torch_generator(call.seed, Purpose.NOISE, call.round, int(i)) for i in idx] if dp else []
        self.order: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows, dp = self.rows, self.call.dpsgd
        if dp is None and self.batch is None:
            return rows.gradient(x)
        s = rows.scales(x)
        if dp is not None:
            width, dim = rows.A.shape[1], rows.A.shape[2]
            draws = torch.stack([torch.rand(width, generator=g, dtype=torch.float64) for g in self.gens])
            mask = (draws < self.rates) & rows.valid
            factor = torch.clamp(dp.clip / (s.abs() * rows.row_norms + 1e-12), max=1.0)
            noise = torch.stack([torch.randn(dim, generator=g, dtype=torch.float64) for g in self.noise_gens])
            grad = (rows.combine(s * factor * mask) + dp.noise_multiplier * dp.clip * noise) * self.scale
        elif self.batch is not None:
            n = int(rows.n_records[0])
            per_epoch = math.ceil(n / self.batch)
            if self.step % per_epoch == 0:  # reshuffled each epoch
                self.order = torch.stack([torch.randperm(n, generator=g) for g in self.gens])
            assert self.order is not None
            part = self.order[:, (self.step % per_epoch) * self.batch:][:, : self.batch]
            weights = torch.zeros_like(s).scatter_(1, part, n / part.shape[1])
            grad = rows.combine(s * weights)
        self.step += 1
        return grad + rows.reg * x


def _check_steps(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _check_batch(batch: int | None) -> None:
    if batch is not None:
        _check_steps("batch", batch)


@dataclass(frozen=True)
class GradientSteps:
    """G^eta_{f,k}: k steps theta <- theta - eta g, g the full local gradient or a minibatch one (reshuffled each
    epoch)."""

    k: int = 1
    batch: int | None = None
    kind: str = "gradient"

    def __post_init__(self) -> None:
        _check_steps("local steps k", self.k)
        _check_batch(self.batch)

    def inner_steps(self, n_records: int) -> int:
        return self.k

    def apply(self, fns, idx, U, eta, call):
        if not math.isfinite(eta):
            raise ValueError("gradient steps need a finite step size eta")
        if isinstance(fns, MoreauEnvelope):
            if call.dpsgd is not None or self.batch is not None:
                raise ValueError("gradient steps on Moreau envelopes are full-batch and noiseless")
            grad = lambda x: fns.gradient(idx, x)  # noqa: E731
        else:
            grad = _DataGradient(fns, idx, self.batch, call)
        x = U.clone()
        for _ in range(self.k):
            x = x - eta * grad(x)
        return x


@dataclass(frozen=True)
class ExactLeastSquaresProx:
    """P^eta_{f_i}(u) = (A_i^T A_i + I/eta)^{-1} (A_i^T b_i + u/eta) through one eigendecomposition per client
    (every eta of a schedule then costs two matrix-vector products; no explicit inverse). eta = inf gives the
    local least-squares solution."""

    kind: str = "prox"

    def inner_steps(self, n_records: int) -> int:
        return 0

    def apply(self, fns, idx, U, eta, call):
        if call.dpsgd is not None:
            raise ValueError("the exact least-squares prox has no inner steps to run DP-SGD in; "
                             "use dp='update_gaussian'")
        s, v, c = fns.least_squares_eigen
        s, v, c = s[idx], v[idx], c[idx]
        rhs = c if math.isinf(eta) else c + U / eta
        inv = 1.0 / (s if math.isinf(eta) else s + 1.0 / eta)
        return torch.einsum("kde,ke->kd", v, inv * torch.einsum("kde,kd->ke", v, rhs))


@dataclass(frozen=True)
class InexactProx:
    """(S)GD with optional momentum on f_i(x) + ||x - u||^2 / (2 eta), from u (warm_start="u") or from the current
    server average (warm_start="server_avg", the reference logistic-regression code). Reference settings: 100
    full-batch GD steps at lr 0.01."""

    steps: int = 100
    lr: float = 0.01
    batch: int | None = None
    momentum: float = 0.0
    warm_start: str = "u"
    kind: str = "prox"

    def __post_init__(self) -> None:
        _check_steps("inexact prox steps", self.steps)
        _check_batch(self.batch)
        if not self.lr > 0:
            raise ValueError(f"inexact prox lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.warm_start not in WARM_STARTS:
            raise ValueError(f"warm_start must be one of {WARM_STARTS}, got {self.warm_start!r}")

    def inner_steps(self, n_records: int) -> int:
        return self.steps

    def apply(self, fns, idx, U, eta, call):
        data = _DataGradient(fns, idx, self.batch, call)
        if self.warm_start == "server_avg":
            if call.center is None:
                raise ValueError("warm_start='server_avg' needs the current server average")
            x = call.center.expand_as(U).clone()
        else:
            x = U.clone()
        buf = torch.zeros_like(x)
        for _ in range(self.steps):
            g = data(x)
            if math.isfinite(eta):
                g = g + (x - U) / eta
            buf = self.momentum * buf + g if self.momentum else g
            x = x - self.lr * buf
        return x


class MoreauEnvelope:
    """The clients' Moreau envelopes M^eta_{f_i}: gradient (theta - P^eta_{f_i}(theta)) / eta. One gradient step of
    size eta on it is exactly the prox, so FedAvg (k = 1) on envelopes is FedProx (the test of §12.3)."""

    def __init__(self, fns: ConvexClients, prox: LocalOperator, eta: float) -> None:
        if prox.kind != "prox":
            raise ValueError("a Moreau envelope needs a prox operator")
        if not 0 < eta < math.inf:
            raise ValueError(f"the envelope's eta must be finite and > 0, got {eta}")
        self.fns, self.prox, self.eta = fns, prox, float(eta)

    def __getattr__(self, name: str):  # sizes, weights, objective and theta* are the wrapped problem's
        return getattr(self.fns, name)

    def gradient(self, idx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (x - self.prox.apply(self.fns, idx, x, self.eta, OperatorCall())) / self.eta

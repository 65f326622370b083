"""The clients of a convex problem (least squares, logistic regression) as batched float64 tensors.

For a linear model every per-sample gradient of the data term is a scalar times the sample's features,
g_j = s_j a_j, so a full gradient, a minibatch gradient and a DP-SGD clipped sum are all one product
A_i^T (weights * s): clipping needs only |s_j| ||a_j||, and no per-sample gradient is ever materialised.
Clients with fewer rows are zero-padded: a zero row (a = 0, b = 0) has s_j a_j = 0 in both losses, so padded
full-batch gradients are exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from dpfl.data.synthetic import ConvexProblem


@dataclass(frozen=True)
class ClientRows:
    """The data of some clients (one row block each): what an operator touches at every inner step."""

    kind: str
    A: torch.Tensor  # [k, N, d]
    b: torch.Tensor  # [k, N]
    valid: torch.Tensor  # [k, N] bool
    row_norms: torch.Tensor  # [k, N]
    n_records: torch.Tensor  # [k]
    reg: float
    normal: tuple[torch.Tensor, torch.Tensor] | None = None  # least squares: (A^T A [k, d, d], A^T b [k, d])

    def scales(self, x: torch.Tensor) -> torch.Tensor:
        """s [k, N] with per-sample data gradients s_j a_j at each client's point x [k, d]."""
        margin = torch.bmm(self.A, x.unsqueeze(2)).squeeze(2)
        if self.kind == "least_squares":
            return margin - self.b
        return -self.b * torch.sigmoid(-self.b * margin)

    def combine(self, row_weights: torch.Tensor) -> torch.Tensor:
        """sum_j row_weights_j a_j per client ([k, N] -> [k, d])."""
        return torch.bmm(row_weights.unsqueeze(1), self.A).squeeze(1)

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        """The true gradients grad f_i(x_i) [k, d] (no factor 2 on the least-squares term); least squares through
        the d x d normal equations instead of the N x d data."""
        if self.normal is not None:
            q, c = self.normal
            return torch.bmm(q, x.unsqueeze(2)).squeeze(2) - c
        return self.combine(self.scales(x)) + self.reg * x


class ConvexClients:
    """Batched access to the client functions f_i of a `ConvexProblem` (rows of inputs are clients `idx`)."""

    def __init__(self, problem: ConvexProblem) -> None:
        self.problem = problem
        self.kind = problem.kind
        n, d = problem.n_clients, problem.dim
        self.n_records = torch.as_tensor(problem.n_samples, dtype=torch.int64)
        width = int(self.n_records.max())
        self.A = torch.zeros((n, width, d), dtype=torch.float64)
        self.b = torch.zeros((n, width), dtype=torch.float64)
        self.valid = torch.zeros((n, width), dtype=torch.bool)
        for i, (a, y) in enumerate(zip(problem.A, problem.b, strict=True)):
            self.A[i, : len(y)] = torch.as_tensor(a)
            self.b[i, : len(y)] = torch.as_tensor(y)
            self.valid[i, : len(y)] = True
        self.row_norms = torch.linalg.vector_norm(self.A, dim=2)  # [n, N]
        self.reg = float(problem.reg)
        self.weights = torch.as_tensor(problem.weights, dtype=torch.float64)
        self.theta_star = torch.as_tensor(problem.theta_star, dtype=torch.float64)

    @property
    def n_clients(self) -> int:
        return int(self.A.shape[0])

    @property
    def dim(self) -> int:
        return int(self.A.shape[2])

    def rows(self, idx: torch.Tensor) -> ClientRows:
        """The data of clients idx (no copy when idx is every client in order; else one copy per call, so an
        operator takes it once per round, not once per inner step)."""
        if len(idx) == self.n_clients and bool((idx == torch.arange(self.n_clients)).all()):
            return self._all
        normal = None if self._normal is None else (self._normal[0][idx], self._normal[1][idx])
        return ClientRows(self.kind, self.A[idx], self.b[idx], self.valid[idx], self.row_norms[idx],
                          self.n_records[idx], self.reg, normal)

    @cached_property
    def _all(self) -> ClientRows:
        return ClientRows(self.kind, self.A, self.b, self.valid, self.row_norms, self.n_records, self.reg, self._normal)

    @cached_property
    def _normal(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.kind != "least_squares":
            return None
        return self.A.transpose(1, 2) @ self.A, torch.bmm(self.b.unsqueeze(1), self.A).squeeze(1)

    def gradient(self, idx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The true gradients grad f_i(x_i) [k, d] of clients idx at their points x [k, d]."""
        return self.rows(idx).gradient(x)

    def objective(self, x: torch.Tensor) -> float:
        """f(x) = sum_i lambda_i f_i(x) at one point x [d] (least squares through the normal equations)."""
        if self._normal is not None:
            q, c = self._normal
            per = 0.5 * torch.einsum("d,kde,e->k", x, q, x) - c @ x + self._half_b_sq
            return float(self.weights @ per)
        margin = (self.A.view(-1, self.dim) @ x).view(self.n_clients, -1)
        per = torch.where(self.valid, torch.nn.functional.softplus(-self.b * margin), 0.0).sum(1)
        return float(self.weights @ per) + 0.5 * self.reg * float(x @ x)

    def gap(self, x: torch.Tensor) -> float:
        """f(x) - f(theta*). Least squares: exactly 0.5 (x - theta*)^T (sum_i lambda_i A_i^T A_i) (x - theta*), free
        of the cancellation of two large objectives; logistic: the difference of the objectives."""
        if self._normal is not None:
            d = x - self.theta_star
            return 0.5 * float(d @ (self._mean_q @ d))
        return self.objective(x) - self.objective(self.theta_star)

    @cached_property
    def _half_b_sq(self) -> torch.Tensor:
        return 0.5 * self.b.pow(2).sum(1)

    @cached_property
    def _mean_q(self) -> torch.Tensor:
        assert self._normal is not None
        return torch.einsum("k,kde->de", self.weights, self._normal[0])

    @cached_property
    def least_squares_eigen(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(s [n, d], V [n, d, d], c [n, d]) with A_i^T A_i = V diag(s) V^T and c = A_i^T b_i, computed once."""
        if self.kind != "least_squares":
            raise ValueError(f"the exact least-squares prox cannot apply to a {self.kind} problem")
        q, c = self._normal
        s, v = torch.linalg.eigh(q)
        return s, v, c

"""Server-side type-II Anderson acceleration of the round map T (operator_splitting.md §7).

One round is a fixed-point map u -> T u. Anderson keeps the last tau + 1 pairs (u^s, T u^s) (u^s the iterate
actually used, possibly accelerated) and moves to the combination of the T u^s whose residuals cancel best:

    pi* = argmin_{1^T pi = 1} ||R pi||^2 = G^+ 1 / (1^T G^+ 1),   G = R^T R,   u^{t+1} = sum_s pi*_s T u^s.

Everything lives on the server: no extra communication, memory 2 (tau + 1) state vectors. The Gram matrix uses
the lambda-weighted inner product of the product space (a positive rescaling of G leaves pi unchanged).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch

SCOPES: tuple[str, ...] = ("state", "global")


@dataclass(frozen=True)
class AndersonII:
    """Type-II Anderson with memory tau (0: the plain iteration).

    scope "state" accelerates the whole product-space u; "global" only the server model (allowed where u is in
    the consensus subspace after round 0). blend a: pi <- (1 - a) pi, then pi_last += a (the nonconvex reference
    code). safeguard (dpfl option, off by default for parity with the paper): fall back to T u^t when
    ||pi||_1 > pi_max or ||u_AA - T u^t|| > distance * ||u^t - T u^t||. A degenerate Gram matrix (1^T G^+ 1 not
    finite or ~0, e.g. every residual exactly zero) always falls back, since no combination is defined.
    tikhonov r adds r ||G||_F I to G.
    """

    memory: int = 2
    scope: str = "state"
    blend: float = 0.0
    safeguard: bool = False
    pi_max: float = 1e3
    distance: float = 10.0
    tikhonov: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.memory, bool) or not isinstance(self.memory, int) or self.memory < 0:
            raise ValueError(f"Anderson memory tau must be an integer >= 0, got {self.memory!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"Anderson scope must be one of {', '.join(SCOPES)}, got {self.scope!r}")
        if not 0.0 <= self.blend <= 1.0:
            raise ValueError(f"Anderson blend must be in [0, 1], got {self.blend}")
        for name in ("pi_max", "distance"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Anderson {name} must be > 0, got {getattr(self, name)}")
        if not self.tikhonov >= 0:
            raise ValueError(f"Anderson tikhonov must be >= 0, got {self.tikhonov}")

    def window(self) -> AndersonWindow:
        return AndersonWindow(self)


class AndersonWindow:
    """The last tau + 1 pairs (u^s, T u^s) of one run, and the extrapolation from them."""

    def __init__(self, config: AndersonII) -> None:
        self.config = config
        self.pairs: deque[tuple[torch.Tensor, torch.Tensor]] = deque(maxlen=config.memory + 1)
        self.fallbacks = 0
        self.last_pi: torch.Tensor | None = None

    def next(self, u: torch.Tensor, tu: torch.Tensor, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, str]:
        """The next iterate after the round u -> tu, and what happened: "plain" (window not full or tau = 0),
        "accelerated", or "fallback: <why>". `weights` (lambda, one per leading row) weight the inner product."""
        cfg = self.config
        self.last_pi = None
        if cfg.memory == 0:
            return tu, "plain"
        self.pairs.append((u.clone(), tu.clone()))
        if len(self.pairs) <= cfg.memory:
            return tu, "plain"
        residuals = torch.stack([(a - b).flatten(1) if weights is not None else (a - b).reshape(1, -1)
                                 for a, b in self.pairs])  # [m, rows, cols]
        if weights is not None:
            residuals = residuals * weights.to(residuals.dtype).sqrt().view(1, -1, 1)
        r = residuals.reshape(len(self.pairs), -1)
        gram = r @ r.T
        if cfg.tikhonov:
            gram = gram + cfg.tikhonov * torch.linalg.matrix_norm(gram) * torch.eye(len(gram), dtype=gram.dtype)
        if not torch.isfinite(gram).all():  # a diverged iterate overflowed: there is no least-squares mix
            return self._fallback(tu, "non-finite residuals")
        try:
            solved = torch.linalg.pinv(gram, hermitian=True).sum(1)
        except torch.linalg.LinAlgError:  # the eigensolver did not converge on an ill-conditioned Gram matrix
            return self._fallback(tu, "degenerate Gram matrix")
        total = float(solved.sum())
        if not math.isfinite(total) or abs(total) <= 1e-300 or not torch.isfinite(solved).all():
            return self._fallback(tu, "degenerate Gram matrix")
        pi = solved / total
        if cfg.blend:
            pi = (1.0 - cfg.blend) * pi
            pi[-1] += cfg.blend
        if cfg.safeguard and float(pi.abs().sum()) > cfg.pi_max:
            return self._fallback(tu, f"||pi||_1 > {cfg.pi_max:g}")
        out = sum(p * b for p, (_, b) in zip(pi.tolist(), self.pairs, strict=True))
        if cfg.safeguard:
            step = weighted_norm(out - tu, weights)
            if step > cfg.distance * weighted_norm(u - tu, weights):
                return self._fallback(tu, f"||u_AA - T u|| > {cfg.distance:g} ||u - T u||")
        self.last_pi = pi
        return out, "accelerated"

    def _fallback(self, tu: torch.Tensor, why: str) -> tuple[torch.Tensor, str]:
        self.fallbacks += 1
        return tu, f"fallback: {why}"

    def state_dict(self, *, clone: bool = True) -> dict:
        """The pairs and the running fallback count; `clone=False` shares the pairs (for an owner that drops the
        window, since `next` never writes a stored pair)."""
        pairs = [(a.clone(), b.clone()) if clone else (a, b) for a, b in self.pairs]
        return {"pairs": pairs, "fallbacks": self.fallbacks}

    @classmethod
    def from_state(cls, config: AndersonII, state: dict | None) -> AndersonWindow:
        """A window at `state_dict()` output (None: empty) sharing its pairs: `next` appends new pairs and never
        writes a stored one, so the state passed in stays as it was."""
        window = cls(config)
        if state:
            window.pairs.extend((a, b) for a, b in state["pairs"])
            window.fallbacks = int(state["fallbacks"])
        return window

    def load_state_dict(self, state: dict | None) -> None:
        self.pairs.clear()
        self.fallbacks = 0
        if state:
            self.pairs.extend((a.clone(), b.clone()) for a, b in state["pairs"])
            self.fallbacks = int(state["fallbacks"])


def weighted_norm(x: torch.Tensor, weights: torch.Tensor | None = None) -> float:
    """||x||_lambda of a product-space point [n, ...] (sqrt(sum_i lambda_i ||x_i||^2)); the plain norm without
    weights."""
    if weights is None:
        return float(torch.linalg.vector_norm(x))
    return math.sqrt(float((weights.to(x.dtype) * x.flatten(1).pow(2).sum(1)).sum()))

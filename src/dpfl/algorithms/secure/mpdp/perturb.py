"""MP_Server (MP-DP Algorithm 1, spec bidirectional.md §3): expand the model with transitional layers, perturb it
with one-time positive factors and an additive mask, keep the factors as the server's secret.

Scope so far: bias-free fully connected ReLU networks W^(l) in R^{n_l x n_(l-1)}, l = 1..L (§7.1, the paper's
case). The expanded network has 2L - 1 layers: the odd ones are the original layers, the even ones the
"transitional" diagonals 1/(s^(l) r^(l)), each followed by a ReLU. Forward identities (Theorem 12): the perturbed
net's odd activations are r^(l) times the true ones, the even ones 1/s^(l) times, and its output is
y + α(x) r with α(x) the sum of the perturbed penultimate activations.
"""

from __future__ import annotations

import secrets as _secrets
from dataclasses import dataclass

import numpy as np
import torch

from dpfl.algorithms.secure.mpdp.dn import dn_star_abs


@dataclass(frozen=True)
class FactorPlan:
    """The layer sizes [n_0, ..., n_L] and, for each odd layer, which factor scales its rows and its columns."""

    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.sizes) < 3 or min(self.sizes) < 1:
            raise ValueError(f"MP-DP needs at least two layers (L >= 2) of positive width, got sizes {self.sizes}")

    @property
    def layers(self) -> int:
        return len(self.sizes) - 1

    @property
    def out_dim(self) -> int:
        return self.sizes[-1]

    def shapes(self) -> list[tuple[int, int]]:
        return [(self.sizes[l], self.sizes[l - 1]) for l in range(1, self.layers + 1)]

    def dim(self) -> int:
        return sum(a * b for a, b in self.shapes())


@dataclass(frozen=True)
class ServerSecrets:
    """One round's factors: r^(l), s^(l) for l = 1..L-1, and r = γ∘r^(a). Never logged, sent or checkpointed."""

    r: tuple[torch.Tensor, ...]
    s: tuple[torch.Tensor, ...]
    gamma: torch.Tensor
    r_a: torch.Tensor

    @property
    def mask(self) -> torch.Tensor:
        """r = γ∘r^(a), the additive mask's per-output scale."""
        return self.gamma * self.r_a

    @property
    def upsilon(self) -> torch.Tensor:
        return self.mask @ self.mask

    def odd_factor(self, layer: int) -> torch.Tensor:
        """R^(2l-1) for original layer l (1-based): r^(l)_i s^(l-1)_j, r = 1 on the last layer, s = 1 on the first."""
        L = len(self.r) + 1
        rows = self.r[layer - 1] if layer < L else None
        cols = self.s[layer - 2] if layer > 1 else None
        if rows is None:
            return cols.unsqueeze(0)  # broadcast over rows
        if cols is None:
            return rows.unsqueeze(1)
        return torch.outer(rows, cols)

    def transitional(self, layer: int) -> torch.Tensor:
        """The diagonal of the transitional layer after original layer l: 1/(s^(l) r^(l))."""
        return 1.0 / (self.s[layer - 1] * self.r[layer - 1])


@dataclass(frozen=True)
class ClientPayload:
    """What a client receives: the expanded, perturbed weights (odd layers full, transitional ones as their
    diagonals), the plan's sizes and the round id. No factor is in it."""

    odd: tuple[torch.Tensor, ...]
    transitional: tuple[torch.Tensor, ...]
    sizes: tuple[int, ...]
    round_id: int


def draw_secrets(plan: FactorPlan, gen: np.random.Generator, mask_scale: float = 1.0) -> ServerSecrets:
    """Fresh factors with the laws of Eq. 13: |DN*(1)| on the first r and the last s, |DN*(2)| in between
    (for L = 2 both are |DN*(1)|); γ and r^(a) i.i.d. N(0, mask_scale^2) (the paper gives no law: dpfl's choice)."""
    L = plan.layers
    r = tuple(dn_star_abs(1 if l == 1 else 2, plan.sizes[l], gen) for l in range(1, L))
    s = tuple(dn_star_abs(1 if l == L - 1 else 2, plan.sizes[l], gen) for l in range(1, L))
    gamma = torch.from_numpy(gen.normal(0.0, mask_scale, plan.out_dim))
    r_a = torch.from_numpy(gen.normal(0.0, mask_scale, plan.out_dim))
    return ServerSecrets(r, s, gamma, r_a)


def round_generator(seed: int | None = None) -> np.random.Generator:
    """The per-round generator: from `secrets.randbits(63)` (deployment), or a given seed (simulation only)."""
    return np.random.default_rng(_secrets.randbits(63) if seed is None else seed)


def mp_server(weights: list[torch.Tensor] | tuple[torch.Tensor, ...], plan: FactorPlan, gen: np.random.Generator,
              round_id: int = 0, mask_scale: float = 1.0) -> tuple[ClientPayload, ServerSecrets]:
    """Eqs. 12-15: the perturbed expanded model for the clients, and the secrets for the server."""
    if [tuple(w.shape) for w in weights] != plan.shapes():
        raise ValueError(f"weights of shapes {[tuple(w.shape) for w in weights]} do not match the plan {plan.shapes()}")
    sec = draw_secrets(plan, gen, mask_scale)
    L = plan.layers
    odd = []
    for l, w in enumerate(weights, start=1):
        hat = sec.odd_factor(l) * w.to(torch.float64)
        if l == L:
            hat = hat + sec.mask.unsqueeze(1)  # R^(a)_ij = γ_i r^(a)_i
        odd.append(hat)
    trans = tuple(sec.transitional(l) for l in range(1, L))
    return ClientPayload(tuple(odd), trans, plan.sizes, round_id), sec


def forward(odd: list[torch.Tensor] | tuple[torch.Tensor, ...], transitional: tuple[torch.Tensor, ...] | None,
            x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [B, n_L], α [B]) of the expanded net (or of the plain net when `transitional` is None, α = 0)."""
    h = x
    L = len(odd)
    for l in range(L - 1):
        h = torch.relu(h @ odd[l].T)
        if transitional is not None:
            h = torch.relu(h * transitional[l])
    alpha = h.sum(-1) if transitional is not None else torch.zeros(h.shape[0], dtype=h.dtype)
    return h @ odd[-1].T, alpha


def recover(perturbed_grads: list[torch.Tensor], psi: list[torch.Tensor], phi: list[torch.Tensor],
            sec: ServerSecrets) -> list[torch.Tensor]:
    """Theorem 4: ∇F(W^(l)) = R^(2l-1)∘(∇F̂ - rᵀΨ + υΦ) for every original layer (also for sums and means)."""
    r, ups = sec.mask, sec.upsilon
    return [sec.odd_factor(l) * (g - torch.tensordot(r, p, dims=([0], [0])) + ups * f)
            for l, (g, p, f) in enumerate(zip(perturbed_grads, psi, phi, strict=True), start=1)]

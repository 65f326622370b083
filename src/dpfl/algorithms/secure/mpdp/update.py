"""MU_Server (MP-DP Algorithm 3, spec bidirectional.md §6): streaming float64 sums of the uploads, recovery of the
mean gradient at the true model, and the update of all L layers (Alg. 3's "1 <= l < L" is a typo)."""

from __future__ import annotations

import torch

from dpfl.algorithms.secure.mpdp.perturb import ServerSecrets, recover


class RunningSums:
    """Σ_k of the noisy perturbed gradients, of Ψ_k and of Φ_k: memory (n_L + 2) x d whatever K is."""

    def __init__(self) -> None:
        self.count = 0
        self.g: list[torch.Tensor] | None = None
        self.psi: list[torch.Tensor] | None = None
        self.phi: list[torch.Tensor] | None = None
        self.clients: list[int] = []

    def add(self, cid: int, g: list[torch.Tensor], psi: list[torch.Tensor], phi: list[torch.Tensor]) -> None:
        if self.g is None:
            self.g, self.psi, self.phi = [t.clone() for t in g], [t.clone() for t in psi], [t.clone() for t in phi]
        else:
            for acc, new in zip(self.g + self.psi + self.phi, g + psi + phi, strict=True):
                acc += new
        self.count += 1
        self.clients.append(cid)

    def recovered_mean(self, sec: ServerSecrets) -> list[torch.Tensor]:
        """(1/K) Σ recovered: ∇F(W) + R∘η̄ when the Δ cancel."""
        if self.g is None or self.psi is None or self.phi is None:
            raise ValueError("no uploads to recover")
        k = self.count
        return recover([g / k for g in self.g], [p / k for p in self.psi], [f / k for f in self.phi], sec)


def apply_update(weights: list[torch.Tensor], grads: list[torch.Tensor], lr: float) -> list[torch.Tensor]:
    """W^(l) <- W^(l) - ξ ∇F̂(W^(l)) for every original layer l = 1..L."""
    return [w - lr * g for w, g in zip(weights, grads, strict=True)]

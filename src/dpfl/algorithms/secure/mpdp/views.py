"""What each party of MP-DP sees, for the attacks (spec bidirectional.md §10): the adapter between the scheme and
`dpfl.attacks`. A client sees the round's payload: the perturbed tensors, the transitional diagonals and the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpfl.algorithms.secure.mpdp.perturb import ClientPayload, FactorPlan, forward


@dataclass(frozen=True)
class ClientView:
    payload: ClientPayload

    @property
    def plan(self) -> FactorPlan:
        assert self.payload.plan is not None
        return self.payload.plan

    def outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ŷ(x), α(x)) of the perturbed model: all a client can compute."""
        return forward(list(self.payload.odd), self.payload.transitional, x.to(torch.float64), self.plan,
                       self.payload.shortcuts)

    def folded(self) -> list[torch.Tensor]:
        """The transitional diagonals folded into the next layer's input axis: an ordinary network (same plan, no
        transitional layers) computing exactly ŷ(x), since ReLU(ReLU(h) d) = ReLU(h) d for d > 0 (W3)."""
        plan, out = self.plan, [t.clone() for t in self.payload.odd]
        for i, (layer, kind) in enumerate(plan.params()):
            if kind != "weight" or layer == 0:
                continue
            spec = plan.layer_specs[layer]
            d = self.payload.transitional[layer - 1].repeat_interleave(spec.in_repeat)
            out[i] = out[i] * d.reshape(1, -1, *([1] * (out[i].dim() - 2)))
        return out

    def folded_shortcuts(self) -> tuple[torch.Tensor, ...]:
        """The residual shortcuts of the folded network: without the source layer's transitional diagonal d the
        block input is the expanded one divided by d, so the shortcut takes d on top of its own diagonal."""
        return tuple(sc * self.payload.transitional[sk.source]
                     for sc, sk in zip(self.payload.shortcuts, self.plan.skips, strict=True))

    def alpha_weights(self) -> torch.Tensor:
        """α(x) = Σ_j d_j h_j + [last bias] over the folded net's penultimate features h: the d_j, per input feature
        of the last layer."""
        spec = self.plan.layer_specs[-1]
        return self.payload.transitional[-1].repeat_interleave(spec.in_repeat)

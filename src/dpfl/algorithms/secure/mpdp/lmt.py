"""Client local model training, LMT (MP-DP Algorithm 4 and Theorem 13, spec bidirectional.md §4).

At the perturbed model Ŵ a client computes, over its batch, the gradient g of ½‖ŷ - ȳ‖² and the correction
terms Ψ[i] = ∂ mean[sg(α) ŷ_i + sg(e_i) α] (i = 1..n_L) and Φ = ∂ mean ½α², with e = ŷ - ȳ. The server's
R∘(g - rᵀΨ + υΦ) is then exactly the true gradient at W. Exact only for the MSE loss (the true loss must be a
polynomial in r), so other losses are refused.

All three come from one forward pass and one batched vector-Jacobian product: cotangents V[0] = [e, 0] -> g,
V[1] = [0, α] -> Φ, V[2+i] = [α·1_i, e_i] -> Ψ[i] on the output O = [ŷ, α] (all divided by B).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpfl.algorithms.secure.mpdp.perturb import ClientPayload, forward


class UnsupportedLossError(ValueError):
    """MP-DP's recovery is exact only for the MSE loss on one-hot targets."""


@dataclass
class LMTResult:
    grads: list[torch.Tensor]  # ∂/∂Ŵ of the batch-mean ½‖ŷ - ȳ‖², per odd layer
    psi: list[torch.Tensor]  # [n_L, *shape] per odd layer
    phi: list[torch.Tensor]
    clip_factor: float = 1.0

    def scaled(self, c: float) -> LMTResult:
        return LMTResult([c * g for g in self.grads], [c * p for p in self.psi], [c * f for f in self.phi], c)

    @property
    def grad_norm(self) -> float:
        return float(torch.sqrt(sum((g**2).sum() for g in self.grads)))


def _outputs(params: list[torch.Tensor], payload: ClientPayload, x: torch.Tensor) -> torch.Tensor:
    y_hat, alpha = forward(params, payload.transitional, x, payload.plan, payload.shortcuts)
    return torch.cat([y_hat, alpha.unsqueeze(1)], dim=1)  # O = [ŷ, α], [B, n_L + 1]


def cotangents(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """V in R^{(n_L+2) x B x (n_L+1)}, divided by B (see the module docstring)."""
    B, width = out.shape
    n_out = width - 1
    y_hat, alpha = out[:, :n_out].detach(), out[:, n_out].detach()
    e = y_hat - target
    V = torch.zeros(n_out + 2, B, width, dtype=out.dtype)
    V[0, :, :n_out] = e
    V[1, :, n_out] = alpha
    idx = torch.arange(n_out)
    V[2 + idx, :, idx] = alpha.unsqueeze(0).expand(n_out, B)
    V[2:, :, n_out] = e.T
    return V / B


def lmt(payload: ClientPayload, x: torch.Tensor, target: torch.Tensor, method: str = "batched",
        loss: str = "mse", psi_chunk: int | None = None) -> LMTResult:
    """g, Ψ, Φ at the perturbed model for one batch (float64). method: batched | vmap | loop (n_L + 2 passes)."""
    if loss != "mse":
        raise UnsupportedLossError(f"MP-DP recovers gradients exactly only for the MSE loss on one-hot targets, not "
                                   f"{loss!r} (softmax cross-entropy is not polynomial in the mask r)")
    x = x.to(torch.float64)
    target = target.to(torch.float64)
    params = [w.detach().clone().requires_grad_(True) for w in payload.odd]
    out = _outputs(params, payload, x)
    V = cotangents(out, target)
    rows = range(V.shape[0])
    if method == "batched":
        chunk = psi_chunk or V.shape[0]
        parts = []
        for start in range(0, V.shape[0], chunk):
            parts.append(torch.autograd.grad(out, params, grad_outputs=V[start:start + chunk], is_grads_batched=True,
                                             retain_graph=True))
        stacked = [torch.cat([p[i] for p in parts]) for i in range(len(params))]
    elif method == "vmap":
        def f(*ps):
            return _outputs(list(ps), payload, x)
        _, vjp = torch.func.vjp(f, *[p.detach() for p in params])
        stacked = list(torch.func.vmap(vjp)(V))
    elif method == "loop":
        per = [torch.autograd.grad(out, params, grad_outputs=V[i], retain_graph=True) for i in rows]
        stacked = [torch.stack([p[i] for p in per]) for i in range(len(params))]
    else:
        raise ValueError(f"method must be batched, vmap or loop, got {method!r}")
    return LMTResult([s[0] for s in stacked], [s[2:] for s in stacked], [s[1] for s in stacked])


def clip_joint(result: LMTResult, bound: float) -> LMTResult:
    """`perturbed_joint` clipping: c = min(1, B/‖g‖) scales g, Ψ and Φ together, so the server recovers exactly
    c∇F. It bounds ‖g‖ at Ŵ, NOT the true gradient's norm (spec §4.4)."""
    norm = result.grad_norm
    return result.scaled(min(1.0, bound / norm) if norm > 0 else 1.0)

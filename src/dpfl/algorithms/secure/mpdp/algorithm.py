"""One FedSGD round of MP-DP (Algorithm 4) and of its baselines on the same batches (spec bidirectional.md §6, §9).

- `mpdp`: MP_Server -> graph and key agreement -> each client LMT at Ŵ, clip, DDP noise, upload -> dropout check
  -> MU_Server. The clients never see W, only a fresh Ŵ (G2).
- `mpdp_naive`: MP_Server, then each client adds N(0, S^2 σ^2) to its perturbed gradient (no pairwise noise).
- `mp_cdp`: a trusted server averages the clipped true gradients and adds N(0, (S σ_cdp / K)^2).
- `fedavg`: FedSGD without privacy, in the clear.
- `tp_smc`: the threshold-Paillier baseline (its round is `secure/tpsmc.py`).
Recovery needs gradients taken at Ŵ_t, so every method takes one gradient step per round (FedSGD).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.secure.mpdp.lmt import LMTResult, clip_joint, lmt
from dpfl.algorithms.secure.mpdp.perturb import ClientPayload, FactorPlan, ServerSecrets, forward, mp_server
from dpfl.algorithms.secure.mpdp.privacy import conditional_audit
from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings
from dpfl.algorithms.secure.mpdp.tensors import clip_factor, norm
from dpfl.algorithms.secure.mpdp.update import apply_update
from dpfl.algorithms.secure.mpdp.upload_round import UploadRound, upload_check

@dataclass
class RoundOutcome:
    weights: list[torch.Tensor]
    seconds: dict[str, float] = field(default_factory=dict)  # server / lmt / ddp / recover_update (mpdp)
    upload_bytes: int = 0  # per client
    violations: int = 0  # client-rounds with ||c_k ∇F_k|| > S (noise-free, simulation only)
    uploads: int = 0
    recovery_ratio: float | None = None  # ||R∘g|| / ||recovered||: cancellation diagnostic
    audit: dict[str, Any] | None = None  # conditional_audit of the round's factors (gaussian_conditional)
    reduced_protection: list[int] = field(default_factory=list)  # dropped clients whose Δ the server rebuilt


def true_gradient(weights: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                  plan: FactorPlan | None = None) -> list[torch.Tensor]:
    """The gradient of the batch-mean ½‖y(x) - ȳ‖² at the true model (MSE on one-hot targets)."""
    ws = [w.detach().clone().requires_grad_(True) for w in weights]
    out, _ = forward(ws, None, x, plan)
    return list(torch.autograd.grad(0.5 * ((out - y) ** 2).sum(1).mean(), ws))


def clipped(grads: list[torch.Tensor], bound: float) -> list[torch.Tensor]:
    """The gradient scaled to norm at most `bound` (MP-CDP's clip of each client's true gradient)."""
    c = clip_factor(norm(grads), bound)
    return [c * t for t in grads]


def mean_gradient(grads: Sequence[list[torch.Tensor]], like: list[torch.Tensor], st: RoundSettings,
                  gen: torch.Generator) -> tuple[list[torch.Tensor], int]:
    """The server's mean of the clients' gradients (MP-CDP: plus N(0, (S σ_cdp / K)^2) from `gen`) and how many of
    them exceed S (MP-CDP's are clipped: a simulation check)."""
    total = [torch.zeros_like(w) for w in like]
    violations = 0
    for g in grads:
        if st.method == "mp_cdp":
            violations += norm(g) > st.S * (1 + 1e-9)
        total = [a + b for a, b in zip(total, g, strict=True)]
    K = len(grads)
    mean = [t / K for t in total]
    if st.method == "mp_cdp" and st.sigma_cdp > 0:
        mean = [t + torch.randn(t.shape, generator=gen, dtype=t.dtype) * st.S * st.sigma_cdp / K for t in mean]
    return mean, int(violations)


def client_gradient(weights: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, st: RoundSettings,
                    plan: FactorPlan | None = None) -> list[torch.Tensor]:
    """A FedSGD client's gradient at the model in the clear, clipped to B where the method clips (MP-CDP, TP-SMC)."""
    g = true_gradient(weights, x, y, plan)
    return clipped(g, st.clip) if st.method in ("mp_cdp", "tp_smc") else g


def plain_round(weights: list[torch.Tensor], batches: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
                st: RoundSettings, gen: torch.Generator, plan: FactorPlan | None = None) -> RoundOutcome:
    """fedavg (no noise) or mp_cdp (trusted server: clipped true gradients, Gaussian on the mean)."""
    t0 = time.perf_counter()
    grads = [client_gradient(weights, x, y, st, plan) for x, y in batches.values()]
    mean, violations = mean_gradient(grads, weights, st, gen)
    new = apply_update(weights, mean, st.lr)
    d = sum(w.numel() for w in weights)
    return RoundOutcome(new, {"client": time.perf_counter() - t0}, 8 * d, violations, len(batches))


def client_terms(payload: ClientPayload, weights: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                 st: RoundSettings) -> LMTResult:
    """MP-DP's client: LMT at the received Ŵ, then its clip (`clip_mode`; `oracle_true` reads the TRUE `weights`,
    which only a simulation has)."""
    res = lmt(payload, x, y)
    if st.clip_mode == "perturbed_joint":
        return clip_joint(res, st.clip)
    if st.clip_mode == "oracle_true":  # simulation only: the harness looks at the true gradient
        return res.scaled(clip_factor(norm(true_gradient(weights, x, y, payload.plan)), st.clip))
    return res


def round_audit(sec: ServerSecrets, st: RoundSettings, cohort: int) -> dict[str, Any] | None:
    """The W1 audit of a round's factors (`conditional_audit`) for MP-DP with gaussian_conditional noise; None
    otherwise."""
    if st.method != "mpdp" or st.noise_family != "gaussian_conditional":
        return None
    return conditional_audit(sec, st.sigma_eta, st.sigma_delta, st.delta, cohort, st.graph, st.n)


def perturbed_round(weights: list[torch.Tensor], plan: FactorPlan,
                    batches: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
                    st: RoundSettings, round_: int, secret_gen: np.random.Generator,
                    private_seeds: Mapping[int, int | None], drop: set[int] | frozenset[int] = frozenset(),
                    on_broadcast: Callable[[ClientPayload, list[torch.Tensor]], Any] | None = None,
                    on_upload: Callable[[int, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor],
                                         ServerSecrets], Any] | None = None) -> RoundOutcome:
    """One MP-DP (or MP-DP-Naive) round outside the round loop (probe rounds, tests); raises MissingPeersError, with
    no update applied, if a client in `drop` agreed on edges and never uploaded. `on_upload(k, upload, Ψ, Φ,
    secrets)`: each client's upload as the server receives it, with the server's secrets (the server's view, for the
    inversion attack). The loop's stages run the same pieces (`client_terms`, `UploadRound`, `upload_check`)."""
    seconds = dict.fromkeys(("server", "lmt", "ddp", "recover_update"), 0.0)
    t0 = time.perf_counter()
    payload, sec = mp_server(weights, plan, secret_gen, round_, st.mask_scale)
    seconds["server"] += time.perf_counter() - t0
    if on_broadcast is not None:  # what the clients receive, next to the true model (tests of G2)
        on_broadcast(payload, weights)
    uploads = UploadRound(st, plan, sorted(batches), private_seeds, round_)
    violations, ratio = 0, []
    for k in uploads.clients:
        if k in drop:
            continue  # agreed on edges (keys published), then left before uploading
        x, y = batches[k]
        t0 = time.perf_counter()
        res = client_terms(payload, weights, x, y, st)
        seconds["lmt"] += time.perf_counter() - t0
        upload, psi, phi = uploads.upload(k, res)
        if on_upload is not None:
            on_upload(k, upload, psi, phi, sec)
        over, r = upload_check(res, sec, st.S)  # noise-free, for the sensitivity-violation rate only
        violations += over
        ratio.append(r)
    reduced = uploads.settle()
    t0 = time.perf_counter()
    new = apply_update(weights, uploads.sums.recovered_mean(sec), st.lr)
    seconds["ddp"] = uploads.seconds["ddp"]
    seconds["recover_update"] += time.perf_counter() - t0 + uploads.seconds["sum"]
    upload_bytes = 8 * plan.dim() * (plan.out_dim + 2)  # g, Ψ (n_L copies) and Φ in float64
    audit = round_audit(sec, st, len(uploads.clients))
    return RoundOutcome(new, seconds, upload_bytes, violations, uploads.sums.count, float(np.median(ratio)), audit,
                        reduced)

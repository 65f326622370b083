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

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.secure.mpdp.ddp import (
    CORRECTION_MASK_STREAM,
    DELTA_STREAM,
    DDPClient,
    MissingPeersError,
    NoiseLayout,
    neighbours,
    sample_graph,
)
from dpfl.algorithms.secure.mpdp.privacy import conditional_audit
from dpfl.algorithms.secure.mpdp.recovery import deal_shares, dropped_noise, recover_key
from dpfl.algorithms.secure.mpdp.lmt import LMTResult, clip_joint, lmt
from dpfl.algorithms.secure.mpdp.perturb import ClientPayload, FactorPlan, ServerSecrets, forward, mp_server, recover
from dpfl.algorithms.secure.mpdp.update import RunningSums, apply_update
from dpfl.algorithms.secure.protocol import default_threshold

METHODS = ("mpdp", "mpdp_naive", "mp_cdp", "fedavg", "tp_smc")
CLIP_MODES = ("perturbed_joint", "none", "oracle_true")
NOISE_FAMILIES = ("dn", "gaussian_conditional")


@dataclass(frozen=True)
class RoundSettings:
    """What every round of a run shares. Noise multipliers are in units of the sensitivity S."""

    method: str
    lr: float
    S: float = 1.0  # the sensitivity (B, or 2B under replace adjacency)
    clip: float = 1.0  # B
    clip_mode: str = "perturbed_joint"
    sigma_eta: float = 0.0
    sigma_delta: float = math.inf
    sigma_naive: float = 0.0
    sigma_cdp: float = 0.0
    graph: str = "complete"
    n: int | None = None
    mask_scale: float = 1.0
    run_id: bytes = b"dpfl-mpdp"
    mask_corrections: bool = False  # W2 hardening: pairwise zero-sum masks on Ψ_k, Φ_k (stream 2)
    sigma_mask: float | None = None  # their std; None: 1e3 S
    noise_family: str = "dn"  # or gaussian_conditional (W1 hardening)
    delta: float = 1e-5  # for the conditional audit
    dropout_policy: str = "abort"  # or secagg_recovery (Shamir-shared keys, recovery.py)
    recovery_threshold: int | None = None  # None: floor(K/2) + 1

    def __post_init__(self) -> None:
        if self.noise_family not in NOISE_FAMILIES:
            raise ValueError(f"noise_family must be one of {NOISE_FAMILIES}, got {self.noise_family!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.clip_mode not in CLIP_MODES:
            raise ValueError(f"clip_mode must be one of {CLIP_MODES}, got {self.clip_mode!r}")

    @property
    def ddp_family(self) -> str:
        """The law of the DDP noise draws: 'dn' (uniform, spec §5) or 'gaussian' (gaussian_conditional)."""
        return "dn" if self.noise_family == "dn" else "gaussian"

    @property
    def mask_std(self) -> float:
        """The std of the correction masks (mask_corrections)."""
        return self.sigma_mask if self.sigma_mask is not None else 1e3 * self.S


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


def _norm(ts: list[torch.Tensor]) -> float:
    return float(torch.sqrt(sum((t**2).sum() for t in ts)))


def _flat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


def _unflat(v: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, i = [], 0
    for t in like:
        out.append(v[i:i + t.numel()].reshape(t.shape))
        i += t.numel()
    return out


def _clip_factor(norm: float, bound: float) -> float:
    return min(1.0, bound / norm) if norm > 0 else 1.0


def clipped(grads: list[torch.Tensor], bound: float) -> list[torch.Tensor]:
    """The gradient scaled to norm at most `bound` (MP-CDP's clip of each client's true gradient)."""
    c = _clip_factor(_norm(grads), bound)
    return [c * t for t in grads]


def plain_round(weights: list[torch.Tensor], batches: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
                st: RoundSettings, gen: torch.Generator, plan: FactorPlan | None = None) -> RoundOutcome:
    """fedavg (no noise) or mp_cdp (trusted server: clipped true gradients, Gaussian on the mean)."""
    t0 = time.perf_counter()
    total = [torch.zeros_like(w) for w in weights]
    violations = 0
    for x, y in batches.values():
        g = true_gradient(weights, x, y, plan)
        if st.method == "mp_cdp":
            g = clipped(g, st.clip)
            violations += _norm(g) > st.S * (1 + 1e-9)
        total = [a + b for a, b in zip(total, g, strict=True)]
    K = len(batches)
    mean = [t / K for t in total]
    if st.method == "mp_cdp" and st.sigma_cdp > 0:
        mean = [t + torch.randn(t.shape, generator=gen, dtype=t.dtype) * st.S * st.sigma_cdp / K for t in mean]
    new = apply_update(weights, mean, st.lr)
    d = sum(w.numel() for w in weights)
    return RoundOutcome(new, {"client": time.perf_counter() - t0}, 8 * d, violations, K)


def _client_terms(payload: ClientPayload, weights: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                  st: RoundSettings) -> LMTResult:
    res = lmt(payload, x, y)
    if st.clip_mode == "perturbed_joint":
        return clip_joint(res, st.clip)
    if st.clip_mode == "oracle_true":  # simulation only: the harness looks at the true gradient
        return res.scaled(_clip_factor(_norm(true_gradient(weights, x, y, payload.plan)), st.clip))
    return res


def perturbed_round(weights: list[torch.Tensor], plan: FactorPlan,
                    batches: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
                    st: RoundSettings, round_: int, secret_gen: np.random.Generator,
                    private_seeds: Mapping[int, int | None], drop: set[int] | frozenset[int] = frozenset(),
                    on_broadcast: Callable[[ClientPayload, list[torch.Tensor]], Any] | None = None,
                    on_upload: Callable[[int, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor],
                                         ServerSecrets], Any] | None = None) -> RoundOutcome:
    """One MP-DP (or MP-DP-Naive) round; raises MissingPeersError, with no update applied, if a client in
    `drop` agreed on edges and never uploaded. `on_upload(k, upload, Ψ, Φ, secrets)`: each client's upload as the
    server receives it, with the server's secrets (the server's view, for the inversion attack)."""
    seconds = dict.fromkeys(("server", "lmt", "ddp", "recover_update"), 0.0)
    t0 = time.perf_counter()
    payload, sec = mp_server(weights, plan, secret_gen, round_, st.mask_scale)
    seconds["server"] += time.perf_counter() - t0
    if on_broadcast is not None:  # what the clients receive, next to the true model (tests of G2)
        on_broadcast(payload, weights)
    clients = sorted(batches)
    ddp = {k: DDPClient(k, private_seeds.get(k)) for k in clients}
    edges: set[tuple[int, int]] = set()
    if st.method == "mpdp" and (not math.isinf(st.sigma_delta) or st.mask_corrections):
        edges = sample_graph(clients, st.graph, st.n, {k: ddp[k].rng for k in clients})
    adj = neighbours(edges)
    recovering = st.dropout_policy == "secagg_recovery" and bool(edges)
    threshold = st.recovery_threshold or default_threshold(len(clients))
    shares = deal_shares(ddp, threshold, st.run_id, round_) if recovering else {}
    sums = RunningSums()
    d = plan.dim()
    layout = NoiseLayout.from_plan(plan)
    violations, ratio = 0, []
    for k in clients:
        if k in drop:
            continue  # agreed on edges (keys published), then left before uploading
        x, y = batches[k]
        t0 = time.perf_counter()
        res = _client_terms(payload, weights, x, y, st)
        seconds["lmt"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        g = _flat(res.grads)
        psi, phi = res.psi, res.phi
        peers = {v: ddp[v].public for v in adj.get(k, [])}
        if st.method == "mpdp":
            family = st.ddp_family
            noise = ddp[k].eta(d, st.S * st.sigma_eta, family, layout) if st.sigma_eta > 0 else np.zeros(d)
            if peers and not math.isinf(st.sigma_delta):
                noise = noise + ddp[k].pairwise(peers, d, st.S * st.sigma_delta, st.run_id, round_, family,
                                                layout=layout)
            if st.mask_corrections and peers:  # the server learns only Σ Ψ_k and Σ Φ_k
                flat_psi = _flat(psi)
                corr = torch.cat([flat_psi, _flat(phi)])
                corr = corr + torch.from_numpy(ddp[k].pairwise(peers, corr.numel(), st.mask_std, st.run_id, round_,
                                                               "gaussian", CORRECTION_MASK_STREAM))
                psi, phi = _unflat(corr[:flat_psi.numel()], psi), _unflat(corr[flat_psi.numel():], phi)
        else:  # MP-DP-Naive: a true Gaussian on the perturbed gradient
            noise = ddp[k].rng.normal(0.0, st.S * st.sigma_naive, d) if st.sigma_naive > 0 else np.zeros(d)
        upload = _unflat(g + torch.from_numpy(noise), res.grads)
        seconds["ddp"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        sums.add(k, upload, psi, phi)
        seconds["recover_update"] += time.perf_counter() - t0
        if on_upload is not None:
            on_upload(k, upload, psi, phi, sec)
        own = recover(res.grads, res.psi, res.phi, sec)  # noise-free, for the sensitivity-violation rate only
        violations += _norm(own) > st.S * (1 + 1e-9)
        ratio.append(_norm([sec.factor(p) * g_ for p, g_ in enumerate(res.grads)]) / max(_norm(own), 1e-300))
    missing = set(clients) - set(sums.clients)
    reduced: list[int] = []
    if missing:
        affected = {v for m in missing for v in adj.get(m, []) if v not in missing}
        if edges and affected:
            if not recovering or len(sums.clients) < threshold:
                raise MissingPeersError(round_, missing, affected)
            _remove_dropped(sums, sorted(missing), adj, ddp, shares, threshold, st, round_, layout)
            reduced = sorted(missing)
    t0 = time.perf_counter()
    new = apply_update(weights, sums.recovered_mean(sec), st.lr)
    seconds["recover_update"] += time.perf_counter() - t0
    upload_bytes = 8 * d * (plan.out_dim + 2)  # g, Ψ (n_L copies) and Φ in float64
    audit = None
    if st.method == "mpdp" and st.noise_family == "gaussian_conditional":
        audit = conditional_audit(sec, st.sigma_eta, st.sigma_delta, st.delta, len(clients), st.graph, st.n)
    return RoundOutcome(new, seconds, upload_bytes, violations, sums.count, float(np.median(ratio)), audit, reduced)


def _remove_dropped(sums: RunningSums, missing: list[int], adj: dict[int, list[int]], ddp: Mapping[int, DDPClient],
                    shares: dict[int, dict[int, bytes]], threshold: int, st: RoundSettings, round_: int,
                    layout: NoiseLayout) -> None:
    """secagg_recovery: rebuild each dropped client's key from the survivors' shares and remove the Δ (and the
    correction masks) its surviving neighbours added for their edges to it."""
    survivors = {k: ddp[k] for k in sums.clients}
    assert sums.g is not None and sums.psi is not None and sums.phi is not None
    for m in missing:
        key = recover_key(m, ddp[m].public, survivors, shares, threshold, st.run_id, round_)
        nb = {v: ddp[v].public for v in adj.get(m, []) if v in survivors}
        if not math.isinf(st.sigma_delta):
            extra = dropped_noise(m, key, nb, layout.d, st.S * st.sigma_delta, st.ddp_family, DELTA_STREAM, st.run_id,
                                  round_, layout)
            sums.g = [g - e for g, e in zip(sums.g, _unflat(torch.from_numpy(extra), sums.g), strict=True)]
        if st.mask_corrections:
            size = _flat(sums.psi).numel()
            extra = torch.from_numpy(dropped_noise(m, key, nb, size + _flat(sums.phi).numel(), st.mask_std, "gaussian",
                                                   CORRECTION_MASK_STREAM, st.run_id, round_))
            sums.psi = [p - e for p, e in zip(sums.psi, _unflat(extra[:size], sums.psi), strict=True)]
            sums.phi = [p - e for p, e in zip(sums.phi, _unflat(extra[size:], sums.phi), strict=True)]

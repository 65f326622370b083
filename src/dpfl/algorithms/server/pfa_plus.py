"""PFA+: projected averaging with k-dimensional uploads from private clients (spec heterogeneous_dp §4.3).

PFA needs every private client's full update only to project it. PFA+ projects onto the *previous*
round's subspace instead, which the server can broadcast before training: each private participant
then uploads its k_ℓ coordinates z_i,ℓ = V_prevᵀ(u_i,ℓ − μ_prev) per tensor instead of p_ℓ floats, and
the server reconstructs d̂_pri,ℓ = μ_prev + V_prev·Σ(ε_i/E_pri) z_i,ℓ. Public clients upload in full;
their updates give this round's d_pub and the subspace for the next round.

Warm-up: while fewer than `warmup_rounds` rounds with private participants have been aggregated there
is no previous subspace, everyone uploads in full and the round is plain PFA. A round without private
participants is WeiAvg over the public ones and leaves the state unchanged. Since reconstruction is
linear, PFA+ equals PFA whenever the subspace does not move.

What crosses the network is explicit: `client_payload` is what the clients send given the broadcast
(codes are computed from the float32 basis they received and sent as float32), and `update` reads
only that payload. Bytes are counted per participant (4 per float, spec §4.3 table).

**State** (`init`, returned by `update`; the step itself is configuration only): a dict with
- `previous`: None before the first round with private participants, then per tensor block {"mu", "V"}
  (float64 [p_ℓ], [p_ℓ, k_ℓ]): the subspace the next round's private participants project onto;
- `private_rounds`: how many rounds with private participants have been aggregated (the warm-up counts them).
Both are the broadcast's input, so the payload of a round depends on the state its update starts from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from dpfl.algorithms.server.pfa import PFA, float64_column_chunks, weighted_rows64
from dpfl.algorithms.server.subspace import Subspace
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
from dpfl.engine import params as P

FLOAT_BYTES = 4
BROADCASTS = ("private", "all")


def centred_codes64(flat: torch.Tensor, mu: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """(flat − μ) V in float64 ([n, p] -> [n, k]), summed over column chunks instead of materialising the
    n × p float64 difference (equal up to the order of the float64 additions)."""
    mu, V = (t.to(device=flat.device, dtype=torch.float64) for t in (mu, V))
    out = torch.zeros((flat.shape[0], V.shape[1]), dtype=torch.float64, device=flat.device)
    for cols, block in float64_column_chunks(flat):
        out += (block - mu[cols]) @ V[cols]
    return out


@dataclass
class Payload:
    """What the round's participants uploaded (in view order), and what each was sent and sent back."""

    full: P.Params  # [n_full, ...]: the participants that uploaded their whole update
    full_mask: torch.Tensor  # bool [K]: which participants those are
    codes: dict[str, torch.Tensor]  # block -> float32 [n_codes, k_ℓ]: the private participants' coordinates
    warmup: bool
    bytes_up: list[int]  # per participant
    bytes_down_subspace: list[int]  # per participant: V (and μ) broadcast, on top of the model

    def traffic(self, model_bytes: int) -> dict[str, Any]:
        """The round's traffic by kind (metrics row `traffic`; `dpfl.results.traffic` sums it)."""
        full = self.full_mask.tolist()
        return {"warmup": self.warmup, "model_bytes": model_bytes, "code_uploads": full.count(False),
                "uplink_bytes_full": sum(b for b, f in zip(self.bytes_up, full, strict=True) if f),
                "uplink_bytes_codes": sum(b for b, f in zip(self.bytes_up, full, strict=True) if not f),
                "downlink_bytes_subspace": sum(self.bytes_down_subspace)}


def previous_subspaces(state: dict[str, Any]) -> dict[str, Subspace] | None:
    """The state's `previous` as subspaces per block (None before the first round with private participants)."""
    prev = state["previous"]
    return None if prev is None else {n: Subspace(d["mu"], d["V"]) for n, d in prev.items()}


@dataclass(frozen=True)
class PFAPlus(ServerStep):
    """PFA with delayed projection. `pfa` holds the split and subspace settings (spec §4.2); the rest:

    `warmup_rounds` (≥ 1): rounds with private participants aggregated in full before codes are used.
    `subspace_broadcast`: `private` sends V (and μ) to private participants only; `all` to everyone (the
    code's behaviour, for byte parity).
    """

    encodes_uploads = True  # private participants send codes (`client_payload`)
    linear_in_updates = False  # private updates reach Δ̄ through a projection (no noise statistic)

    pfa: PFA = field(default_factory=PFA)
    warmup_rounds: int = 1
    subspace_broadcast: str = "private"

    @property
    def server_lr(self) -> float:  # type: ignore[override]
        """The server learning rate of the PFA step this one runs."""
        return self.pfa.server_lr

    def __post_init__(self) -> None:
        if isinstance(self.warmup_rounds, bool) or not isinstance(self.warmup_rounds, int) or self.warmup_rounds < 1:
            raise ValueError(f"PFA+ warmup_rounds must be an integer >= 1 (round 1 has no previous subspace), "
                             f"got {self.warmup_rounds!r}")
        if self.subspace_broadcast not in BROADCASTS:
            raise ValueError(f"PFA+ subspace_broadcast must be one of {BROADCASTS}, got {self.subspace_broadcast!r}")

    # ---- population-level set-up, shared with PFA -------------------------------------------------
    def fit_split(self, clients, eps_reported, seed: int = 0) -> PFAPlus:
        return dataclasses.replace(self, pfa=self.pfa.fit_split(clients, eps_reported, seed))

    def accepts_selection(self, selected) -> bool:
        return self.pfa.accepts_selection(selected)

    def weights(self, view: ServerView) -> torch.Tensor:
        return self.pfa.weights(view)

    def aggregation_weights(self, state: Any, view: ServerView, channel: object, dim: int) -> torch.Tensor:
        return self.weights(view)

    @property
    def public_clients(self) -> tuple[int, ...] | None:
        return self.pfa.public_clients

    # ---- the round ---------------------------------------------------------------------------------
    def init(self, params: P.Params) -> dict[str, Any]:
        """No subspace yet, no round with private participants aggregated."""
        return {"previous": None, "private_rounds": 0}

    def in_warmup(self, state: dict[str, Any]) -> bool:
        return int(state["private_rounds"]) < self.warmup_rounds or state["previous"] is None

    def client_payload(self, state: dict[str, Any], uploads: P.Params, view: ServerView, seed: int = 0) -> Payload:
        """What the participants send given the broadcast of `state`'s subspace: public (and warm-up) ones their
        update, private ones their codes."""
        K = len(view)
        if K == 0 or any(u.shape[0] != K for u in uploads.values()):
            raise ValueError(f"uploads must have a leading axis of {K} clients (one per view entry)")
        pub = self.pfa.groups(view, seed).pub
        dim = P.num_parameters({n: u[0] for n, u in uploads.items()})
        warmup = self.in_warmup(state) or bool(pub.all())
        full_mask = torch.ones(K, dtype=torch.bool) if warmup else pub
        codes: dict[str, torch.Tensor] = {}
        bytes_up = [FLOAT_BYTES * dim] * K
        sent = [0] * K
        if not warmup:
            previous = previous_subspaces(state)
            assert previous is not None
            blocks = self.pfa.blocks({n: u[~pub] for n, u in uploads.items()})
            for name, flat in blocks.items():
                sub = previous[name]
                # the broadcast, as received (on the uploads' device: a resumed state may hold CPU tensors)
                V, mu = (t.to(device=flat.device, dtype=torch.float32) for t in (sub.V, sub.mu))
                codes[name] = centred_codes64(flat, mu, V).to(torch.float32)
            code_floats = sum(s.k for s in previous.values())
            basis_floats = sum(s.V.numel() for s in previous.values()) + (dim if self.pfa.sends_center else 0)
            for i in range(K):
                if not pub[i]:
                    bytes_up[i] = FLOAT_BYTES * code_floats
                if not pub[i] or self.subspace_broadcast == "all":
                    sent[i] = FLOAT_BYTES * basis_floats
        full = {n: u[full_mask] for n, u in uploads.items()}
        return Payload(full, full_mask, codes, warmup, bytes_up, sent)

    def mean_update(self, state: dict[str, Any], payload: Payload, view: ServerView, seed: int,
                    round_: int) -> tuple[P.Params, dict[str, Any]]:
        """Δ̄ from the payload alone, and the new state: the subspace refitted for the next round when private
        clients took part (else `state` itself, unchanged)."""
        g = self.pfa.groups(view, seed)
        previous = previous_subspaces(state)
        pub_in_full = g.pub[payload.full_mask]  # positions of the public participants among the full uploads
        full_blocks = self.pfa.blocks(payload.full)
        out: dict[str, torch.Tensor] = {}
        fitted: dict[str, Subspace] = {}
        # the group means as weights on the full uploads' rows: public ones, and the private ones in warm-up
        weights = torch.zeros(1 + int(payload.warmup and g.w_pri is not None), len(pub_in_full), dtype=torch.float64)
        weights[0, pub_in_full] = g.w_pub
        if weights.shape[0] == 2:
            weights[1, ~pub_in_full] = g.w_pri
        for index, (name, flat) in enumerate(full_blocks.items()):
            means = weighted_rows64(flat, weights)
            d_pub = means[0]
            if g.w_pri is None:  # no private participant: WeiAvg over the public clients, state unchanged
                out[name] = d_pub
                continue
            U = flat[pub_in_full].to(torch.float64)
            sub = self.pfa.fit(U, d_pub, seed, round_, index)
            fitted[name] = sub
            if payload.warmup:
                d_pri_hat = sub.project(means[1])
            else:
                prev = previous[name]  # type: ignore[index]
                codes = payload.codes[name].to(torch.float64)
                mu, V, w_pri = (t.to(codes.device) for t in (prev.mu, prev.V, g.w_pri))
                d_pri_hat = mu + V @ (w_pri @ codes)
            out[name] = g.combine(d_pub, d_pri_hat)
        if g.w_pri is not None:
            state = {**state, "previous": {n: {"mu": s.mu, "V": s.V} for n, s in fitted.items()},
                     "private_rounds": int(state["private_rounds"]) + 1}
        like = {n: u[:1] for n, u in payload.full.items()}
        return self.pfa.unblock(out, like), state

    def update(self, state: dict[str, Any], params: P.Params, uploads: Payload, inputs: RoundInputs) -> ServerUpdate:
        """w + server_lr Δ̄ from the round's payload (`client_payload` of the same `state`)."""
        mean, new = self.mean_update(state, uploads, inputs.view, inputs.seed, inputs.round_)
        return ServerUpdate(P.axpy(self.pfa.server_lr, mean, params), new, {})

"""What leaves MP-DP's clients, and its baselines' (spec bidirectional.md §5, §6, §9): the upload mechanisms.

- `PerturbedUploadNoise` (MP-DP, MP-DP-Naive): key agreement on the round's graph, then each client adds its DDP noise
  η_k and its pairwise Δ (MP-DP), or one Gaussian (MP-DP-Naive), to its perturbed gradient (and, with
  `mask_corrections`, pairwise zero-sum masks to Ψ_k, Φ_k); the server receives only running float64 sums. A client
  that leaves after key agreement breaks the cancellation: the round is discarded (`MissingPeersError`, abort) or the
  survivors' key shares remove the dropped clients' Δ (secagg_recovery, "reduced protection").
- `ClearGradients` (FedSGD, MP-CDP): the gradients go to the server as they are (MP-CDP's server is trusted).
- `EncryptedGradients` (TP-SMC): each client adds its share of the Gaussian and encrypts under threshold Paillier.

Their guarantees are stated by the methods' server steps (`server_steps.py`): MP-DP's is NOMINAL and never enters
dpfl's ledger (spec §8.6), so these mechanisms are `accounted = False`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from dpfl.algorithms.secure.mpdp.algorithm import (RoundSettings, _flat, _norm, _remove_dropped, _unflat)
from dpfl.algorithms.secure.mpdp.client_programs import PerturbedTerms
from dpfl.algorithms.secure.mpdp.ddp import CORRECTION_MASK_STREAM, DDPClient, MissingPeersError, NoiseLayout, \
    neighbours, sample_graph
from dpfl.algorithms.secure.mpdp.lmt import LMTResult
from dpfl.algorithms.secure.mpdp.perturb import FactorPlan
from dpfl.algorithms.secure.mpdp.recovery import deal_shares
from dpfl.algorithms.secure.mpdp.update import RunningSums
from dpfl.algorithms.secure.paillier_packing import SlotPacking
from dpfl.algorithms.secure.protocol import default_threshold
from dpfl.algorithms.secure.threshold_paillier import FixedPoint, ThresholdKeys
from dpfl.algorithms.stages import MechanismRelease, UploadMechanism
from dpfl.seeding import Purpose, derive_seed, numpy_generator, torch_generator


class PerturbedUploads(NamedTuple):
    """What MP-DP's server receives: the running sums of the uploads, and the dropped clients whose Δ it removed
    (reduced protection). `clean`: each uploader's noise-free terms, a SIMULATION diagnostic (the sensitivity
    violation rate) that the server's update never reads."""

    sums: RunningSums
    reduced: list[int]
    clean: dict[int, LMTResult]


def simulated_dropouts(dropout: float, clients: int, seed: int, round_: int, attempt: int) -> set[int]:
    """floor(dropout x K) clients, drawn from the run seed (independently of the data), leave after key agreement."""
    n = int(dropout * clients)
    if n == 0:
        return set()
    rng = numpy_generator(seed, Purpose.SECAGG, round_, attempt)
    return {int(c) for c in rng.choice(clients, n, replace=False)}


@dataclass(frozen=True)
class PerturbedUploadNoise(UploadMechanism):
    """MP-DP's (settings.method mpdp) or MP-DP-Naive's (mpdp_naive) noise on each client's perturbed gradient.

    `dropout`: the share of clients that (simulated, seeded) leave each round after key agreement; `drop(round,
    attempt)` names them instead (tests)."""

    settings: RoundSettings = None  # type: ignore[assignment]
    plan: FactorPlan = None  # type: ignore[assignment]
    dropout: float = 0.0
    drop: Callable[[int, int], set[int]] | None = None

    unit = "sample"
    accounted = False  # nominal (spec §8.6): stated by the server step, never entered in the ledger

    def release(self, state: Any, deltas: PerturbedTerms, clients: Sequence[int], seed: int,
                round_: int) -> MechanismRelease:
        st, plan, attempt = self.settings, self.plan, deltas.attempt
        clients = sorted(int(k) for k in clients)
        gone = (self.drop(round_, attempt) if self.drop is not None
                else simulated_dropouts(self.dropout, len(clients), seed, round_, attempt))
        ddp = {k: DDPClient(k, derive_seed(seed, Purpose.NOISE, round_, k, attempt)) for k in clients}
        edges: set[tuple[int, int]] = set()
        if st.method == "mpdp" and (not math.isinf(st.sigma_delta) or st.mask_corrections):
            edges = sample_graph(clients, st.graph, st.n, {k: ddp[k].rng for k in clients})
        adj = neighbours(edges)
        recovering = st.dropout_policy == "secagg_recovery" and bool(edges)
        threshold = st.recovery_threshold or default_threshold(len(clients))
        shares = deal_shares(ddp, threshold, st.run_id, round_) if recovering else {}
        sums, clean = RunningSums(), {}
        d, layout = plan.dim(), NoiseLayout.from_plan(plan)
        seconds = dict.fromkeys(("ddp", "recover_update"), 0.0)
        for k in clients:
            if k in gone:
                continue  # agreed on edges (keys published), then left before uploading
            res = deltas.terms[k]
            t0 = time.perf_counter()
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
                    corr = corr + torch.from_numpy(ddp[k].pairwise(peers, corr.numel(), st.mask_std, st.run_id,
                                                                   round_, "gaussian", CORRECTION_MASK_STREAM))
                    psi, phi = _unflat(corr[:flat_psi.numel()], psi), _unflat(corr[flat_psi.numel():], phi)
            else:  # MP-DP-Naive: a true Gaussian on the perturbed gradient
                noise = ddp[k].rng.normal(0.0, st.S * st.sigma_naive, d) if st.sigma_naive > 0 else np.zeros(d)
            upload = _unflat(_flat(res.grads) + torch.from_numpy(noise), res.grads)
            seconds["ddp"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            sums.add(k, upload, psi, phi)
            seconds["recover_update"] += time.perf_counter() - t0
            clean[k] = res
        missing = set(clients) - set(sums.clients)
        reduced: list[int] = []
        if missing:
            affected = {v for m in missing for v in adj.get(m, []) if v not in missing}
            if edges and affected:
                if not recovering or len(sums.clients) < threshold:
                    raise MissingPeersError(round_, missing, affected, uploaded=sums.clients)
                _remove_dropped(sums, sorted(missing), adj, ddp, shares, threshold, st, round_, layout)
                reduced = sorted(missing)
        metrics = {"ddp_seconds": seconds["ddp"], "upload_sum_seconds": seconds["recover_update"]}
        return MechanismRelease(PerturbedUploads(sums, reduced, clean), state, metrics)

    def bytes_per_upload(self, dim: int) -> int:
        return 8 * dim * (self.plan.out_dim + 2)  # g, Ψ (n_L copies) and Φ in float64

    def describe(self) -> str:
        if self.settings.method == "mpdp":
            return ("MP-DP: gradients at a perturbed model, clipped jointly with their corrections, plus DDP noise "
                    "(η_k and pairwise Δ that cancel in the sum)")
        return "MP-DP-Naive: gradients at a perturbed model, clipped, plus a Gaussian calibrated as (ε, δ)-LDP"


@dataclass(frozen=True)
class ClearGradients(UploadMechanism):
    """The clients' gradients, unchanged, in float64: FedSGD's (no privacy) or MP-CDP's (to a trusted server that
    adds the noise; `private`)."""

    private: bool = False

    @property
    def unit(self) -> str | None:  # type: ignore[override]
        return "sample" if self.private else None

    @property
    def accounted(self) -> bool:  # type: ignore[override]
        return not self.private  # MP-CDP's epsilon is the server step's, computed for its Gaussian rounds

    def apply(self, deltas: Any, clients: Sequence[int], seed: int, round_: int) -> Any:
        return deltas

    def bytes_per_upload(self, dim: int) -> int:
        return 8 * dim

    def describe(self) -> str:
        if self.private:
            return ("MP-CDP: each client's gradient clipped to B, in the clear to a trusted server, which adds "
                    "N(0, (S σ / K)^2) to their mean")
        return "FedSGD: gradients in the clear (no privacy)"


class EncryptedSums(NamedTuple):
    """TP-SMC's uploads: every client's ciphertexts (one per packed plaintext), and the encoding they share."""

    ciphertexts: list[list[int]]
    codec: Any
    values: int


@dataclass(frozen=True)
class EncryptedGradients(UploadMechanism):
    """TP-SMC's client: its clipped gradient plus its share of the Gaussian, N(0, (S σ_cdp)^2 / h), in fixed point,
    encrypted under the threshold-Paillier public key (many coordinates per ciphertext with `packing`)."""

    settings: RoundSettings = None  # type: ignore[assignment]
    keys: ThresholdKeys = None  # type: ignore[assignment]
    fraction_bits: int = 32
    honest: int = 1
    packing: bool = True

    unit = "sample"
    accounted = False  # its epsilon is the server step's (MP-CDP's Gaussian, assuming h honest clients)

    def release(self, state: Any, deltas: dict[int, list[torch.Tensor]], clients: Sequence[int], seed: int,
                round_: int) -> MechanismRelease:
        st, pub = self.settings, self.keys.public
        std = st.S * st.sigma_cdp / math.sqrt(self.honest)
        t0 = time.perf_counter()
        # every coordinate must survive the sum: |g_j| <= B, noise within 40 std (probability < 1e-300 beyond)
        max_abs = st.clip + 40 * std
        if self.packing:  # the layout refuses widths that could carry into a neighbour or past n
            codec: SlotPacking | FixedPoint = SlotPacking(pub.n, self.fraction_bits, max_abs, len(clients))
        else:
            codec = FixedPoint(pub.n, self.fraction_bits)
            codec.check_headroom(max_abs, len(clients))
        ciphertexts, violations, values = [], 0, 0
        for k in clients:
            g = deltas[k]
            violations += _norm(g) > st.S * (1 + 1e-9)
            flat = _flat(g)
            values = flat.numel()
            if std > 0:
                noise = torch_generator(seed, Purpose.NOISE, round_, k)
                flat = flat + torch.randn(flat.shape, generator=noise, dtype=flat.dtype) * std
            ciphertexts.append([pub.encrypt(m) for m in codec.pack(flat.tolist())])
        metrics = {"client_seconds": time.perf_counter() - t0, "violations": int(violations)}
        return MechanismRelease(EncryptedSums(ciphertexts, codec, values), state, metrics)

    def bytes_per_upload(self, dim: int) -> int:
        ciphertext_bytes = (2 * self.keys.public.n.bit_length() + 7) // 8
        slots = self._slots(dim)
        return ciphertext_bytes * slots

    def _slots(self, dim: int) -> int:
        if not self.packing:
            return dim
        std = self.settings.S * self.settings.sigma_cdp / math.sqrt(self.honest)
        codec = SlotPacking(self.keys.public.n, self.fraction_bits, self.settings.clip + 40 * std,
                            len(self.keys.shares))
        return math.ceil(dim / codec.slots)

    def describe(self) -> str:
        return (f"TP-SMC: each client's gradient clipped to B plus its share N(0, (S σ)^2 / {self.honest}) of the "
                "Gaussian, encrypted under threshold Paillier; the aggregator decrypts only the sum")

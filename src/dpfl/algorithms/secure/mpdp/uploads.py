"""What leaves MP-DP's clients, and its baselines' (spec bidirectional.md §5, §6, §9): the upload mechanisms.

- `PerturbedUploadNoise` (MP-DP, MP-DP-Naive): key agreement on the round's graph, then each client adds its DDP noise
  η_k and its pairwise Δ (MP-DP), or one Gaussian (MP-DP-Naive), to its perturbed gradient (and, with
  `mask_corrections`, pairwise zero-sum masks to Ψ_k, Φ_k); the server sees every upload (the pairwise Δ hide each
  one and cancel in the sum) and adds it to running float64 sums as it arrives. A client that leaves after key
  agreement breaks the cancellation: the round is discarded (`MissingPeersError`, abort) or the survivors' key
  shares remove the dropped clients' Δ (secagg_recovery, "reduced protection").
- `ClearGradients` (FedSGD, MP-CDP): the gradients go to the server as they are (MP-CDP's server is trusted).
- `EncryptedGradients` (TP-SMC): each client adds its share of the Gaussian and encrypts under threshold Paillier.

Their guarantees are stated by the methods' server steps (`server_steps.py`): MP-DP's is NOMINAL and never enters
dpfl's ledger (spec §8.6), so these mechanisms are `accounted = False`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from dpfl.algorithms.secure.mpdp.client_programs import PerturbedTerms
from dpfl.algorithms.secure.mpdp.lmt import LMTResult
from dpfl.algorithms.secure.mpdp.perturb import FactorPlan
from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings
from dpfl.algorithms.secure.mpdp.update import RunningSums
from dpfl.algorithms.secure.mpdp.upload_round import UploadRound
from dpfl.algorithms.secure.threshold_paillier import ThresholdKeys
from dpfl.algorithms.secure.tpsmc import ciphertext_bytes, codec_for, encrypted_uploads
from dpfl.algorithms.stages import MechanismRelease, UploadMechanism
from dpfl.seeding import Purpose, derive_seed, numpy_generator, torch_generator

STATED = " (the method states its own guarantee in privacy.json's stage block; not in dpfl's ledger)"


class PerturbedUploads(NamedTuple):
    """What MP-DP's server keeps of the round's uploads (each seen as it arrives): their running sums, and the
    dropped clients whose Δ it removed (reduced protection). `clean`: each uploader's noise-free terms, a SIMULATION
    diagnostic (the sensitivity violation rate) that the server's update never reads."""

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
    unaccounted_label = STATED

    def release(self, state: Any, deltas: PerturbedTerms, clients: Sequence[int], seed: int,
                round_: int) -> MechanismRelease:
        attempt = deltas.attempt
        gone = (self.drop(round_, attempt) if self.drop is not None
                else simulated_dropouts(self.dropout, len(clients), seed, round_, attempt))
        seeds = {int(k): derive_seed(seed, Purpose.NOISE, round_, int(k), attempt) for k in clients}
        uploads = UploadRound(self.settings, self.plan, clients, seeds, round_)
        clean = {}
        for k in uploads.clients:
            if k in gone:
                continue  # agreed on edges (keys published), then left before uploading
            uploads.upload(k, deltas.terms[k])
            clean[k] = deltas.terms[k]
        reduced = uploads.settle()
        metrics = {"ddp_seconds": uploads.seconds["ddp"], "upload_sum_seconds": uploads.seconds["sum"]}
        return MechanismRelease(PerturbedUploads(uploads.sums, reduced, clean), state, metrics)

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
    unaccounted_label = STATED

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


@dataclass(frozen=True)
class EncryptedGradients(UploadMechanism):
    """TP-SMC's client (`tpsmc.encrypted_uploads`): its clipped gradient plus its share of the Gaussian,
    N(0, (S σ_cdp)^2 / h), in fixed point, encrypted under the threshold-Paillier public key (many coordinates per
    ciphertext with `packing`)."""

    settings: RoundSettings = None  # type: ignore[assignment]
    keys: ThresholdKeys = None  # type: ignore[assignment]
    fraction_bits: int = 32
    honest: int = 1
    packing: bool = True

    unit = "sample"
    accounted = False  # its epsilon is the server step's (MP-CDP's Gaussian, assuming h honest clients)
    unaccounted_label = STATED

    def apply(self, deltas: dict[int, list[torch.Tensor]], clients: Sequence[int], seed: int, round_: int) -> Any:
        noise = [torch_generator(seed, Purpose.NOISE, round_, int(k)) for k in clients]
        return encrypted_uploads([deltas[int(k)] for k in clients], self.settings, self.keys, self.fraction_bits,
                                 self.honest, noise, self.packing)

    def release(self, state: Any, deltas: dict[int, list[torch.Tensor]], clients: Sequence[int], seed: int,
                round_: int) -> MechanismRelease:
        t0 = time.perf_counter()
        uploads = self.apply(deltas, clients, seed, round_)
        return MechanismRelease(uploads, state, {"encrypt_seconds": time.perf_counter() - t0,
                                                 "violations": uploads.violations})

    def bytes_per_upload(self, dim: int) -> int:
        codec = codec_for(self.settings, self.keys, self.fraction_bits, self.honest, len(self.keys.shares),
                          self.packing)
        return ciphertext_bytes(self.keys) * len(codec.pack([0.0] * dim))

    def describe(self) -> str:
        return (f"TP-SMC: each client's gradient clipped to B plus its share N(0, (S σ)^2 / {self.honest}) of the "
                "Gaussian, encrypted under threshold Paillier; the aggregator decrypts only the sum")

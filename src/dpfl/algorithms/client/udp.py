"""Client-level local DP ("UDP"): clip each client's whole update, add Gaussian noise before upload.

Unit: one client's whole dataset. Neighbouring datasets differ in one client's data; the clipped
update moves by at most C (the sensitivity used by the specs, e.g. FedCEO §7). The noise is split
over the expected cohort K (FedCEO's Algorithm 1: ξ ~ N(0, σ²C²/K)), so the *sum* of K uploads carries
std σC. Against a server that sees each upload, one upload is a Gaussian mechanism with multiplier
σ/√K and no amplification by client sampling (the server chooses who takes part): that is the ledger's
event. The aggregate view (multiplier σ on the sum, amplified by the client sampling) holds only for
an observer who sees nothing but the aggregate; it is reported separately, labelled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar
from dataclasses import dataclass, replace

from dp_accounting import DpEvent, SelfComposedDpEvent

from dpfl.algorithms.client.upload import upload_noise
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.stages import UploadMechanism
from dpfl.engine import params as P
from dpfl.privacy.events import gaussian_event


@dataclass(frozen=True)
class ClippedNoisyUpdate(UploadMechanism):
    """Upload Δ·min(1, C/‖Δ‖) + N(0, (σC)²/K · I), the norm over all parameters together.

    `cohort` is K, the number of uploads the noise is split over (1: each upload carries σC).
    `upload_scale` multiplies the privatised update (FedCEO's `paper_eta_scaling`: η, Algorithm 1 line 10
    literally); post-processing, so the events do not change. `hidden_sampling` (FedCEO's
    `per_upload_amplification`) charges every client every round one upload amplified by the client sampling
    (`round_event`) instead of charging participations: valid ONLY if the server cannot tell who took part.
    `noise_multiplier` None: calibrated from the clients' budgets when the run starts (`calibration_family` 'udp').
    `secure_sum`: distributed noise under secure aggregation; `cohort` is then the protocol's threshold t, so
    every sum the server can see holds at least t noise shares, i.e. noise >= σC, and one participation costs
    the Gaussian mechanism at σ (no amplification by client sampling: the server knows who took part).
    """

    clip: float
    noise_multiplier: float | None
    cohort: float = 1.0
    unit: str = "client"
    accounted: bool = True
    same_event_for_every_client: ClassVar[bool] = True  # `event` reads the round and the cohort only
    upload_scale: float = 1.0
    hidden_sampling: bool = False
    secure_sum: bool = False  # uploads go through secure aggregation: the server sees only sums of >= `cohort`
    calibration_family = "udp"  # the calibration family of this stage's noise (dpfl.privacy.run_calibration)

    def __post_init__(self) -> None:
        if not self.clip > 0:
            raise ValueError(f"update clip must be > 0, got {self.clip}")
        if self.noise_multiplier is not None and not self.noise_multiplier >= 0:
            raise ValueError(f"noise multiplier must be >= 0, got {self.noise_multiplier}")
        if not self.cohort >= 1:
            raise ValueError(f"the noise is split over a cohort of >= 1 uploads, got {self.cohort}")
        if not self.upload_scale > 0:
            raise ValueError(f"upload_scale must be > 0, got {self.upload_scale}")

    @property
    def noise(self) -> float | None:
        return self.noise_multiplier

    def with_noise(self, noise: float) -> ClippedNoisyUpdate:
        return replace(self, noise_multiplier=float(noise))

    @property
    def upload_multiplier(self) -> float:
        """σ/√K: the multiplier of one upload's Gaussian relative to the clip norm."""
        if self.noise_multiplier is None:
            raise ValueError("the upload noise multiplier is not calibrated yet (run it through FederatedRun)")
        return self.noise_multiplier / math.sqrt(self.cohort)

    def apply(self, deltas: P.Params, clients: Sequence[int], seed: int, round_: int) -> P.Params:
        flat = P.flatten(deltas)
        factor = (self.clip / (flat.norm(dim=1) + 1e-12)).clamp(max=1.0)
        flat = flat * factor[:, None]
        if self.upload_multiplier > 0:
            noise = upload_noise(flat.shape[1], clients, seed, round_, flat.device)
            flat = flat + self.upload_multiplier * self.clip * noise
        if self.upload_scale != 1.0:
            flat = flat * self.upload_scale
        return P.unflatten(flat, deltas)

    def event(self, client: int, round_: int, cohort: int) -> DpEvent | None:
        """One upload seen by the server: the Gaussian mechanism at σ/√K, no amplification; with `secure_sum` the
        server sees only the sum, whose noise is at least σC: the Gaussian mechanism at σ.

        None with `hidden_sampling`: `round_event` charges every client every round instead.
        """
        if self.hidden_sampling:
            return None
        if self.secure_sum:
            if self.noise_multiplier is None:
                raise ValueError("the upload noise multiplier is not calibrated yet (run it through FederatedRun)")
            return gaussian_event(self.noise_multiplier)
        return gaussian_event(self.upload_multiplier)

    @property
    def event_cohort(self) -> float:
        """The K of the per-participation event σ/√K (1 under secure aggregation: the sum carries σ)."""
        return 1.0 if self.secure_sum else self.cohort

    def round_event(self, selection: Selection, population: int) -> DpEvent | None:
        """With `hidden_sampling`: one round's cost to every client, σ/√K amplified by the client sampling."""
        if not self.hidden_sampling:
            return None
        return selection.client_level_event(self.upload_multiplier, population)

    def aggregate_event(self, selection: Selection, population: int, rounds: int) -> DpEvent:
        """`rounds` releases of the sum only (multiplier σ), amplified by the client sampling."""
        return SelfComposedDpEvent(selection.client_level_event(self.noise_multiplier, population), rounds)

    def bytes_per_upload(self, dim: int) -> int:
        return 4 * dim

    def describe(self) -> str:
        split = f" split over K = {self.cohort:g} uploads (σ/√K = {self.upload_multiplier:.4g} per upload)" \
            if self.cohort != 1 else ""
        if self.secure_sum:
            split = (f" shared out as distributed noise: each upload carries σC/√t with t = {self.cohort:g}, the "
                     f"secure-aggregation threshold, so every revealed sum carries at least σC")
        scaled = f", the sum scaled by {self.upload_scale:g} (paper_eta_scaling)" if self.upload_scale != 1.0 else ""
        return (f"update clipped to {self.clip} + Gaussian noise (multiplier {self.noise_multiplier}{split}) on "
                f"upload{scaled}")

"""Client-level local DP ("UDP"): clip each client's whole update, add Gaussian noise before upload.

Unit: one client's whole dataset. Neighbouring datasets differ in one client's data; the clipped
update moves by at most C (the sensitivity used by the specs, e.g. FedCEO §7). Each upload is a
Gaussian mechanism with multiplier `noise_multiplier` seen by the server, with no amplification by
client sampling (the server chooses who takes part).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dp_accounting import DpEvent

from dpfl.algorithms.client.upload import upload_noise
from dpfl.engine import params as P
from dpfl.privacy.events import gaussian_event


@dataclass(frozen=True)
class ClippedNoisyUpdate:
    """Upload Δ·min(1, C/‖Δ‖) + N(0, (zC)² I), the norm over all parameters together."""

    clip: float
    noise_multiplier: float
    unit: str = "client"
    accounted: bool = True

    def __post_init__(self) -> None:
        if not self.clip > 0:
            raise ValueError(f"update clip must be > 0, got {self.clip}")
        if self.noise_multiplier < 0:
            raise ValueError(f"noise multiplier must be >= 0, got {self.noise_multiplier}")

    def apply(self, deltas: P.Params, clients: Sequence[int], seed: int, round_: int) -> P.Params:
        flat = P.flatten(deltas)
        factor = (self.clip / (flat.norm(dim=1) + 1e-12)).clamp(max=1.0)
        flat = flat * factor[:, None]
        if self.noise_multiplier > 0:
            flat = flat + self.noise_multiplier * self.clip * upload_noise(flat.shape[1], clients, seed, round_)
        return P.unflatten(flat, deltas)

    def event(self, client: int) -> DpEvent | None:
        return gaussian_event(self.noise_multiplier)

    def bytes_per_upload(self, dim: int) -> int:
        return 4 * dim

    def describe(self) -> str:
        return f"update clipped to {self.clip} + Gaussian noise (multiplier {self.noise_multiplier}) on upload"

"""A privacy mechanism with no accountant attached, to test that such runs report no epsilon."""

from __future__ import annotations

from dataclasses import dataclass

from dpfl.algorithms.client.upload import upload_noise
from dpfl.algorithms.stages import UploadMechanism
from dpfl.engine import params as P


@dataclass(frozen=True)
class UnaccountedNoise(UploadMechanism):
    """Gaussian noise on the upload that claims a unit but has no event (accounted = False)."""

    std: float = 0.01
    unit: str = "sample"
    accounted: bool = False

    def apply(self, deltas, clients, seed, round_):
        flat = P.flatten(deltas)
        return P.unflatten(flat + self.std * upload_noise(flat.shape[1], clients, seed, round_), deltas)

    def event(self, client, round_, cohort):
        return None

    def bytes_per_upload(self, dim):
        return 4 * dim

    def describe(self):
        return f"Gaussian noise (std {self.std}) on the upload"

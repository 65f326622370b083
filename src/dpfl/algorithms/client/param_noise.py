"""Parameter noise: Gaussian noise of a fixed std added to the uploaded parameters (Noisy-FedAvg).

The guarantee of this mechanism depends on the sensitivity of the whole local trajectory to one
record, which needs the f-DP analysis of `specs/fdp_accounting.md`; no such accountant is attached
here, so runs using it report *no* epsilon (`accounted = False`) rather than a wrong one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dp_accounting import DpEvent

from dpfl.algorithms.client.upload import upload_noise
from dpfl.engine import params as P


@dataclass(frozen=True)
class ParameterNoise:
    """Upload w_local + N(0, std² I), i.e. the update plus the same noise."""

    std: float
    unit: str | None = "sample"
    accounted: bool = False

    def __post_init__(self) -> None:
        if self.std < 0:
            raise ValueError(f"parameter noise std must be >= 0, got {self.std}")

    def apply(self, deltas: P.Params, clients: Sequence[int], seed: int, round_: int) -> P.Params:
        flat = P.flatten(deltas)
        if self.std > 0:
            flat = flat + self.std * upload_noise(flat.shape[1], clients, seed, round_)
        return P.unflatten(flat, deltas)

    def event(self, client: int) -> DpEvent | None:
        return None

    def bytes_per_upload(self, dim: int) -> int:
        return 4 * dim

    def describe(self) -> str:
        return f"Gaussian noise (std {self.std}) on uploaded parameters"

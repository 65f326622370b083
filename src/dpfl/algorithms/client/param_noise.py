"""Parameter noise: Noisy-FedAvg/FedProx's upload w_{i,K,t} + N(0, σ² I) on every uploaded tensor.

The guarantee depends on how far one record can move the whole clipped local trajectory, which the f-DP
accountant (`dpfl.privacy.fdp_run`) bounds from the run's step sizes, clip norm and cohort: round t is one Gaussian
mechanism per participating client (`event`), composed in the run's per-client ledger, and the final report adds
the shifted-interpolation bound where it applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from dp_accounting import DpEvent

from dpfl.algorithms.client.upload import upload_noise
from dpfl.algorithms.stages import UploadMechanism
from dpfl.engine import params as P
from dpfl.privacy.fdp_run import NoisyRunAccounting


@dataclass(frozen=True)
class ParameterNoise(UploadMechanism):
    """Upload the update plus N(0, σ² I): the server, which knows w_t, receives w_{i,K,t} + n_{i,t}.

    `noise_offset` shifts the noise streams (the sensitivity experiment's independent-noise coupling); runs use 0.
    An accounting whose σ is None is calibrated from the clients' budgets when the run starts (`calibration_family`).
    """

    accounting: NoisyRunAccounting
    unit: str | None = "sample"
    accounted: bool = True
    same_event_for_every_client: ClassVar[bool] = True  # `event` reads the round and the cohort only
    noise_offset: int = 0
    calibration_family = "param_noise"  # the calibration family of this stage's noise (dpfl.privacy.run_calibration)

    @property
    def fdp_accounting(self) -> NoisyRunAccounting:
        return self.accounting

    @property
    def std(self) -> float:
        if self.accounting.sigma is None:
            raise ValueError("the parameter-noise std is not calibrated yet (run it through FederatedRun)")
        return self.accounting.sigma

    @property
    def noise(self) -> float | None:
        return self.accounting.sigma

    def with_noise(self, noise: float) -> ParameterNoise:
        return replace(self, accounting=replace(self.accounting, sigma=float(noise)))

    def apply(self, deltas: P.Params, clients: Sequence[int], seed: int, round_: int) -> P.Params:
        flat = P.flatten(deltas)
        ids = [c + self.noise_offset for c in clients]
        return P.unflatten(flat + self.std * upload_noise(flat.shape[1], ids, seed, round_, flat.device), deltas)

    def event(self, client: int, round_: int, cohort: int) -> DpEvent | None:
        """Round `round_` of a participating client, `cohort` uploads averaged (the view decides the noise left)."""
        return self.accounting.event(round_, cohort)

    def bytes_per_upload(self, dim: int) -> int:
        return 4 * dim

    def describe(self) -> str:
        a = self.accounting
        return (f"Gaussian noise (std {a.sigma}) on every uploaded parameter after {a.clip_mode.replace('_', '-')} "
                f"clipped local steps (V = {a.clip}); f-DP accounted, {a.view} view")

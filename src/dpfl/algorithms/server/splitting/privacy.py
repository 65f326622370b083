"""Differential privacy of the splitting family (operator_splitting.md §9, a dpfl extension; the paper has no DP).

The only data-dependent quantity a client releases in a round is its local-operator output L_i(u_i): the
relaxations, averages, reflections, the duals u_i and the Anderson weights are functions of earlier releases,
so they are post-processing. Two modes:

* "update_gaussian" (client level): D = L_i(u_i) - u_i is clipped to C and u_i + D + N(0, z^2 C^2 I) is
  released (dpfl's UDP upload stage with the noise not split over a cohort): one Gaussian mechanism of sensitivity
  C per upload (a GaussianDpEvent(z) per participation, no
  amplification by client sampling claimed). With alpha = 2 the reflection doubles the injected noise in z:
  no privacy cost, a utility cost.
* "dpsgd" (sample level): the operator's inner steps run DP-SGD (Poisson rate q = b / N_i, clip C, noise z),
  one Poisson-sampled Gaussian event per inner step; for gradient steps and the inexact prox only.

No convergence claim of the paper carries over to noisy operators: DP runs of fedsplit, fedpi and fedrp carry
the label NO_CONVERGENCE_GUARANTEE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from dp_accounting import DpEvent

from dpfl.algorithms.client.local_operators import InnerDPSGD
from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.privacy.events import dpsgd_event, gaussian_event

DP_MODES: tuple[str, ...] = ("update_gaussian", "dpsgd")
NO_CONVERGENCE_GUARANTEE = "no guarantee of convergence under noise"


@dataclass(frozen=True)
class SplittingDP:
    """mode, clip C, noise multiplier z, and (dpsgd) the expected inner batch b."""

    mode: str
    clip: float
    noise_multiplier: float | None  # None: calibrated from the clients' budgets when the run starts
    batch: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in DP_MODES:
            raise ValueError(f"dp mode must be one of {', '.join(DP_MODES)}, got {self.mode!r}")
        if not self.clip > 0:
            raise ValueError(f"dp clip must be > 0, got {self.clip}")
        if self.noise_multiplier is not None and not self.noise_multiplier >= 0:
            raise ValueError(f"dp noise multiplier must be >= 0, got {self.noise_multiplier}")
        if self.mode == "dpsgd" and (self.batch is None or self.batch < 1):
            raise ValueError("dp mode 'dpsgd' needs the expected inner batch size (batch >= 1)")
        if self.mode == "update_gaussian" and self.batch is not None:
            raise ValueError("dp mode 'update_gaussian' has no inner batch; leave batch unset")

    @property
    def unit(self) -> str:
        return "client" if self.mode == "update_gaussian" else "sample"

    @property
    def z(self) -> float:
        if self.noise_multiplier is None:
            raise ValueError("the dp noise multiplier is not calibrated yet (give budgets to run_splitting)")
        return self.noise_multiplier

    def inner(self) -> InnerDPSGD | None:
        if self.mode != "dpsgd":
            return None
        assert self.batch is not None
        return InnerDPSGD(self.clip, self.z, self.batch)

    def release(self, U: torch.Tensor, outputs: torch.Tensor, idx: torch.Tensor, seed: int,
                round_: int) -> torch.Tensor:
        """What clients `idx` send: their outputs as they are (dpsgd), or u + clip(L(u) - u) + noise."""
        if self.mode == "dpsgd":
            return outputs
        stage = ClippedNoisyUpdate(self.clip, self.z)  # the same mechanism as every UDP upload
        released = stage.apply({"update": outputs - U}, [int(i) for i in idx], seed, round_)["update"]
        return U + released

    def event(self, n_records: int, inner_steps: int) -> DpEvent:
        """The event of one participation of a client with n_records records."""
        if self.mode == "update_gaussian":
            return gaussian_event(self.z)
        assert self.batch is not None
        if inner_steps < 1:
            raise ValueError("dp mode 'dpsgd' needs a local operator with inner steps (gradient steps or inexact prox)")
        return dpsgd_event(self.z, inner_steps, sampling="poisson", sample_rate=self.batch / n_records)

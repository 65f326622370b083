"""Central DP-FedAvg (McMahan, Ramage, Talwar, Zhang, ICLR 2018): a trusted server clips each client's
update to S, adds N(0, z² S²) to the sum and divides by the *expected* number of participants.

Client-level DP against anyone who sees the global models (not against the server, which sees the
individual updates). The fixed denominator keeps the sensitivity S / expected count regardless of how
many clients were actually drawn. Accounting: one sampled Gaussian per round for every client still in
the population, sampled as the selection samples (see `Selection.client_level_event`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import ServerStep
from dpfl.engine import params as P
from dpfl.seeding import Purpose, torch_generator


@dataclass(frozen=True)
class CentralDPFedAvg(ServerStep):
    """`noise_multiplier` None: calibrated from the clients' budgets when the run starts (calibration family
    'central')."""

    clip: float
    noise_multiplier: float | None
    server_lr: float = 1.0
    central_noise = True
    calibration_family = "central"  # the calibration family of this stage's noise (dpfl.privacy.run_calibration)

    def __post_init__(self) -> None:
        if not self.clip > 0:
            raise ValueError(f"central DP-FedAvg clip must be > 0, got {self.clip}")
        if self.noise_multiplier is not None and not self.noise_multiplier >= 0:
            raise ValueError(f"noise multiplier must be >= 0, got {self.noise_multiplier}")
        if not self.server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {self.server_lr}")

    @property
    def noise(self) -> float | None:
        return self.noise_multiplier

    def with_noise(self, noise: float) -> CentralDPFedAvg:
        return replace(self, noise_multiplier=float(noise))

    def aggregate(self, global_params: P.Params, uploads: P.Params, view: ServerView, seed: int,
                  round_: int) -> P.Params:
        expected_clients = view.expected_clients
        if self.noise_multiplier is None:
            raise ValueError("the server's noise multiplier is not calibrated yet (run it through FederatedRun)")
        if not expected_clients > 0:
            raise ValueError("central DP-FedAvg needs a positive expected number of clients")
        device = next(iter(global_params.values())).device
        flat = P.flatten(uploads) if len(view) else torch.zeros(0, P.num_parameters(global_params), device=device)
        factor = (self.clip / (flat.norm(dim=1) + 1e-12)).clamp(max=1.0)
        total = (flat * factor[:, None]).sum(0)
        if self.noise_multiplier > 0:
            g = torch_generator(seed, Purpose.SERVER_NOISE, round_, device=device)
            total = total + self.noise_multiplier * self.clip * torch.randn(total.shape[0], generator=g, device=device)
        update = P.unflatten(total / expected_clients, global_params, leading=0)
        return P.axpy(self.server_lr, update, global_params)

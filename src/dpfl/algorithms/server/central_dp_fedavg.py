"""Central DP-FedAvg (McMahan, Ramage, Talwar, Zhang, ICLR 2018): a trusted server clips each client's
update to S, adds N(0, z² S²) to the sum and divides by the *expected* number of participants.

Client-level DP against anyone who sees the global models (not against the server, which sees the
individual updates). The fixed denominator keeps the sensitivity S / expected count regardless of how
many clients were actually drawn. Accounting: one sampled Gaussian per round for every client still in
the population, sampled as the selection samples (see `Selection.client_level_event`).

With `adaptive_clipping` (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021; `dpfl.privacy.adaptive_clipping`)
the clip S = C_t of round t lives in the step's state ({"clip": C_t}): the round clips each update to C_t, releases
the noised count of the CENTRED indicators, sum_i (1[||Δ_i|| <= C_t] - 1/2) + N(0, σ_b²), whose sensitivity is 1/2
even though the number of participants is not public (Poisson selection: adding a client moves it by ±1/2, where
the plain count would move by 1), reads the noised fraction b~_t = that / m + 1/2 (m the expected cohort: the plain
(count + noise) / m when the cohort is m), noises the sum with N(0, z_Δ² C_t²), z_Δ = (z^-2 - (2 σ_b)^-2)^(-1/2),
and moves the clip to C_{t+1} = C_t exp(-η (b~_t - γ)). By the paper's Theorem 1 the count and the sum together are
one Gaussian mechanism with multiplier z, so the accountant charges z (`noise`) exactly as for a fixed clip;
C_{t+1} is a function of released values only. (tensorflow_privacy's QuantileEstimatorQuery centres the same way.)

With `noise_cohort` M (pfl-research's noise_cohort_size: a cheap simulation of a larger cohort) the noise on the sum
of the m expected participants is N(0, (z S m / M)^2), so the average carries the noise z S / M that a cohort of M
would give it, and the accountant models a cohort of M (`accounted_selection`): rate M / N under Poisson selection,
M without replacement under fixed-size selection. The epsilons of the ledger are then the SIMULATED run's, never
this run's guarantee: this run's own noise multiplier is z m / M at its own sampling (the privacy report computes
both and says which is which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
from dpfl.engine import params as P
from dpfl.privacy.adaptive_clipping import COUNT_NOISE_KEY, AdaptiveClipping, next_clip, update_noise_multiplier
from dpfl.seeding import Purpose, numpy_generator, torch_generator


@dataclass(frozen=True)
class CentralDPFedAvg(ServerStep):
    """`noise_multiplier` None: calibrated from the clients' budgets when the run starts (calibration family
    'central').

    `adaptive_clipping`: the clip follows the target quantile of the update norms (module docstring); its
    `count_noise` (σ_b) must be resolved (`dp_fedavg_central` sets the expected cohort / 20 when the config leaves it
    null), and `clip` is then the initial clip. A σ_b that leaves the sum no budget (2 σ_b <= z) is refused as soon
    as z is known (here, or in `with_noise` at the start of the run).
    """

    clip: float
    noise_multiplier: float | None
    server_lr: float = 1.0
    adaptive_clipping: AdaptiveClipping | None = None
    noise_cohort: int | None = None  # simulate a cohort of this many (module docstring)
    simulated_selection: Selection | None = None  # the selection of that cohort, which the accountant models
    central_noise = True
    calibration_family = "central"  # the calibration family of this stage's noise (dpfl.privacy.run_calibration)

    def __post_init__(self) -> None:
        if not self.clip > 0:
            raise ValueError(f"central DP-FedAvg clip must be > 0, got {self.clip}")
        if self.noise_multiplier is not None and not self.noise_multiplier >= 0:
            raise ValueError(f"noise multiplier must be >= 0, got {self.noise_multiplier}")
        if not self.server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {self.server_lr}")
        if self.adaptive_clipping is not None:
            if self.adaptive_clipping.count_noise is None:
                raise ValueError("adaptive clipping in central DP-FedAvg needs its count noise sigma_b resolved "
                                 "(AdaptiveClipping.count_noise; dp_fedavg_central sets expected clients / 20)")
            _ = self.update_noise_multiplier  # refuses a sigma_b that leaves the sum no budget
        if (self.noise_cohort is None) != (self.simulated_selection is None):
            raise ValueError("a simulated cohort needs both noise_cohort and simulated_selection")
        if self.noise_cohort is not None and self.adaptive_clipping is not None:
            raise ValueError("noise_cohort does not combine with adaptive clipping (its count would need rescaling)")

    def accounted_selection(self, selection: Selection) -> Selection:
        return selection if self.simulated_selection is None else self.simulated_selection

    @property
    def noise(self) -> float | None:
        """z, the multiplier the accountant charges (with adaptive clipping: for the count and the sum together)."""
        return self.noise_multiplier

    def with_noise(self, noise: float) -> CentralDPFedAvg:
        return replace(self, noise_multiplier=float(noise))

    @property
    def count_noise(self) -> float:
        """σ_b, the std of the adaptive clip's count noise."""
        if self.adaptive_clipping is None or self.adaptive_clipping.count_noise is None:
            raise ValueError("this step has no adaptive clipping")
        return self.adaptive_clipping.count_noise

    @property
    def update_noise_multiplier(self) -> float | None:
        """z_Δ, the sum's noise multiplier relative to the round's clip: z itself for a fixed clip, Theorem 1's
        (z^-2 - (2 σ_b)^-2)^(-1/2) with adaptive clipping (None: z not calibrated yet)."""
        z = self.noise_multiplier
        if z is None or self.adaptive_clipping is None:
            return z
        try:
            return update_noise_multiplier(z, self.count_noise)
        except ValueError as err:
            raise ValueError(f"{COUNT_NOISE_KEY}: {err}") from None

    # -- explicit state ---------------------------------------------------------------------------------------
    def init(self, params: P.Params) -> dict[str, float] | None:
        """{"clip": C_0} with adaptive clipping; None (stateless) for a fixed clip."""
        return None if self.adaptive_clipping is None else {"clip": float(self.adaptive_clipping.initial_clip)}

    def update(self, state: Any, params: P.Params, uploads: P.Params, inputs: RoundInputs) -> ServerUpdate:
        if self.adaptive_clipping is None:
            return ServerUpdate(self.aggregate(params, uploads, inputs.view, inputs.seed, inputs.round_), state, {})
        clip = self.clip_of(state)
        new, centred = self._step(params, uploads, inputs.view, inputs.seed, inputs.round_, clip)
        noised = centred + self.count_noise * float(
            numpy_generator(inputs.seed, Purpose.CLIP_COUNT, inputs.round_).standard_normal())
        return self._adapted(new, clip, noised, inputs.view.expected_clients)

    def clip_of(self, state: Any) -> float:
        """The adaptive clip C_t held in `state` (what `init` or the last `update` returned)."""
        if not isinstance(state, dict) or "clip" not in state:
            raise ValueError("central DP-FedAvg with adaptive clipping reads its clip from its state: pass what init "
                             f"or the last update returned, got {state!r}")
        return float(state["clip"])

    def _adapted(self, params: P.Params, clip: float, noised_centred: float, expected: float) -> ServerUpdate:
        """The round's result and the clip's geometric step from the released noised centred count
        sum_i (1[||Δ_i|| <= C_t] - 1/2) + N(0, σ_b²) (post-processing): b~_t = noised_centred / m + 1/2."""
        ac = self.adaptive_clipping
        assert ac is not None
        fraction = noised_centred / expected + 0.5
        new_clip = next_clip(clip, fraction, ac.target_quantile, ac.learning_rate)
        if not (math.isfinite(new_clip) and new_clip > 0):
            raise ValueError(f"adaptive clipping: the clip left (0, inf) ({clip:g} -> {new_clip:g}); lower "
                             "privacy.adaptive_clipping.learning_rate or count_noise")
        return ServerUpdate(params, {"clip": new_clip},
                            {"adaptive_clip": clip, "adaptive_clip_fraction": float(fraction)})

    def aggregate(self, global_params: P.Params, uploads: P.Params, view: ServerView, seed: int,
                  round_: int) -> P.Params:
        if self.adaptive_clipping is not None:
            raise ValueError("central DP-FedAvg with adaptive clipping keeps its clip in its state: call update")
        return self._step(global_params, uploads, view, seed, round_, self.clip)[0]

    def _step(self, global_params: P.Params, uploads: P.Params, view: ServerView, seed: int, round_: int,
              clip: float) -> tuple[P.Params, float]:
        """The new global parameters from the uploads clipped to `clip` and noised with z_Δ * clip, and the
        adaptive clip's centred count sum_i (1[||Δ_i|| <= clip] - 1/2), before its noise."""
        expected_clients = view.expected_clients
        z = self.update_noise_multiplier
        if z is None:
            raise ValueError("the server's noise multiplier is not calibrated yet (run it through FederatedRun)")
        if not expected_clients > 0:
            raise ValueError("central DP-FedAvg needs a positive expected number of clients")
        device = next(iter(global_params.values())).device
        flat = P.flatten(uploads) if len(view) else torch.zeros(0, P.num_parameters(global_params), device=device)
        norms = flat.norm(dim=1)
        factor = (clip / (norms + 1e-12)).clamp(max=1.0)
        total = (flat * factor[:, None]).sum(0)
        if z > 0:
            g = torch_generator(seed, Purpose.SERVER_NOISE, round_, device=device)
            sigma = z * clip
            if self.noise_cohort is not None:  # the noise a cohort of noise_cohort would put on the average
                sigma = sigma * expected_clients / self.noise_cohort
            total = total + sigma * torch.randn(total.shape[0], generator=g, device=device)
        update = P.unflatten(total / expected_clients, global_params, leading=0)
        centred = float((norms <= clip).sum()) - 0.5 * len(norms) if self.adaptive_clipping is not None else 0.0
        return P.axpy(self.server_lr, update, global_params), centred

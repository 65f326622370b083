"""What every round of an MP-DP comparison run shares (spec bidirectional.md §6, §8, §9): the method, its noise
multipliers in units of the sensitivity S, its clipping and its hardening."""

from __future__ import annotations

import math
from dataclasses import dataclass

METHODS = ("mpdp", "mpdp_naive", "mp_cdp", "fedavg", "tp_smc")
CLIP_MODES = ("perturbed_joint", "none", "oracle_true")
NOISE_FAMILIES = ("dn", "gaussian_conditional")


@dataclass(frozen=True)
class RoundSettings:
    """What every round of a run shares. Noise multipliers are in units of the sensitivity S."""

    method: str
    lr: float
    S: float = 1.0  # the sensitivity (B, or 2B under replace adjacency)
    clip: float = 1.0  # B
    clip_mode: str = "perturbed_joint"
    sigma_eta: float = 0.0
    sigma_delta: float = math.inf
    sigma_naive: float = 0.0
    sigma_cdp: float = 0.0
    graph: str = "complete"
    n: int | None = None
    mask_scale: float = 1.0
    run_id: bytes = b"dpfl-mpdp"
    mask_corrections: bool = False  # W2 hardening: pairwise zero-sum masks on Ψ_k, Φ_k (stream 2)
    sigma_mask: float | None = None  # their std; None: 1e3 S
    noise_family: str = "dn"  # or gaussian_conditional (W1 hardening)
    delta: float = 1e-5  # for the conditional audit
    dropout_policy: str = "abort"  # or secagg_recovery (Shamir-shared keys, recovery.py)
    recovery_threshold: int | None = None  # None: floor(K/2) + 1

    def __post_init__(self) -> None:
        if self.noise_family not in NOISE_FAMILIES:
            raise ValueError(f"noise_family must be one of {NOISE_FAMILIES}, got {self.noise_family!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.clip_mode not in CLIP_MODES:
            raise ValueError(f"clip_mode must be one of {CLIP_MODES}, got {self.clip_mode!r}")

    @property
    def ddp_family(self) -> str:
        """The law of the DDP noise draws: 'dn' (uniform, spec §5) or 'gaussian' (gaussian_conditional)."""
        return "dn" if self.noise_family == "dn" else "gaussian"

    @property
    def mask_std(self) -> float:
        """The std of the correction masks (mask_corrections)."""
        return self.sigma_mask if self.sigma_mask is not None else 1e3 * self.S

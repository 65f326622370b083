"""Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with Adaptive Clipping",
NeurIPS 2021): the clip norm follows a target quantile of the norms it clips, privately.

Each release t clips m contributions (client updates, or one client's DP-SGD records) to C_t. Besides the noised sum
of the clipped contributions, it releases the noised fraction of contributions whose norm is at most C_t,

    b~_t = (sum_i (1[||x_i|| <= C_t] - 1/2) + N(0, sigma_b^2)) / m + 1/2,

the indicators centred at 1/2 so that adding or removing one contribution moves the released sum by 1/2 even when
the number of contributions is not public (Poisson sampling; tensorflow_privacy's QuantileEstimatorQuery does the
same); with exactly m contributions this is (sum_i 1[||x_i|| <= C_t] + N(0, sigma_b^2)) / m,

and moves the clip geometrically towards the target quantile gamma with learning rate eta (the paper's eq. 3):

    C_{t+1} = C_t * exp(-eta * (b~_t - gamma)).

Theorem 1 of the paper: releasing the count with noise sigma_b and the sum with noise multiplier z_Delta is the same
Gaussian mechanism as releasing the sum alone with noise multiplier z, where

    z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)

(the count's indicators, centred at 1/2, have sensitivity 1/2). So the accountant keeps charging the planned z and the
sum is noised with z_Delta > z; a sigma_b with 2 sigma_b <= z leaves the sum no budget and is refused.
`m` is the expected number of contributions (the expected cohort, or the expected batch size under Poisson sampling),
never the realised one, so that sigma_b / m does not reveal who took part. The clip stays positive (a geometric step
never reaches 0), so the sum's sensitivity is C_t in round t, whatever the trajectory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["COUNT_NOISE_KEY", "AdaptiveClipping", "next_clip", "update_noise_multiplier"]

COUNT_NOISE_KEY = "privacy.adaptive_clipping.count_noise"  # the config key of sigma_b, which its refusals name


@dataclass(frozen=True)
class AdaptiveClipping:
    """The adaptive clip's settings (the anchors' defaults: gamma 0.5, eta 0.2, initial clip 0.1).

    `count_noise`: sigma_b, the std of the count's noise; None: expected contributions per release / 20.
    """

    target_quantile: float = 0.5
    learning_rate: float = 0.2
    initial_clip: float = 0.1
    count_noise: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.target_quantile <= 1.0:
            raise ValueError(f"adaptive clipping: target_quantile must be in [0, 1], got {self.target_quantile}")
        if not self.learning_rate >= 0.0:
            raise ValueError(f"adaptive clipping: learning_rate must be >= 0, got {self.learning_rate}")
        if not self.initial_clip > 0.0:
            raise ValueError(f"adaptive clipping: initial_clip must be > 0, got {self.initial_clip}")
        if self.count_noise is not None and not self.count_noise > 0.0:
            raise ValueError(f"adaptive clipping: count_noise must be > 0, got {self.count_noise}")

    def sigma_b(self, expected: float) -> float:
        """The count's noise std for `expected` contributions per release (the default: expected / 20)."""
        if self.count_noise is not None:
            return self.count_noise
        if not expected > 0:
            raise ValueError(f"adaptive clipping needs a positive expected number of contributions, got {expected}")
        return expected / 20.0


def update_noise_multiplier(z: float, sigma_b: float) -> float:
    """Theorem 1: the sum's noise multiplier z_Delta when the count takes noise `sigma_b` out of the planned `z`.

    z = 0 (no noise: a non-private run) gives 0. A `sigma_b` that leaves the sum no budget (2 sigma_b <= z) raises.
    """
    if z < 0 or sigma_b <= 0:
        raise ValueError(f"adaptive clipping needs z >= 0 and sigma_b > 0, got z={z}, sigma_b={sigma_b}")
    if z == 0:
        return 0.0
    rest = z ** -2 - (2.0 * sigma_b) ** -2
    if not rest > 0:
        raise ValueError(f"adaptive clipping: the count's noise sigma_b={sigma_b:g} leaves the update no budget at "
                         f"noise multiplier z={z:g} (needs 2 sigma_b > z, i.e. sigma_b > {z / 2:g}); raise "
                         "count_noise or the noise multiplier")
    return rest ** -0.5


def next_clip(clip: float, noised_fraction: float, target_quantile: float, learning_rate: float) -> float:
    """The paper's geometric update: C exp(-eta (b~ - gamma)) from the noised fraction b~ of unclipped norms."""
    return clip * math.exp(-learning_rate * (noised_fraction - target_quantile))

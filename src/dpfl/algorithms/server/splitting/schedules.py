"""Step-size schedules eta_t and ergodic averaging (operator_splitting.md §6).

eta_t is the prox step for prox presets and the local learning rate for gradient presets. Diminishing steps
are what turns FedProx/FedRP's biased fixed point into a solution of the original problem (with ergodic
averaging, convex f_i, full participation), so they are part of the method, not a tuning nicety.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SCHEDULES: tuple[str, ...] = ("constant", "inv_t", "inv_sqrt", "inv_log", "inv_log_e", "exp_halving")


@dataclass(frozen=True)
class StepSchedule:
    """eta_t for round t = 0, 1, 2, ...; `period` is exp_halving's T (the paper: 500 for LS/LR, 10 for the CNN)."""

    eta0: float
    name: str = "constant"
    period: int = 500

    def __post_init__(self) -> None:
        if self.name not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.name!r}")
        if isinstance(self.eta0, bool) or not isinstance(self.eta0, (int, float)) or not self.eta0 > 0:
            raise ValueError(f"eta must be a number > 0 (inf: the local minimiser), got {self.eta0!r}")
        if isinstance(self.period, bool) or not isinstance(self.period, int) or self.period < 1:
            raise ValueError(f"the exp_halving period must be an integer >= 1, got {self.period!r}")

    def __call__(self, t: int) -> float:
        if t < 0:
            raise ValueError(f"round must be >= 0, got {t}")
        e = float(self.eta0)
        if self.name == "constant":
            return e
        if self.name == "inv_t":
            return e / (t + 1)
        if self.name == "inv_sqrt":
            return e / math.sqrt(t + 1)
        if self.name == "inv_log":  # base 10, as the convex reference code
            return e / (math.log10(t + 1) + 1)
        if self.name == "inv_log_e":  # the nonconvex reference code
            return e / math.log(t + math.e)
        return e / 2 ** (t // self.period)


class ErgodicAverage:
    """thetabar^t = sum_{s<=t} eta_s xbar^s / sum_{s<=t} eta_s, kept incrementally (one extra model of memory)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.mean: torch.Tensor | None = None

    def add(self, x: torch.Tensor, eta: float) -> torch.Tensor:
        if not eta > 0 or not math.isfinite(eta):
            raise ValueError(f"ergodic averaging needs a finite step > 0, got {eta}")
        self.total += eta
        if self.mean is None:
            self.mean = x.clone()
        else:
            self.mean += (eta / self.total) * (x - self.mean)
        return self.mean

    def state_dict(self, *, clone: bool = True) -> dict:
        """`clone=False` shares the mean (for an owner that drops this average)."""
        mean = self.mean.clone() if clone and self.mean is not None else self.mean
        return {"total": self.total, "mean": mean}

    @classmethod
    def from_state(cls, state: dict | None) -> ErgodicAverage:
        """An average at `state_dict()` output (None: empty); the mean is cloned since `add` updates it in place."""
        average = cls()
        average.load_state_dict(state)
        return average

    def load_state_dict(self, state: dict | None) -> None:
        self.total = 0.0 if state is None else float(state["total"])
        self.mean = None if state is None or state["mean"] is None else state["mean"].clone()

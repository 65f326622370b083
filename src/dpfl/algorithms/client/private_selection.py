"""A client's private choice of a cluster model (clustered_dpfl.md §5.4): the exponential mechanism by Gumbel-max.

Client i scores every cluster model m (its training accuracy in percent, sensitivity Delta_i = 100 / (N_i - 1): removing
one of N_i records moves an accuracy in percent by at most that), adds independent Gumbel(0, 2 Delta_i / eps_sel)
noise and reports the argmax. That is exactly the exponential mechanism Pr[m] ∝ exp(eps_sel s(m) / (2 Delta_i)),
eps_sel-DP and (eps_sel^2 / 8)-zCDP (`dpfl.privacy.two_stage.selection_event`).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["accuracy_sensitivity", "gumbel_scale", "select", "selection_probabilities"]


def accuracy_sensitivity(n_records: int) -> float:
    """Delta_i of a training accuracy in percent on N_i records (the reference code's 100 / (N_i - 1))."""
    if isinstance(n_records, bool) or not isinstance(n_records, (int, np.integer)) or n_records < 2:
        raise ValueError(f"a private selection needs a client with >= 2 records, got {n_records!r}")
    return 100.0 / (int(n_records) - 1)


def gumbel_scale(sensitivity: float, eps_sel: float) -> float:
    """The Gumbel scale 2 Delta / eps_sel that makes Gumbel-max the exponential mechanism with parameter eps_sel."""
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"the score sensitivity must be a finite number > 0, got {sensitivity!r}")
    if not (math.isfinite(eps_sel) and eps_sel > 0):
        raise ValueError(f"eps_sel must be a finite number > 0, got {eps_sel!r}")
    return 2.0 * sensitivity / eps_sel


def select(scores: np.ndarray, sensitivity: float, eps_sel: float, rng: np.random.Generator) -> int:
    """The private argmax of `scores` (one per cluster model)."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or not np.isfinite(s).all():
        raise ValueError(f"scores must be a non-empty vector of finite numbers, got {scores!r}")
    return int(np.argmax(s + rng.gumbel(0.0, gumbel_scale(sensitivity, eps_sel), size=s.size)))


def selection_probabilities(scores: np.ndarray, sensitivity: float, eps_sel: float) -> np.ndarray:
    """softmax(eps_sel s / (2 Delta)): what `select` draws from (for tests and reports)."""
    logits = np.asarray(scores, dtype=np.float64) / gumbel_scale(sensitivity, eps_sel)
    p = np.exp(logits - logits.max())
    return p / p.sum()

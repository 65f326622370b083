"""A client's private choice of a cluster model (clustered_dpfl.md §5.4): the exponential mechanism by Gumbel-max.

Client i scores every cluster model m on its own training set, adds independent Gumbel(0, 2 Delta_i / eps_sel) noise
and reports the argmax. That is exactly the exponential mechanism Pr[m] ∝ exp(eps_sel s(m) / (2 Delta_i)), eps_sel-DP
and (eps_sel^2 / 8)-zCDP (`dpfl.privacy.two_stage.selection_event`). Scores:
- `accuracy` (default, the reference code's): training accuracy in percent; removing one of N_i records moves it by at
  most Delta_i = 100 / (N_i - 1);
- `neg_clipped_loss` (the thesis text's loss): minus the mean per-sample loss clipped to L_max, which removing one
  record moves by at most L_max / (N_i - 1) (the spec writes L_max / N_i, the replace-one bound; dpfl's accounting is
  add/remove, so it uses the larger value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dpfl.engine import params as P

__all__ = ["SCORES", "ModelChoice", "accuracy_sensitivity", "answer", "gumbel_scale", "select",
           "selection_probabilities"]

SCORES: tuple[str, ...] = ("accuracy", "neg_clipped_loss")


@dataclass(frozen=True)
class ModelChoice:
    """The server's question after a round: every client in `clients` scores the stacked `models` [M, ...] on its own
    training data and privately reports the best (exponential mechanism with parameter `eps_sel`)."""

    clients: tuple[int, ...]
    models: P.Params
    eps_sel: float
    score: str = "accuracy"
    loss_cap: float | None = None  # L_max of neg_clipped_loss

    def __post_init__(self) -> None:
        if self.score not in SCORES:
            raise ValueError(f"the selection score must be one of {', '.join(SCORES)}, got {self.score!r}")
        if self.score == "neg_clipped_loss" and not (self.loss_cap is not None and math.isfinite(self.loss_cap)
                                                      and self.loss_cap > 0):
            raise ValueError(f"neg_clipped_loss needs a finite loss cap L_max > 0, got {self.loss_cap!r}")

    def sensitivity(self, n_records: int) -> float:
        base = accuracy_sensitivity(n_records)  # 100 / (N_i - 1), validates N_i
        return base if self.score == "accuracy" else base / 100.0 * float(self.loss_cap)  # type: ignore[arg-type]


@torch.no_grad()
def answer(choice: ModelChoice, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str,
           rng: np.random.Generator, batch_size: int = 2048) -> int:
    """One client's private pick among `choice.models`, scored on its training data (x, y); the model in eval mode."""
    from torch.func import functional_call

    from dpfl.engine.losses import per_sample_loss

    loss_fn = per_sample_loss(loss)
    count = next(iter(choice.models.values())).shape[0]
    scores = np.zeros(count)
    for m in range(count):
        params = {n: t[m] for n, t in choice.models.items()}
        total = 0.0
        for lo in range(0, len(x), batch_size):
            out = functional_call(model, params, (x[lo: lo + batch_size],))
            yb = y[lo: lo + batch_size]
            if choice.score == "accuracy":
                total += float((out.argmax(-1) == yb).sum())
            else:
                total += float(loss_fn(out, yb).clamp(max=choice.loss_cap).sum())
        scores[m] = 100.0 * total / len(x) if choice.score == "accuracy" else -total / len(x)
    return select(scores, choice.sensitivity(len(x)), choice.eps_sel, rng)


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

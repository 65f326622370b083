"""Why a private run's test loss can explode while its accuracy holds: the released model's confidence.

Noise added every round accumulates in the weights, and a ReLU network's logits grow with its weights (it is
positively homogeneous in each layer's), so after many noisy rounds the model can be almost certain of every answer:
a right prediction costs ~0 nats, a wrong one hundreds. The mean test loss then measures the logits' scale, not the
ranking that accuracy measures, and two runs can order one way by accuracy and the other by loss.

`confidence(run_dir)` splits the test loss into right and wrong predictions and reports the loss of the same
predictions at a fitted temperature (logits / T, T fitted on one half of the test set, the loss read on the other
half, so it is not fitted to what it reports): the loss the ranking would have at a sane scale. Accuracy does not
change with T. It reads the run's final model (checkpoint.pt) and its test set, as `dpfl attack mia` does.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar

from dpfl.evaluate.released import released_model
from dpfl.results.formatting import or_na

LOG_T_BOUNDS = (-5.0, 12.0)  # T from 0.007 to 160,000: logits of a few hundred need T in the hundreds


def _norm(params: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in params.values()))


def confidence(run_dir: str | Path, seed: int = 0) -> dict[str, Any]:
    """The released model's test loss taken apart (see the module docstring); `seed` splits the test set in two
    halves (T fitted on one, its loss read on the other)."""
    released = released_model(run_dir)
    if released.loss not in ("cross_entropy", "nll"):
        raise ValueError(f"{run_dir}: the model's loss is {released.loss!r}; confidence needs a classifier's "
                         "log-probabilities (cross_entropy or nll)")
    x, y = released.nonmembers()
    with torch.no_grad():
        scores = released.predict(x).double()  # logits, or log-probabilities (nll): softmax(z / T) either way
    y = torch.as_tensor(y).long()
    if len(y) < 2:
        raise ValueError(f"{run_dir}: the test set has {len(y)} record(s); confidence fits a temperature on one half "
                         "and reads the loss on the other, so it needs at least 2")
    loss = F.cross_entropy(scores, y, reduction="none")
    right = scores.argmax(1) == y
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    fit, held = order[: len(y) // 2], order[len(y) // 2:]

    def held_loss(t: float, ids: torch.Tensor = held) -> float:
        return float(F.cross_entropy(scores[ids] / t, y[ids]))

    log_t = minimize_scalar(lambda s: held_loss(math.exp(s), fit), bounds=LOG_T_BOUNDS, method="bounded").x
    top2 = scores.topk(2, dim=1).values
    worst = torch.sort(loss, descending=True).values
    init = {name: p.detach() for name, p in released.model.named_parameters()}  # build_model(seed): the run's start
    wrong = ~right
    return {
        "run": str(run_dir), "name": released.cfg.name, "n_test": len(y),
        "accuracy": float(right.double().mean()),
        "loss": float(loss.mean()),
        "median_loss": abs(float(loss.median())),  # a loss of -0.0 (an exact hit) would print as "-0"
        "loss_right": float(loss[right].mean()) if right.any() else None,
        "loss_wrong": float(loss[wrong].mean()) if wrong.any() else None,
        "worst_tenth_share": float(worst[: max(1, len(y) // 10)].sum() / loss.sum()) if loss.sum() > 0 else 0.0,
        "median_margin": float((top2[:, 0] - top2[:, 1]).median()),
        "temperature": math.exp(log_t),
        "held_out_loss": held_loss(1.0),
        "held_out_loss_at_temperature": held_loss(math.exp(log_t)),
        "param_norm": _norm(released.params),
        "param_norm_at_init": _norm(init),
    }


def format_confidence(rows: list[dict[str, Any]]) -> str:
    """One block of lines per run, the numbers a reader compares across runs."""
    lines = []
    for r in rows:
        lines += [f"{r['name']} ({r['run']}):",
                  f"  test accuracy {r['accuracy']:.4f}, loss {r['loss']:.4g} (median {r['median_loss']:.3g}; right "
                  f"predictions {or_na(r['loss_right'], '.3g')}, wrong {or_na(r['loss_wrong'], '.4g')}; "
                  f"the worst tenth {r['worst_tenth_share']:.0%} of it)",
                  f"  median top-2 margin {r['median_margin']:.4g}; parameter norm {r['param_norm']:.4g} "
                  f"(at initialisation {r['param_norm_at_init']:.4g})",
                  f"  temperature {r['temperature']:.4g} (fitted on half the test set): the other half's loss "
                  f"{r['held_out_loss']:.4g} -> {r['held_out_loss_at_temperature']:.4g} (accuracy unchanged)"]
    return "\n".join(lines)

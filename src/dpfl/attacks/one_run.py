"""The one-run privacy audit bound of Steinke, Nasr and Jagielski (2023, "Privacy Auditing with One (1) Training
Run", arXiv 2305.08846, Theorem 5.2): an empirical LOWER bound on epsilon from guesses about canaries.

m canaries are each included in the training with probability 1/2, independently. After one run the auditor
guesses "in" for the k highest-scoring canaries and "out" for the k lowest, and counts its correct guesses v out of
r = 2k. If the mechanism were (ε, δ)-DP with respect to each canary, then

    P[V >= v] <= β + 2 m δ max_{1<=i<=v} (P[B >= v - i] - β) / i,   β = P[B >= v],   B ~ Binomial(r, e^ε / (1 + e^ε)),

so every ε whose p-value is below the significance level is refuted, and the largest such ε is the lower bound,
at the stated confidence. The guess counts k are a fixed grid that depends only on m, and the significance is
split over the grid (Bonferroni), so taking the best k is part of the test, not a look at the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit
from scipy.stats import binom

GUESS_FRACTIONS = (0.05, 0.1, 0.25, 0.5)  # k / m: the grid of guess counts (each side), fixed in advance


def p_value(m: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """Theorem 5.2's bound on P[at least `correct` of `guesses` right] under an (epsilon, delta)-DP claim."""
    if not 0 <= correct <= guesses <= m:
        raise ValueError(f"need 0 <= correct <= guesses <= m, got {correct}, {guesses}, {m}")
    q = float(expit(epsilon))
    beta = float(binom.sf(correct - 1, guesses, q))
    if delta == 0 or correct == 0:
        return beta
    i = np.arange(1, correct + 1)
    alpha = float(np.max((binom.sf(correct - i - 1, guesses, q) - beta) / i))
    return min(1.0, beta + 2 * m * delta * alpha)


def epsilon_for(m: int, guesses: int, correct: int, delta: float, significance: float) -> float:
    """The largest epsilon the guesses refute at `significance` (0 if they refute none)."""
    if guesses == 0 or p_value(m, guesses, correct, 0.0, delta) > significance:
        return 0.0
    hi = 1.0
    while p_value(m, guesses, correct, hi, delta) <= significance:  # p -> 1 as epsilon grows: this ends
        hi *= 2
    return float(brentq(lambda e: p_value(m, guesses, correct, e, delta) - significance, 0.0, hi, xtol=1e-6))


@dataclass(frozen=True)
class AuditBound:
    epsilon_lower_bound: float
    confidence: float
    canaries: int
    guesses: int  # r = 2k at the best k
    correct: int
    delta: float

    def to_dict(self) -> dict[str, float | int]:
        return dict(epsilon_lower_bound=self.epsilon_lower_bound, confidence=self.confidence, canaries=self.canaries,
                    guesses=self.guesses, correct=self.correct, delta=self.delta)


def guess_counts(m: int) -> list[int]:
    """k for each fraction of the fixed grid (at least 1, at most m // 2), without repeats."""
    return sorted({min(m // 2, max(1, round(f * m))) for f in GUESS_FRACTIONS})


def lower_bound(scores: np.ndarray, included: np.ndarray, delta: float, confidence: float = 0.95) -> AuditBound:
    """The one-run bound from canary scores (higher = more likely included) and the true inclusion bits."""
    scores, included = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    m = len(scores)
    if m < 2 or included.shape != scores.shape:
        raise ValueError(f"need at least 2 canaries with one inclusion bit each, got {m} scores and "
                         f"{included.shape[0] if included.ndim else 0} bits")
    if not np.isfinite(scores).all():
        raise ValueError("canary scores must be finite")
    if not 0 < confidence < 1 or not 0 <= delta < 1:
        raise ValueError(f"need confidence in (0, 1) and delta in [0, 1), got {confidence}, {delta}")
    order = np.argsort(-scores, kind="stable")
    ks = guess_counts(m)
    significance = (1 - confidence) / len(ks)
    best = AuditBound(0.0, confidence, m, 0, 0, delta)
    for k in ks:
        correct = int(included[order[:k]].sum() + (~included[order[m - k:]]).sum())
        eps = epsilon_for(m, 2 * k, correct, delta, significance)
        if eps > best.epsilon_lower_bound or best.guesses == 0:
            best = AuditBound(eps, confidence, m, 2 * k, correct, delta)
    return best

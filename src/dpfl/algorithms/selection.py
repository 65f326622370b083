"""Client selection: who takes part in a round. The choice is part of the mechanism.

For client-level guarantees the selection is the sampling the accountant must model, so each kind
also builds its sampled Gaussian event: Poisson rate q -> Poisson sampled Gaussian (add/remove);
fixed K without replacement -> sampled without replacement (replace-one); all -> plain Gaussian.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from dp_accounting import DpEvent

from dpfl.privacy.events import sampled_gaussian_event
from dpfl.seeding import Purpose, numpy_generator

SelectionKind = Literal["all", "fixed", "poisson"]


@dataclass(frozen=True)
class Selection:
    """`all` clients, a `fixed` number `k` uniformly without replacement, or `poisson` with `rate`.

    Only clients still within budget are candidates (eligible-by-budget): the runner passes them in.
    """

    kind: SelectionKind = "all"
    k: int | None = None
    rate: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("all", "fixed", "poisson"):
            raise ValueError(f"selection kind must be 'all', 'fixed' or 'poisson', got {self.kind!r}")
        if self.kind == "fixed" and (self.k is None or self.k < 1):
            raise ValueError(f"fixed selection needs k >= 1, got {self.k}")
        if self.kind == "poisson" and (self.rate is None or not 0 < self.rate <= 1):
            raise ValueError(f"poisson selection needs a rate in (0, 1], got {self.rate}")

    def select(self, candidates: np.ndarray, seed: int, round_: int, attempt: int = 0) -> np.ndarray:
        """Sorted ids of the clients selected among `candidates` (from the round's own stream).

        `attempt` > 0 gives an independent re-draw of the same round (PFA re-draws a round until it
        contains a public client); attempt 0 is the round's first draw.
        """
        rng = numpy_generator(seed, Purpose.SELECTION, round_, attempt)
        candidates = np.asarray(candidates, dtype=np.int64)
        if not bool(np.all(candidates[1:] >= candidates[:-1])):  # a run's eligible ids come sorted: one pass, no sort
            candidates = np.sort(candidates)
        if self.kind == "all":
            return candidates
        if self.kind == "fixed":
            assert self.k is not None
            if len(candidates) < self.k:
                raise ValueError(f"cannot select {self.k} clients from {len(candidates)} candidates")
            return np.sort(rng.choice(candidates, size=self.k, replace=False))
        assert self.rate is not None
        return candidates[rng.random(len(candidates)) < self.rate]

    def min_candidates(self) -> int:
        """Fewer eligible clients than this ends the run (PFA semantics for fixed K)."""
        return self.k if self.kind == "fixed" and self.k is not None else 1

    def participation_rate(self, population: int) -> float:
        """Probability that a given candidate takes part in a round."""
        if self.kind == "all":
            return 1.0
        if self.kind == "fixed":
            assert self.k is not None
            return min(1.0, self.k / population)
        assert self.rate is not None
        return self.rate

    def participation_rate_given(self, population: int, group: int, member: bool) -> float:
        """P(a candidate takes part | the sample contains one of `group` required candidates).

        A round re-drawn until it contains a member of a required group (PFA's public clients) has
        these participation rates, higher for the group's members; calibration must use them.
        """
        if not 1 <= group <= population:
            raise ValueError(f"the required group must have 1..{population} members, got {group}")
        if self.kind == "all":
            return 1.0
        if self.kind == "poisson":
            assert self.rate is not None
            q = self.rate
            return q / (1.0 - (1.0 - q) ** group) if member else q
        assert self.k is not None
        K, M = min(self.k, population), population
        total = math.comb(M, K)
        p_none = math.comb(M - group, K) / total  # no member of the group drawn
        if member:
            return (K / M) / (1.0 - p_none)
        p_with_none = math.comb(M - group - 1, K - 1) / total if M - group - 1 >= 0 else 0.0
        return (K / M - p_with_none) / (1.0 - p_none)

    def expected_count(self, population: int) -> float:
        return self.participation_rate(population) * population

    def client_level_event(self, noise_multiplier: float, population: int) -> DpEvent:
        """One round of a server-side Gaussian on the sum of clipped client updates, as selected here."""
        if self.kind == "all":
            return sampled_gaussian_event(noise_multiplier, sampling="full")
        if self.kind == "poisson":
            return sampled_gaussian_event(noise_multiplier, sampling="poisson", sample_rate=self.rate)
        assert self.k is not None
        return sampled_gaussian_event(noise_multiplier, sampling="fixed", population=population, sample_size=self.k)

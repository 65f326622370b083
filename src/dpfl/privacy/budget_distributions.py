"""The per-client budget distributions: generic ones, and those of PFA and Robust-HDP (spec heterogeneous_dp.md
section 3).

Each registers itself into ``BUDGET_DISTRIBUTIONS`` (``dpfl.privacy.budget_registry``, re-exported by
``dpfl.privacy.budgets``, which imports this module), so ``draw_budgets(name, n_clients, rng, **params)``
draws them; names are looked up exactly, then case-insensitively (``draw_budgets("mixgauss1", ...)`` is
``MixGauss1``). They are registered in this order: the generic ones, then the named ones in table order.

Generic: ``fixed`` (``value``), ``list`` (``values``, one per client, verbatim), ``uniform`` (U(``low``,
``high``)) and ``choice`` (``values`` with probabilities ``probs``).

PFA (Liu et al., PVLDB 2022, Table 1), section 3.1:

    Uniform         U(1, 10)                                             re-drawn until max > 9.0
    Gauss           N(3, 1)
    Pareto          0.5 * (1 + Lomax(1)): classical Pareto, scale 0.5, shape 1 (the authors' code); uncapped
    MixGauss1       0.9 N(0.1, 0.01) + 0.1 N(10, 0.1)                    re-drawn until max > 1.0
    MixGauss2       0.9 N(0.5, 0.01) + 0.1 N(10, 0.1)                    re-drawn until max > 1.0
    MixGauss3       0.9 N(1.0, 0.1)  + 0.1 N(10, 0.1)                    re-drawn until max > 2.0
    MixGauss3-code  0.9 N(1.0, 0.1)  + 0.1 N(10, 1.0)  (the code's file) re-drawn until max > 2.0
    MixGauss4       0.5 N(0.1, 0.01) + 0.4 N(1.0, 0.1) + 0.1 N(10, 1.0) re-drawn until max > 2.0 (dpfl)

Robust-HDP (thesis Table 3.3), section 3.2: ``Dist1`` .. ``Dist9`` (see ``RHDP_DISTRIBUTIONS``), no
re-draw. ``rhdp20`` (parameter ``dist``) gives the authors' fixed 20-client list ``RHDP_EPS20[dist]``.

Conventions: N(a, b) has standard deviation b (the PFA code). Each client picks its mixture component
independently. Every epsilon is clipped below at ``eps_floor`` (default ``EPS_FLOOR`` = 0.01); the only
parameters are ``eps_floor`` and, for Pareto, an optional ``pareto_cap`` (unset = uncapped). A re-drawn
distribution draws the WHOLE list again until at least one epsilon exceeds its threshold, and fails
after ``MAX_ATTEMPTS`` lists. All randomness comes from the numpy Generator passed in.

Batch sizes (section 3.4): ``draw_batch_sizes("hetero", n, rng)`` draws each b_i uniformly from
``HETERO_BATCH_SIZES`` = (16, 32, 64, 128); ``draw_batch_sizes("rhdp20", 20, rng)`` is ``RHDP_BATCH20``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Union

import numpy as np

from dpfl.privacy.budget_registry import register_budget_distribution

__all__ = [
    "BATCH_SIZE_KINDS",
    "EPS_FLOOR",
    "HETERO_BATCH_SIZES",
    "MAX_ATTEMPTS",
    "NAMED_DISTRIBUTIONS",
    "PFA_DISTRIBUTIONS",
    "RHDP_BATCH20",
    "RHDP_DISTRIBUTIONS",
    "RHDP_EPS20",
    "GaussianMixture",
    "LomaxPareto",
    "NamedDistribution",
    "UniformRange",
    "draw_batch_sizes",
    "rhdp_dist_name",
]

EPS_FLOOR = 0.01
MAX_ATTEMPTS = 1000


# ---- shapes -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GaussianMixture:
    """sum_k weights[k] N(means[k], stds[k]) -- stds are standard deviations; one component per client."""

    weights: tuple[float, ...]
    means: tuple[float, ...]
    stds: tuple[float, ...]

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if len(self.weights) == 1:
            return rng.normal(self.means[0], self.stds[0], size=n)
        comp = rng.choice(len(self.weights), size=n, p=np.asarray(self.weights))
        return rng.normal(np.asarray(self.means)[comp], np.asarray(self.stds)[comp])

    @property
    def mean(self) -> float:
        return math.fsum(w * m for w, m in zip(self.weights, self.means, strict=True))


@dataclasses.dataclass(frozen=True)
class UniformRange:
    """U(low, high)."""

    low: float
    high: float

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(self.low, self.high, size=n)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2


@dataclasses.dataclass(frozen=True)
class LomaxPareto:
    """scale * (1 + Lomax(shape)) = classical Pareto(scale, shape) (numpy's ``pareto`` is the Lomax)."""

    scale: float
    shape: float

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.scale * (1.0 + rng.pareto(self.shape, size=n))

    @property
    def mean(self) -> float:
        return self.scale * self.shape / (self.shape - 1) if self.shape > 1 else math.inf


Shape = Union[GaussianMixture, UniformRange, LomaxPareto]


@dataclasses.dataclass(frozen=True)
class NamedDistribution:
    """A named budget distribution: its shape, the re-draw threshold (None = no re-draw) and its source."""

    shape: Shape
    threshold: float | None
    source: str


def _mix(*components: tuple[float, float, float]) -> GaussianMixture:
    """Components as (weight, mean, std)."""
    w, m, s = zip(*components, strict=True)
    return GaussianMixture(tuple(w), tuple(m), tuple(s))


_PFA = "PFA Table 1"
_RHDP = "RHDP thesis Table 3.3"
PFA_DISTRIBUTIONS: dict[str, NamedDistribution] = {
    "Uniform": NamedDistribution(UniformRange(1.0, 10.0), 9.0, _PFA),
    "Gauss": NamedDistribution(_mix((1.0, 3.0, 1.0)), None, _PFA),
    "Pareto": NamedDistribution(LomaxPareto(0.5, 1.0), None, "PFA code (not given in the paper)"),
    "MixGauss1": NamedDistribution(_mix((0.9, 0.1, 0.01), (0.1, 10.0, 0.1)), 1.0, _PFA),
    "MixGauss2": NamedDistribution(_mix((0.9, 0.5, 0.01), (0.1, 10.0, 0.1)), 1.0, _PFA),
    "MixGauss3": NamedDistribution(_mix((0.9, 1.0, 0.1), (0.1, 10.0, 0.1)), 2.0, _PFA),
    "MixGauss4": NamedDistribution(_mix((0.5, 0.1, 0.01), (0.4, 1.0, 0.1), (0.1, 10.0, 1.0)), 2.0, _PFA),
    "MixGauss3-code": NamedDistribution(_mix((0.9, 1.0, 0.1), (0.1, 10.0, 1.0)), 2.0, "PFA code's MixGauss3 file"),
}
RHDP_DISTRIBUTIONS: dict[str, NamedDistribution] = {
    "Dist1": NamedDistribution(_mix((1.0, 2.0, 1.0)), None, _RHDP),
    "Dist2": NamedDistribution(_mix((0.2, 0.2, 0.01), (0.6, 1.0, 0.1), (0.2, 5.0, 1.0)), None, _RHDP),
    "Dist3": NamedDistribution(UniformRange(0.2, 5.0), None, _RHDP),
    "Dist4": NamedDistribution(_mix((0.2, 0.2, 0.01), (0.6, 0.5, 0.1), (0.2, 2.0, 1.0)), None, _RHDP),
    "Dist5": NamedDistribution(UniformRange(0.2, 2.0), None, _RHDP),
    "Dist6": NamedDistribution(_mix((0.3, 0.2, 0.01), (0.5, 0.5, 0.1), (0.2, 1.0, 0.1)), None, _RHDP),
    "Dist7": NamedDistribution(UniformRange(0.2, 1.0), None, _RHDP),
    "Dist8": NamedDistribution(_mix((0.6, 0.2, 0.01), (0.4, 0.5, 0.1)), None, _RHDP),
    "Dist9": NamedDistribution(UniformRange(0.2, 0.5), None, _RHDP),
}
NAMED_DISTRIBUTIONS: dict[str, NamedDistribution] = {**PFA_DISTRIBUTIONS, **RHDP_DISTRIBUTIONS}


# ---- the RHDP code's fixed 20-client lists (utils/privacy_params.py, num_clients == 20), verbatim --------

RHDP_EPS20: dict[str, tuple[float, ...]] = {
    "Dist1": (2.81, 1.69, 1.74, 1.46, 2.43, 0.85, 2.87, 1.62, 2.16, 1.88,
              2.73, 0.97, 1.84, 1.81, 2.57, 1.45, 1.91, 1.56, 2.02, 2.29),
    "Dist2": (5.45, 1.0, 1.15, 0.2, 4.52, 4.88, 0.98, 0.2, 1.05, 0.93,
              1.0, 0.21, 0.21, 1.27, 0.89, 1.17, 0.96, 0.89, 1.04, 0.84),
    "Dist3": (2.2, 3.66, 0.2, 1.65, 0.9, 0.64, 1.09, 1.86, 2.1, 2.79,
              2.21, 3.49, 1.18, 4.41, 0.33, 3.42, 2.2, 2.88, 0.87, 1.15),
    "Dist4": (0.57, 0.66, 0.42, 3.97, 3.27, 0.45, 0.55, 2.58, 1.82, 0.64,
              0.19, 2.38, 0.34, 0.44, 0.47, 0.5, 0.56, 0.51, 0.68, 0.19),
    "Dist5": (0.95, 1.5, 0.2, 0.74, 0.46, 0.37, 0.54, 0.82, 0.91, 1.17,
              0.95, 1.43, 0.57, 1.78, 0.25, 1.41, 0.95, 1.21, 0.45, 0.56),
    "Dist6": (0.5, 0.46, 0.39, 0.44, 0.21, 0.36, 0.19, 0.51, 1.12, 0.2,
              0.49, 0.19, 0.19, 0.2, 0.2, 0.18, 0.61, 0.15, 0.38, 0.53),
    "Dist7": (0.26, 0.82, 0.55, 0.78, 0.98, 0.63, 0.6, 0.26, 0.41, 0.6,
              0.74, 0.84, 0.5, 0.25, 0.43, 0.93, 0.37, 0.56, 0.94, 0.22),
    "Dist8": (0.2, 0.2, 0.19, 0.44, 0.21, 0.19, 0.19, 0.51, 0.62, 0.2,
              0.2, 0.19, 0.19, 0.2, 0.2, 0.18, 0.61, 0.17, 0.38, 0.53),
    "Dist9": (0.45, 0.25, 0.22, 0.31, 0.28, 0.36, 0.29, 0.29, 0.23, 0.27,
              0.48, 0.28, 0.42, 0.46, 0.44, 0.26, 0.25, 0.21, 0.21, 0.26),
}
RHDP_BATCH20: tuple[int, ...] = (32, 64, 16, 32, 16, 16, 16, 32, 32, 64, 32, 64, 16, 128, 16, 64, 32, 64, 16, 16)
HETERO_BATCH_SIZES: tuple[int, ...] = (16, 32, 64, 128)
BATCH_SIZE_KINDS: tuple[str, ...] = ("hetero", "rhdp20")


# ---- sampling -----------------------------------------------------------------------------------------


def _positive_finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0.0 < float(value) < math.inf):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@register_budget_distribution("fixed")
def _fixed(n_clients: int, rng: np.random.Generator, *, value: float) -> np.ndarray:
    """Every client gets ``value``."""
    return np.full(n_clients, _positive_finite("value", value))


@register_budget_distribution("list")
def _list(n_clients: int, rng: np.random.Generator, *, values: Sequence[float]) -> np.ndarray:
    """Client i gets ``values[i]`` (verbatim; length must be n_clients)."""
    vals = [_positive_finite(f"values[{i}]", v) for i, v in enumerate(values)]
    if len(vals) != n_clients:
        raise ValueError(f"values has {len(vals)} entries, expected n_clients={n_clients}")
    return np.asarray(vals, dtype=np.float64)


@register_budget_distribution("uniform")
def _uniform(n_clients: int, rng: np.random.Generator, *, low: float, high: float) -> np.ndarray:
    """Independent U(low, high) draws, 0 < low <= high."""
    lo, hi = _positive_finite("low", low), _positive_finite("high", high)
    if lo > hi:
        raise ValueError(f"low must be <= high, got low={lo}, high={hi}")
    return rng.uniform(lo, hi, size=n_clients)


@register_budget_distribution("choice")
def _choice(
    n_clients: int, rng: np.random.Generator, *, values: Sequence[float], probs: Sequence[float] | None = None
) -> np.ndarray:
    """Independent draws from ``values`` with probabilities ``probs`` (uniform if None)."""
    vals = np.asarray([_positive_finite(f"values[{i}]", v) for i, v in enumerate(values)])
    if vals.size == 0:
        raise ValueError("values must not be empty")
    p = None
    if probs is not None:
        p = np.asarray(probs, dtype=np.float64)
        if p.shape != vals.shape or np.any(~np.isfinite(p)) or np.any(p < 0) or abs(p.sum() - 1.0) > 1e-9:
            raise ValueError(f"probs must be {vals.size} non-negative numbers summing to 1, got {list(probs)}")
    return rng.choice(vals, size=n_clients, p=p)


def _redraw_until_above(draw: Callable[[], np.ndarray], threshold: float, name: str, n_clients: int,
                        max_attempts: int = MAX_ATTEMPTS) -> np.ndarray:
    """``draw()`` again (the whole list) until some epsilon is > threshold; ValueError after max_attempts."""
    for _ in range(max_attempts):
        eps = draw()
        if eps.max() > threshold:
            return eps
    raise ValueError(
        f"{name}: no epsilon above its threshold {threshold} in {max_attempts} draws of {n_clients} client(s); "
        f"the re-draw guarantees at least one high-budget client (spec heterogeneous_dp.md 3.1)")


def _sampler(name: str, dist: NamedDistribution) -> Callable[..., np.ndarray]:
    def sample(n_clients: int, rng: np.random.Generator, *, eps_floor: float = EPS_FLOOR) -> np.ndarray:
        floor = _positive_finite("eps_floor", eps_floor)

        def draw() -> np.ndarray:
            return np.maximum(dist.shape.sample(n_clients, rng), floor)

        return draw() if dist.threshold is None else _redraw_until_above(draw, dist.threshold, name, n_clients)

    sample.__name__ = sample.__qualname__ = f"sample_{name.replace('-', '_')}"
    sample.__doc__ = f"{name} ({dist.source}): {dist.shape}, re-draw threshold {dist.threshold}."
    return sample


def _pareto(n_clients: int, rng: np.random.Generator, *, eps_floor: float = EPS_FLOOR,
            pareto_cap: float | None = None) -> np.ndarray:
    """PFA's Pareto: 0.5 * (1 + Lomax(1)), floored at eps_floor; capped at pareto_cap when given (default: not)."""
    floor = _positive_finite("eps_floor", eps_floor)
    eps = np.maximum(PFA_DISTRIBUTIONS["Pareto"].shape.sample(n_clients, rng), floor)
    if pareto_cap is not None:
        cap = _positive_finite("pareto_cap", pareto_cap)
        if cap < floor:
            raise ValueError(f"pareto_cap must be >= eps_floor ({floor}), got {cap}")
        eps = np.minimum(eps, cap)
    return eps


for _name, _dist in NAMED_DISTRIBUTIONS.items():  # registered in table order
    register_budget_distribution(_name)(_pareto if _name == "Pareto" else _sampler(_name, _dist))


def rhdp_dist_name(dist: str) -> str:
    """'dist5' -> 'Dist5' (case-insensitive); ValueError naming Dist1..Dist9 otherwise."""
    for name in RHDP_EPS20:
        if isinstance(dist, str) and dist.casefold() == name.casefold():
            return name
    raise ValueError(f"dist must be one of {', '.join(RHDP_EPS20)}, got {dist!r}")


@register_budget_distribution("rhdp20")
def _rhdp20(n_clients: int, rng: np.random.Generator, *, dist: str) -> np.ndarray:
    """The RHDP code's fixed list RHDP_EPS20[dist] (20 clients; other counts: sample ``dist`` itself)."""
    name = rhdp_dist_name(dist)
    if n_clients != len(RHDP_EPS20[name]):
        raise ValueError(f"rhdp20 lists have 20 clients; for {n_clients} clients use distribution {name} (sampled)")
    return np.asarray(RHDP_EPS20[name], dtype=np.float64)


def draw_batch_sizes(kind: str, n_clients: int, rng: np.random.Generator) -> list[int]:
    """Per-client batch sizes: ``hetero`` (each uniform from HETERO_BATCH_SIZES) or ``rhdp20`` (RHDP_BATCH20).

    ``hetero`` draws exactly as ``rng.choice(HETERO_BATCH_SIZES, size=n_clients)``.
    """
    if isinstance(n_clients, bool) or not isinstance(n_clients, numbers.Integral) or n_clients < 1:
        raise ValueError(f"n_clients must be an integer >= 1, got {n_clients!r}")
    key = kind.casefold() if isinstance(kind, str) else kind
    if key == "hetero":
        return [int(b) for b in rng.choice(np.asarray(HETERO_BATCH_SIZES), size=int(n_clients))]
    if key == "rhdp20":
        if n_clients != len(RHDP_BATCH20):
            raise ValueError(f"the rhdp20 batch-size list has 20 clients, got n_clients={n_clients}")
        return list(RHDP_BATCH20)
    raise ValueError(f"batch-size kind must be one of {', '.join(BATCH_SIZE_KINDS)}, got {kind!r}")

"""Per-client privacy budgets: the (epsilon, delta) each client is promised, and how to draw them.

Budgets are first class in dpfl (each client has its own). ``draw_budgets`` turns a named
distribution into one epsilon per client from an explicit generator, so budgets are reproducible
from the run seed. Distributions live in the ``BUDGET_DISTRIBUTIONS`` registry: adding one is one
decorated function. Generic ones are here (fixed, list, uniform, choice); the PFA and Robust-HDP ones
(Uniform, Gauss, Pareto, MixGauss1..4, MixGauss3-code, Dist1..Dist9, rhdp20; spec heterogeneous_dp.md
section 3) are in ``dpfl.privacy.budget_distributions`` and registered when this module is imported.

Names are matched exactly first, then case-insensitively when that is unambiguous: ``mixgauss1`` is
``MixGauss1``, but ``uniform`` (U(low, high)) and ``Uniform`` (PFA's U(1, 10) with its re-draw) are two
distributions, so ``UNIFORM`` is refused.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "BUDGET_DISTRIBUTIONS",
    "ClientBudget",
    "budget_distribution_name",
    "draw_budgets",
    "register_budget_distribution",
]

BudgetSampler = Callable[..., np.ndarray]
BUDGET_DISTRIBUTIONS: dict[str, BudgetSampler] = {}


@dataclasses.dataclass(frozen=True)
class ClientBudget:
    """One client's target guarantee: epsilon > 0 (inf = unlimited) and delta in (0, 1)."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        eps, delta = self.epsilon, self.delta
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not float(eps) > 0.0:
            raise ValueError(f"epsilon must be a number > 0 (inf for unlimited), got {eps!r}")
        if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not (0.0 < float(delta) < 1.0):
            raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
        object.__setattr__(self, "epsilon", float(eps))
        object.__setattr__(self, "delta", float(delta))


def register_budget_distribution(name: str) -> Callable[[BudgetSampler], BudgetSampler]:
    """Register ``fn(n_clients, rng, **params) -> array of n_clients epsilons`` under ``name``."""

    def deco(fn: BudgetSampler) -> BudgetSampler:
        if name in BUDGET_DISTRIBUTIONS:
            raise ValueError(f"budget distribution {name!r} is already registered")
        BUDGET_DISTRIBUTIONS[name] = fn
        return fn

    return deco


def _positive_finite(name: str, value: Any) -> float:
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


def budget_distribution_name(kind: str) -> str:
    """The registered name for ``kind``: exact match, else the unique case-insensitive match; ValueError otherwise."""
    if isinstance(kind, str):
        if kind in BUDGET_DISTRIBUTIONS:
            return kind
        matches = [name for name in BUDGET_DISTRIBUTIONS if name.casefold() == kind.casefold()]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise ValueError(f"kind {kind!r} is ambiguous: write it as one of {matches} (names differing only "
                             "in case are different distributions)")
    raise ValueError(f"kind must be one of {list(BUDGET_DISTRIBUTIONS)}, got {kind!r}")


def draw_budgets(kind: str, n_clients: int, rng: np.random.Generator, **params: Any) -> np.ndarray:
    """One epsilon per client (float64 array of length ``n_clients``) from a registered distribution.

    ``kind`` is looked up by ``budget_distribution_name`` (exact, then case-insensitive).
    """
    kind = budget_distribution_name(kind)
    sampler = BUDGET_DISTRIBUTIONS[kind]
    if isinstance(n_clients, bool) or not isinstance(n_clients, numbers.Integral) or n_clients < 1:
        raise ValueError(f"n_clients must be an integer >= 1, got {n_clients!r}")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator (see dpfl.seeding), got {type(rng).__name__}")
    try:
        eps = np.asarray(sampler(int(n_clients), rng, **params), dtype=np.float64)
    except TypeError as err:  # wrong or missing parameters for this distribution
        raise ValueError(f"bad parameters for budget distribution {kind!r}: {err}") from err
    if eps.shape != (n_clients,) or not np.all(np.isfinite(eps)) or not np.all(eps > 0):
        raise ValueError(f"budget distribution {kind!r} must give {n_clients} finite epsilons > 0")
    return eps


# The PFA / Robust-HDP distributions register themselves (after the registry and helpers above exist).
from dpfl.privacy import budget_distributions as _budget_distributions  # noqa: E402,F401

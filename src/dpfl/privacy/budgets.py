"""Per-client privacy budgets: the (epsilon, delta) each client is promised, and how to draw them.

Budgets are first class in dpfl (each client has its own). ``draw_budgets`` turns a named
distribution into one epsilon per client from an explicit generator, so budgets are reproducible
from the run seed. Distributions live in the ``BUDGET_DISTRIBUTIONS`` registry (``budget_registry``):
adding one is one decorated function (``register_budget_distribution``). The built-in ones, generic
(fixed, list, uniform, choice) and those of PFA and Robust-HDP (Uniform, Gauss, Pareto, MixGauss1..4,
MixGauss3-code, Dist1..Dist9, rhdp20; spec heterogeneous_dp.md section 3), are in
``dpfl.privacy.budget_distributions``, imported here so the registry is complete whenever this module is.

Names are matched exactly first, then case-insensitively when that is unambiguous: ``mixgauss1`` is
``MixGauss1``, but ``uniform`` (U(low, high)) and ``Uniform`` (PFA's U(1, 10) with its re-draw) are two
distributions, so ``UNIFORM`` is refused.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import numpy as np

from dpfl.privacy import budget_distributions as _budget_distributions  # noqa: F401  (registers the built-ins)
from dpfl.privacy.budget_registry import (
    BUDGET_DISTRIBUTIONS,
    BudgetSampler,
    budget_distribution_name,
    register_budget_distribution,
)

__all__ = [
    "BUDGET_DISTRIBUTIONS",
    "BudgetSampler",
    "ClientBudget",
    "budget_distribution_name",
    "draw_budgets",
    "register_budget_distribution",
]


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

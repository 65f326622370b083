"""The registry of per-client budget distributions: name -> ``sampler(n_clients, rng, **params)``.

A module of its own, importing nothing from dpfl, so that the distributions (``budget_distributions``)
register into it and the drawing code (``budgets``) reads from it without either importing the other
half-initialised. ``dpfl.privacy.budgets`` re-exports these names; import them from there.

Names are matched exactly first, then case-insensitively when that is unambiguous: ``mixgauss1`` is
``MixGauss1``, but ``uniform`` (U(low, high)) and ``Uniform`` (PFA's U(1, 10) with its re-draw) are two
distributions, so ``UNIFORM`` is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["BUDGET_DISTRIBUTIONS", "BudgetSampler", "budget_distribution_name", "register_budget_distribution"]

BudgetSampler = Callable[..., np.ndarray]
BUDGET_DISTRIBUTIONS: dict[str, BudgetSampler] = {}


def register_budget_distribution(name: str) -> Callable[[BudgetSampler], BudgetSampler]:
    """Register ``fn(n_clients, rng, **params) -> array of n_clients epsilons`` under ``name``."""

    def deco(fn: BudgetSampler) -> BudgetSampler:
        if name in BUDGET_DISTRIBUTIONS:
            raise ValueError(f"budget distribution {name!r} is already registered")
        BUDGET_DISTRIBUTIONS[name] = fn
        return fn

    return deco


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

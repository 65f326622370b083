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
from collections.abc import Iterator, Sequence
from typing import Any, overload

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
    "Budgets",
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


def _checked(epsilon: float, delta: float) -> ClientBudget:
    """A ClientBudget of values Budgets has checked already (its own check is 10 us, a million clients 10 s)."""
    budget = object.__new__(ClientBudget)
    object.__setattr__(budget, "epsilon", epsilon)
    object.__setattr__(budget, "delta", delta)
    return budget


class Budgets(Sequence[ClientBudget]):
    """One ClientBudget per client, held as two float64 arrays (16 bytes a client), each ClientBudget made on
    access: a population of millions holds no Python object per client. Equal to any sequence of the same
    ClientBudgets; `epsilons` and `deltas` are the arrays (read-only)."""

    def __init__(self, epsilons: Sequence[float] | np.ndarray, deltas: Sequence[float] | np.ndarray | float) -> None:
        eps = np.array(epsilons, dtype=np.float64).reshape(-1)
        delta = (np.full(len(eps), float(deltas)) if np.ndim(deltas) == 0
                 else np.array(deltas, dtype=np.float64).reshape(-1))
        if len(delta) != len(eps):
            raise ValueError(f"{len(eps)} epsilons but {len(delta)} deltas")
        bad = np.flatnonzero(~(eps > 0.0) | ~((delta > 0.0) & (delta < 1.0)))
        if len(bad):  # ClientBudget's own check names the first bad value
            ClientBudget(float(eps[bad[0]]), float(delta[bad[0]]))
        eps.flags.writeable = delta.flags.writeable = False
        self.epsilons, self.deltas = eps, delta

    @classmethod
    def of(cls, budgets: ClientBudget | Sequence[ClientBudget], n: int | None = None) -> Budgets:
        """`budgets` as Budgets: a sequence of ClientBudget (of length `n` if given), or one ClientBudget for `n`."""
        if isinstance(budgets, Budgets):
            out = budgets
        elif isinstance(budgets, ClientBudget):
            if n is None:
                raise ValueError("one ClientBudget for everyone needs the number of clients")
            return cls(np.full(n, budgets.epsilon), budgets.delta)
        else:
            items = list(budgets)
            for b in items:
                if not isinstance(b, ClientBudget):
                    raise ValueError(f"budgets must be ClientBudget objects, got {type(b).__name__}")
            out = cls([b.epsilon for b in items], [b.delta for b in items])
        if n is not None and len(out) != n:
            raise ValueError(f"budgets has {len(out)} entries for {n} clients")
        return out

    def __len__(self) -> int:
        return len(self.epsilons)

    @overload
    def __getitem__(self, i: int) -> ClientBudget: ...
    @overload
    def __getitem__(self, i: slice | np.ndarray) -> Budgets: ...

    def __getitem__(self, i: int | slice | np.ndarray) -> ClientBudget | Budgets:
        """One client's budget, or (a slice, an index array) the budgets of those clients."""
        if isinstance(i, (slice, np.ndarray)):
            return Budgets(self.epsilons[i], self.deltas[i])
        return _checked(float(self.epsilons[i]), float(self.deltas[i]))

    def __iter__(self) -> Iterator[ClientBudget]:
        return (_checked(e, d) for e, d in zip(self.epsilons.tolist(), self.deltas.tolist(), strict=True))

    def tolist(self) -> list[ClientBudget]:
        return list(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Budgets):
            return bool(np.array_equal(self.epsilons, other.epsilons) and np.array_equal(self.deltas, other.deltas))
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (mutable-looking sequence, like a list)

    def __repr__(self) -> str:
        if len(self) > 1000:
            return f"Budgets(<{len(self)} clients>)"
        return f"Budgets(epsilons={self.epsilons.tolist()!r}, deltas={self.deltas.tolist()!r})"


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

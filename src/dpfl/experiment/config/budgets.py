"""Per-client privacy budgets: a number, a list, or a named distribution drawn with the run seed.

The distribution models (`BUDGET_DISTRIBUTION_MODELS`) are validated here; the draw itself happens when
the run is built (`dpfl.experiment.build`, `dpfl.privacy.budget_distributions`). Names are matched
case-insensitively except where two differ only in case (`uniform` is U(low, high), `Uniform` is PFA's
U(1, 10) with its re-draw).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from dpfl.experiment.config.base import _check_probs, _is_number, _Section, _too_big
from dpfl.experiment.config.errors import _fail
from dpfl.privacy.budget_distributions import EPS_FLOOR, NAMED_DISTRIBUTIONS, RHDP_EPS20


class UniformBudgets(_Section):
    """epsilon_i ~ U(low, high), independently per client (PFA's U(1, 10) with its re-draw is `Uniform`)."""

    distribution: Literal["uniform"]
    low: float = Field(gt=0)
    high: float = Field(gt=0)

    @model_validator(mode="before")
    @classmethod
    def _bounds_given(cls, v: Any) -> Any:
        if isinstance(v, dict) and "low" not in v and "high" not in v:
            _fail("low", "required field is missing (distribution 'uniform' is U(low, high); PFA's U(1, 10) "
                  "with its re-draw is distribution 'Uniform')", ..., "low and high: numbers > 0")
        return v

    @model_validator(mode="after")
    def _ordered(self) -> UniformBudgets:
        if self.low > self.high:
            _fail("high", f"must be >= low ({self.low})", self.high, f">= {self.low}")
        return self


class ChoiceBudgets(_Section):
    """epsilon_i drawn from `values` with probabilities `probs` (uniform if null), independently per client."""

    distribution: Literal["choice"]
    values: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)
    probs: list[Annotated[float, Field(ge=0)]] | None = None

    @model_validator(mode="after")
    def _probs(self) -> ChoiceBudgets:
        _check_probs(self.probs, self.values)
        return self


class FixedBudgets(_Section):
    """Every client gets `epsilon`."""

    distribution: Literal["fixed"]
    epsilon: float = Field(gt=0)


_SAMPLED_NAMES = tuple(name for name in NAMED_DISTRIBUTIONS if name != "Pareto")


class NamedBudgets(_Section):
    """A named distribution of PFA (Uniform, Gauss, MixGauss1..4, MixGauss3-code) or Robust-HDP (Dist1..Dist9).

    Drawn with the run seed (`dpfl.privacy.budget_distributions`, spec heterogeneous_dp.md 3.1-3.2): N(a, b)
    with b a standard deviation, one mixture component per client, Uniform and the MixGauss re-drawn until
    some epsilon exceeds their threshold, every epsilon clipped below at `eps_floor`.
    """

    distribution: Literal[_SAMPLED_NAMES]  # type: ignore[valid-type]
    eps_floor: float = Field(EPS_FLOOR, gt=0)


class ParetoBudgets(_Section):
    """PFA's Pareto: 0.5 * (1 + Lomax(1)), clipped below at `eps_floor`; uncapped unless `pareto_cap` is given."""

    distribution: Literal["Pareto"]
    eps_floor: float = Field(EPS_FLOOR, gt=0)
    pareto_cap: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _cap_above_floor(self) -> ParetoBudgets:
        if self.pareto_cap is not None and self.pareto_cap < self.eps_floor:
            _fail("pareto_cap", f"must be >= eps_floor ({self.eps_floor})", self.pareto_cap,
                  f"null (uncapped) or a number >= {self.eps_floor}")
        return self


class Rhdp20Budgets(_Section):
    """The Robust-HDP code's fixed 20-client list `RHDP_EPS20[dist]` (data.clients must be 20)."""

    distribution: Literal["rhdp20"]
    dist: Literal[tuple(RHDP_EPS20)]  # type: ignore[valid-type]

    @field_validator("dist", mode="before")
    @classmethod
    def _dist_case(cls, v: Any) -> Any:
        if isinstance(v, str):
            return next((name for name in RHDP_EPS20 if name.casefold() == v.casefold()), v)
        return v


BUDGET_DISTRIBUTION_MODELS: dict[str, type[_Section]] = {
    "uniform": UniformBudgets, "choice": ChoiceBudgets, "fixed": FixedBudgets,
    **{name: ParetoBudgets if name == "Pareto" else NamedBudgets for name in NAMED_DISTRIBUTIONS},
    "rhdp20": Rhdp20Budgets,
}
Budgets = Union[float, list[float], UniformBudgets, ChoiceBudgets, FixedBudgets, NamedBudgets, ParetoBudgets,
                Rhdp20Budgets]
_BUDGETS_ALLOWED = ("a number > 0 (every client), a list of numbers (one per client) or {distribution: NAME, ...} "
                    "with NAME one of uniform, choice, fixed, Uniform, Gauss, Pareto, MixGauss1..4, MixGauss3-code, "
                    "Dist1..Dist9, rhdp20")


def _budget_distribution_name(kind: str) -> str | list[str] | None:
    """The model name for `kind`: exact, else the unique case-insensitive match; a list when ambiguous."""
    if kind in BUDGET_DISTRIBUTION_MODELS:
        return kind
    matches = [name for name in BUDGET_DISTRIBUTION_MODELS if name.casefold() == kind.casefold()]
    return matches[0] if len(matches) == 1 else matches or None


def _epsilon_ok(v: Any) -> bool:
    # inf = unlimited (needs an explicit noise multiplier); an integer beyond any float is not an epsilon
    return _is_number(v) and not _too_big(v) and v > 0 and not math.isnan(v)


def _has_unlimited(budgets: Any) -> bool:
    if isinstance(budgets, float):
        return math.isinf(budgets)
    if isinstance(budgets, list):
        return any(math.isinf(e) for e in budgets)
    return False


def _all_unlimited(budgets: Any) -> bool:
    """Every client unlimited: a noise shared by everyone has no finite budget to be calibrated to."""
    if isinstance(budgets, float):
        return math.isinf(budgets)
    if isinstance(budgets, list):
        return all(math.isinf(e) for e in budgets)
    return False

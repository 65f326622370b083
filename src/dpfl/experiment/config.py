"""One run's configuration: a YAML file, every field validated (pydantic v2), with `--set` overrides.

    cfg = load_config(Path("configs/demo.yaml"), ["training.rounds=5", "privacy.budgets=[1,2,4,8,8,8,8,8,8,8]"])
    print(config_to_yaml(cfg))        # the resolved config: every field, defaults and inferred values filled in

Every model forbids unknown fields, so a typo fails instead of being ignored. Every problem is a
`ConfigError` whose message is ONE line naming the field path, the problem, the value given and what
is allowed, e.g. ``training.selection.k: required when kind is 'fixed' (got null; allowed: an integer
in [1, data.clients])``.

The privacy section states the threat model the run claims (unit, observer, mechanism, sampling). When
left out these are filled in from the algorithm; when given they must agree with it. Budgets are a
number (every client), a list (one epsilon per client) or a named distribution drawn with the run seed
when the run is built (`dpfl.experiment.build`). Nothing here touches data, models or accountants.

Heterogeneous budgets and batch sizes of PFA and Robust-HDP (spec heterogeneous_dp.md section 3):

    privacy:
      budgets: {distribution: MixGauss1}          # or Uniform, Gauss, Pareto, MixGauss2..4, MixGauss3-code,
                                                  # Dist1..Dist9; optional eps_floor (default 0.01);
                                                  # Pareto also takes pareto_cap (default: uncapped)
      budgets: {distribution: rhdp20, dist: Dist5}  # the RHDP code's fixed list; needs data.clients: 20
    training:
      batch_size: hetero                          # each client uniform from {16, 32, 64, 128}, seeded
      batch_size: rhdp20                          # the RHDP code's 20-client list

Distribution names are matched case-insensitively (mixgauss1 -> MixGauss1) except where two names differ
only in case: `uniform` is U(low, high) and `Uniform` is PFA's U(1, 10) with its re-draw.
"""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from dpfl.data import DATASETS, dataset_options
from dpfl.models import MODELS, model_info
from dpfl.privacy.budget_distributions import (
    BATCH_SIZE_KINDS,
    EPS_FLOOR,
    HETERO_BATCH_SIZES,
    NAMED_DISTRIBUTIONS,
    RHDP_BATCH20,
    RHDP_EPS20,
)

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_MECHANISMS",
    "ALGORITHM_PARAMS",
    "BUDGET_DISTRIBUTION_MODELS",
    "MECHANISMS",
    "MECHANISM_OBSERVER",
    "MECHANISM_UNIT",
    "AlgorithmConfig",
    "BatchSizeChoice",
    "BatchSizeKind",
    "CheckpointConfig",
    "ChoiceBudgets",
    "ConfigError",
    "DataConfig",
    "EvaluationConfig",
    "FixedBudgets",
    "ModelConfig",
    "NamedBudgets",
    "OptimizerConfig",
    "ParetoBudgets",
    "PrivacyConfig",
    "Rhdp20Budgets",
    "RunConfig",
    "SelectionConfig",
    "TrainingConfig",
    "UniformBudgets",
    "apply_overrides",
    "config_to_dict",
    "config_to_yaml",
    "load_config",
    "parse_override",
    "parse_yaml",
    "validate_config",
]

# ---- vocabulary ---------------------------------------------------------------------------------------

ALGORITHMS: tuple[str, ...] = (
    "fedavg", "dp_fedavg_local", "dp_fedavg_central", "udp_fedavg", "noisy_fedavg", "noisy_fedprox", "fedprox",
    "weiavg", "min_eps", "max_eps", "oracle", "pfa", "pfa_plus", "robust_hdp", "fedceo", "ppsgd", "centaur",
)
MECHANISMS: tuple[str, ...] = ("dpsgd", "udp", "central", "param_noise", "none")

# Which privacy mechanisms each algorithm runs with; the first is the default when none is declared.
ALGORITHM_MECHANISMS: dict[str, tuple[str, ...]] = {
    "fedavg": ("none",),
    "dp_fedavg_local": ("dpsgd",),
    "dp_fedavg_central": ("central",),
    "udp_fedavg": ("udp",),
    "noisy_fedavg": ("param_noise",),
    "noisy_fedprox": ("param_noise",),
    "fedprox": ("none", "dpsgd"),
    "weiavg": ("dpsgd",),
    "min_eps": ("dpsgd",),
    "max_eps": ("dpsgd",),
    "oracle": ("dpsgd",),
    "pfa": ("dpsgd",),
    "pfa_plus": ("dpsgd",),
    "robust_hdp": ("dpsgd",),
    "fedceo": ("dpsgd", "udp"),
    "ppsgd": ("dpsgd", "udp"),
    "centaur": ("dpsgd", "udp"),
}
# What each mechanism protects, and from whom (the runner's Algorithm.unit / .observer, in config words).
MECHANISM_UNIT: dict[str, str] = {
    "dpsgd": "sample", "udp": "client", "central": "client", "param_noise": "sample", "none": "none",
}
MECHANISM_OBSERVER: dict[str, str] = {
    "dpsgd": "server", "udp": "server", "central": "aggregate", "param_noise": "server", "none": "none",
}
_OBSERVER_WHY = {
    "server": "the server sees every individual upload",
    "aggregate": "only the aggregate (global models) is protected; the server is trusted",
    "none": "the run is not private",
}
_NEEDS_CLIP = ("dpsgd", "udp", "central", "param_noise")
_NOISY = ("noisy_fedavg", "noisy_fedprox")  # Noisy-FedAvg/FedProx: f-DP accounted (spec fdp_accounting.md)
_FDP_FIELDS = ("secure_aggregation", "release", "smoothness_L", "honest_clients")
_NEEDS_BUDGETS = ("dpsgd", "udp", "central")
_CALIBRATED = ("dpsgd", "central")  # mechanisms whose noise can be calibrated from the budgets

DatasetName = Literal[DATASETS]  # type: ignore[valid-type]
ModelName = Literal[tuple(MODELS)]  # type: ignore[valid-type]
AlgorithmName = Literal[ALGORITHMS]  # type: ignore[valid-type]
Mechanism = Literal[MECHANISMS]  # type: ignore[valid-type]


# ---- errors -------------------------------------------------------------------------------------------


class ConfigError(ValueError):
    """A config problem, as ONE line: ``<field.path>: <problem> (got <value>; allowed: <...>)``.

    ``path`` is the dotted field path ("config" for the document itself, the file name for I/O problems).
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        line = " ".join(str(message).splitlines())
        super().__init__(line)
        self.path = path


_ERROR_TYPE = "dpfl_config"


def _show(value: Any, limit: int = 80) -> str:
    """A short, single-line rendering of a value, in YAML words for null/true/false."""
    if value is None:
        text = "null"
    elif value is True or value is False:
        text = "true" if value else "false"
    elif isinstance(value, BaseModel):
        text = repr(value.model_dump())
    else:
        try:
            text = repr(value)
        except Exception:  # noqa: BLE001 - an exotic object must never break the error message
            text = f"<{type(value).__name__}>"
    text = " ".join(text.splitlines())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(field: str, problem: str, got: Any = ..., allowed: str | None = None, more: int = 0) -> NoReturn:
    """Raise a validation error for `field` (a dotted path relative to where the validator runs)."""
    raise PydanticCustomError(
        _ERROR_TYPE,
        "{problem}",
        {"problem": problem, "field": field, "got": None if got is ... else _show(got), "allowed": allowed,
         "more": more},
    )


_TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "a string",
    "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
    "model_attributes_type": "a mapping", "none_required": "null",
}
_BOUNDS = {"greater_than": ("gt", "> {}"), "greater_than_equal": ("ge", ">= {}"),
           "less_than": ("lt", "< {}"), "less_than_equal": ("le", "<= {}")}


def _model_at(root: type[BaseModel] | None, loc: Sequence[Any]) -> type[BaseModel] | None:
    """The model class reached by following field names `loc` from `root` (None if not a model)."""
    cur: Any = root
    for key in loc:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)) or key not in cur.model_fields:
            return None
        models = [m for m in _models_in(cur.model_fields[key].annotation)]
        cur = models[0] if len(models) == 1 else None
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _models_in(annotation: Any) -> Iterable[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType, Annotated):
        for arg in typing.get_args(annotation):
            yield from _models_in(arg)


def _interval(root: type[BaseModel] | None, loc: Sequence[Any]) -> str | None:
    """A field's full numeric range, e.g. "(0, 1)" or ">= 1", from its declared bounds (None if unknown)."""
    parent = _model_at(root, loc[:-1]) if loc else None
    field = parent.model_fields.get(loc[-1]) if parent is not None else None
    if field is None:
        return None
    b: dict[str, Any] = {}
    for m in field.metadata:
        for key in ("gt", "ge", "lt", "le"):
            if getattr(m, key, None) is not None:
                b[key] = getattr(m, key)
    low = ("(", b["gt"]) if "gt" in b else ("[", b["ge"]) if "ge" in b else None
    high = (b["lt"], ")") if "lt" in b else (b["le"], "]") if "le" in b else None
    if low and high:
        return f"{low[0]}{low[1]}, {high[0]}{high[1]}"
    if low:
        return f"{'>' if low[0] == '(' else '>='} {low[1]}"
    if high:
        return f"{'<' if high[1] == ')' else '<='} {high[0]}"
    return None


def _first(errors: list[Any]) -> Any:
    """The error to report: an unknown field first (often the typo behind a 'missing' one), else the first."""
    return next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])


def _describe(err: Mapping[str, Any], root: type[BaseModel] | None) -> tuple[list[str], str, str | None, str | None, int]:
    """(path, problem, got, allowed, more) for one pydantic error dict."""
    loc = [str(p) for p in err.get("loc", ())]
    typ = err.get("type", "")
    ctx = err.get("ctx") or {}
    raw = err.get("input", None)
    got: str | None = _show(raw)
    allowed: str | None = None
    if typ == _ERROR_TYPE:
        field = ctx.get("field") or ""
        return loc + [p for p in field.split(".") if p], str(ctx.get("problem")), ctx.get("got"), \
            ctx.get("allowed"), int(ctx.get("more") or 0)
    if typ == "missing":
        return loc, "required field is missing", None, None, 0
    if typ == "extra_forbidden":
        parent = _model_at(root, err.get("loc", ())[:-1])
        names = list(parent.model_fields) if parent is not None else []
        close = difflib.get_close_matches(loc[-1] if loc else "", names, n=1)
        problem = "unknown field" + (f", did you mean {close[0]!r}?" if close else "")
        return loc, problem, got, ", ".join(names) or None, 0
    if typ == "literal_error":
        return loc, "not an allowed value", got, str(ctx.get("expected")), 0
    if typ in _BOUNDS:
        key, fmt = _BOUNDS[typ]
        return loc, "out of range", got, _interval(root, err.get("loc", ())) or fmt.format(ctx.get(key)), 0
    if typ in _TYPE_WORDS:
        if typ == "float_type" and isinstance(raw, str) and _looks_like_float(raw):
            return loc, "a number written as text (YAML 1.1 reads 1e-5 as text: load with dpfl's parse_yaml or " \
                "write 1.0e-5)", got, "a number", 0
        return loc, "wrong type", got, _TYPE_WORDS[typ], 0
    if typ in ("too_short", "too_long"):
        bound = f"at least {ctx.get('min_length')}" if typ == "too_short" else f"at most {ctx.get('max_length')}"
        return loc, "wrong length", got, f"{bound} item(s)", 0
    if typ == "string_pattern_mismatch":
        return loc, "invalid format", got, f"text matching {ctx.get('pattern')}", 0
    msg = str(err.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return loc, msg[:1].lower() + msg[1:], got, allowed, 0


def _looks_like_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _segment(name: str) -> str:
    """A path segment as written, or quoted when it holds spaces or control characters."""
    return name if name and name.isprintable() and not any(c.isspace() for c in name) else repr(name)


def _line(path: Sequence[str], problem: str, got: str | None, allowed: str | None, more: int = 0) -> str:
    parts = [f"got {got}"] if got is not None else []
    if allowed:
        parts.append(f"allowed: {allowed}")
    text = f"{'.'.join(map(_segment, path)) or 'config'}: {problem}"
    if parts:
        text += f" ({'; '.join(parts)})"
    if more:
        text += f" (+{more} more)"
    return text


def _config_error(exc: ValidationError, root: type[BaseModel]) -> ConfigError:
    errors = exc.errors(include_url=False)
    if not errors:
        return ConfigError(f"config: {exc}", "config")
    path, problem, got, allowed, more = _describe(_first(errors), root)
    return ConfigError(_line(path, problem, got, allowed, more + len(errors) - 1),
                       ".".join(map(_segment, path)) or "config")


def _sub_validate(model: type[BaseModel], value: Any, field: str = "") -> Any:
    """Validate `value` as `model`; an error is re-raised with its path under `field` (for plain validators)."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        path, problem, got, allowed, more = _describe(_first(errors), model)
        raise PydanticCustomError(
            _ERROR_TYPE,
            "{problem}",
            {"problem": problem, "field": ".".join([field, *path]).strip("."), "got": got, "allowed": allowed,
             "more": more + len(errors) - 1},
        ) from None


# ---- sections -----------------------------------------------------------------------------------------


class _Section(BaseModel):
    """Strict (no silent type coercion), no unknown fields, no NaN/inf unless a field says so."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, revalidate_instances="always")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_probs(probs: list[float] | None, values: list[Any]) -> None:
    if probs is None:
        return
    if len(probs) != len(values):
        _fail("probs", f"needs one probability per value ({len(values)})", probs, "non-negative numbers summing to 1")
    if abs(math.fsum(probs) - 1.0) > 1e-9:
        _fail("probs", "probabilities must sum to 1", probs, "non-negative numbers summing to 1")


class DataConfig(_Section):
    """Which dataset and how it is split among clients (`dpfl.data.federated_dataset`).

    partition: iid; shards; dirichlet (each class split among clients by Dir(alpha)); dirichlet_quota (each
    client draws class proportions from Dir(alpha) and fills `samples_per_client` samples, default all / clients;
    spec fdp_accounting.md §8).
    """

    dataset: DatasetName
    root: str | None = None
    clients: int = Field(ge=1)
    partition: Literal["iid", "shards", "dirichlet", "dirichlet_quota"] = "iid"
    alpha: float = Field(0.5, gt=0)
    samples_per_client: int | None = Field(None, ge=1)
    shards_per_client: int = Field(2, ge=1)
    max_train_samples: int | None = Field(None, ge=1)
    client_test_fraction: float = Field(0.0, ge=0, lt=1)
    client_val_fraction: float = Field(0.0, ge=0, lt=1)
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _options_known(self) -> DataConfig:
        if self.samples_per_client is not None and self.partition != "dirichlet_quota":
            _fail("samples_per_client", "only used by partition 'dirichlet_quota'", self.samples_per_client, "null")
        if self.client_test_fraction + self.client_val_fraction >= 1:
            _fail("client_val_fraction", "the test and validation splits must leave training data",
                  self.client_val_fraction, f"a fraction below 1 - client_test_fraction = {1 - self.client_test_fraction:g}")
        allowed = dataset_options(self.dataset)
        for key in self.options:
            if key == "seed":
                _fail("options.seed", "the dataset seed is the run's top-level seed; set `seed` instead",
                      self.options[key], ", ".join(a for a in allowed if a != "seed") or "none")
            if key not in allowed:
                _fail(f"options.{key}", f"unknown option for dataset {self.dataset!r}", self.options[key],
                      ", ".join(a for a in allowed if a != "seed") or "none")
        return self


class ModelConfig(_Section):
    """A registered model (`dpfl.models.MODELS`) and its builder options (`model_info(name).options` + init)."""

    name: ModelName
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _options_known(self) -> ModelConfig:
        info = model_info(self.name)
        allowed = [*info.options, "init"]
        for key, value in self.options.items():
            if key not in allowed:
                _fail(f"options.{key}", f"unknown option for model {self.name!r}", value, ", ".join(allowed))
        if "init" in self.options and self.options["init"] not in info.inits:
            _fail("options.init", f"unknown init scheme for model {self.name!r}", self.options["init"],
                  ", ".join(info.inits))
        return self


class OptimizerConfig(_Section):
    """Local SGD: learning rate and heavy-ball momentum."""

    lr: float = Field(gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)


class SelectionConfig(_Section):
    """Who takes part in a round: `all`, a `fixed` number `k` (without replacement) or `poisson` with `rate`."""

    kind: Literal["all", "fixed", "poisson"] = "all"
    k: int | None = Field(None, ge=1)
    rate: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _fields_match_kind(self) -> SelectionConfig:
        if self.kind == "fixed" and self.k is None:
            _fail("k", "required when kind is 'fixed'", None, "an integer in [1, data.clients]")
        if self.kind == "poisson" and self.rate is None:
            _fail("rate", "required when kind is 'poisson'", None, "a number in (0, 1]")
        if self.kind != "fixed" and self.k is not None:
            _fail("k", f"only used when kind is 'fixed' (kind is {self.kind!r})", self.k, "null")
        if self.kind != "poisson" and self.rate is not None:
            _fail("rate", f"only used when kind is 'poisson' (kind is {self.kind!r})", self.rate, "null")
        return self


class BatchSizeChoice(_Section):
    """Per-client batch sizes drawn (seeded) from `values`, with probabilities `probs` (uniform if null)."""

    distribution: Literal["choice"]
    values: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    probs: list[Annotated[float, Field(ge=0)]] | None = None

    @model_validator(mode="after")
    def _probs(self) -> BatchSizeChoice:
        _check_probs(self.probs, self.values)
        return self


_BATCH_ALLOWED = ("an integer >= 1, a list of integers (one per client), hetero (each client uniform from "
                  f"{{{', '.join(map(str, HETERO_BATCH_SIZES))}}}), rhdp20 (the RHDP 20-client list), full (each "
                  "client's whole training set: full-batch GD) or {distribution: choice, values: [...]}")
_BATCH_STRINGS = (*BATCH_SIZE_KINDS, "full")  # full: every client's whole training set each step (full-batch GD)
BatchSizeKind = Literal[_BATCH_STRINGS]  # type: ignore[valid-type]


class TrainingConfig(_Section):
    """Rounds, the local program's length (local_steps XOR local_epochs), batch sizes, optimizer, selection.

    batch_size: an integer (every client); a list (one per client); ``hetero`` (each client's size drawn
    uniformly from {16, 32, 64, 128} with the run seed, spec heterogeneous_dp.md 3.4); ``rhdp20`` (the
    RHDP code's 20-client list, data.clients must be 20); ``full`` (each client's whole training set, i.e.
    full-batch gradient descent); or {distribution: choice, values, probs}.
    ``hetero`` draws exactly what {distribution: choice, values: [16, 32, 64, 128]} draws.
    """

    rounds: int = Field(ge=1)
    local_steps: int | None = Field(None, ge=1)
    local_epochs: float | None = Field(None, gt=0)
    batch_size: int | list[int] | BatchSizeKind | BatchSizeChoice
    optimizer: OptimizerConfig
    selection: SelectionConfig = Field(default_factory=SelectionConfig)

    @field_validator("batch_size", mode="plain")
    @classmethod
    def _batch_size(cls, v: Any) -> int | list[int] | str | BatchSizeChoice:
        if isinstance(v, BatchSizeChoice):
            v = v.model_dump()
        if isinstance(v, str):
            kind = next((k for k in _BATCH_STRINGS if k == v.casefold()), None)
            if kind is None:
                _fail("", "unknown batch-size list or distribution", v, _BATCH_ALLOWED)
            return kind
        if isinstance(v, bool) or not isinstance(v, (int, list, dict)):
            _fail("", "wrong type", v, _BATCH_ALLOWED)
        if isinstance(v, int):
            if v < 1:
                _fail("", "out of range", v, ">= 1")
            return v
        if isinstance(v, list):
            if not v:
                _fail("", "an empty list", v, "one integer >= 1 per client")
            for i, b in enumerate(v):
                if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                    _fail(str(i), "not a batch size", b, "an integer >= 1")
            return list(v)
        if v.get("distribution") != "choice":
            kind = v.get("distribution")
            hint = (f" (write training.batch_size: {kind.casefold()}, a plain string)"
                    if isinstance(kind, str) and kind.casefold() in BATCH_SIZE_KINDS else "")
            _fail("distribution", f"unknown batch-size distribution{hint}", kind,
                  "choice; or batch_size: " + " | ".join(BATCH_SIZE_KINDS))
        return _sub_validate(BatchSizeChoice, v)

    @field_serializer("batch_size")
    def _dump_batch_size(self, v: Any) -> Any:
        return v.model_dump() if isinstance(v, BaseModel) else v

    @model_validator(mode="after")
    def _one_length(self) -> TrainingConfig:
        if (self.local_steps is None) == (self.local_epochs is None):
            _fail("local_steps", "give exactly one of training.local_steps and training.local_epochs",
                  [self.local_steps, self.local_epochs], "local_steps: int >= 1 XOR local_epochs: number > 0")
        return self


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
    return _is_number(v) and v > 0 and not math.isnan(v)  # inf = unlimited (needs an explicit noise multiplier)


class MisreportConfig(_Section):
    """Falsified-budget scenario: `client` tells the server factor × its true epsilon (spec hdp §6)."""

    client: int = Field(0, ge=0)
    factor: float = Field(10.0, gt=0)


class PrivacyConfig(_Section):
    """The guarantee the run claims and how it is obtained.

    unit / observer / mechanism: left null, they are filled in from the algorithm; given, they must agree
    with it. sampling: the record sampling of DP-SGD. clip: the clipping norm (per sample for dpsgd, per
    update for udp and central). noise_multiplier: explicit, or null to calibrate it from the budgets.
    calibration: `accountant` (bisection, the default) or `pfa-heuristic` (PFA's formula; NOT a
    guarantee: the accountant's epsilon of the noise used is still what is reported). misreport: one
    client reports a false epsilon to the server. allow_budget_violation: required by max_eps, a
    non-private reference whose results are tagged meets_budgets: false. paper_eta_scaling (udp only): upload
    w_0 + η·(Δ̃ + ξ), FedCEO Algorithm 1's line 10 taken literally (post-processing: ε is unchanged).
    per_upload_amplification (udp with Poisson client selection only): account each upload as amplified by
    the client sampling, ASSUMING the server cannot tell who took part (FedCEO spec §7; labelled in privacy.json).

    Noisy-FedAvg/FedProx (mechanism param_noise; spec fdp_accounting.md §5) also take: secure_aggregation (the
    deployment hides individual uploads; dpfl simulates no cryptography, this only selects the default observer
    'aggregate'), release (transcript: every global model is seen, the default; final: only w_T, which admits the
    shifted-interpolation bound), smoothness_L (an ASSUMED smoothness constant of every per-sample loss; needed by
    the shifted-interpolation bound) and honest_clients (the adversary knows the noise of all other clients).
    observer 'server' is the upload view (each noisy upload seen), 'aggregate' the view of the averages only.
    """

    unit: Literal["sample", "client", "none"] | None = None
    observer: Literal["server", "aggregate", "none"] | None = None
    mechanism: Mechanism | None = None
    sampling: Literal["poisson", "fixed"] | None = None
    clip: float | None = Field(None, gt=0)
    noise_multiplier: float | None = Field(None, ge=0)
    budgets: Budgets | None = None
    delta: float = Field(1e-5, gt=0, lt=1)
    accountant: Literal["rdp", "pld"] = "rdp"
    calibration: Literal["accountant", "pfa-heuristic"] = "accountant"
    misreport: MisreportConfig | None = None
    allow_budget_violation: bool = False
    paper_eta_scaling: bool = False
    per_upload_amplification: bool = False
    secure_aggregation: bool = False
    release: Literal["transcript", "final"] = "transcript"
    smoothness_L: float | None = Field(None, gt=0)
    honest_clients: int | None = Field(None, ge=1)

    @field_validator("budgets", mode="plain")
    @classmethod
    def _budgets(cls, v: Any) -> Budgets | None:
        if isinstance(v, BaseModel):
            v = v.model_dump()
        if v is None:
            return None
        if _is_number(v):
            if not _epsilon_ok(v):
                _fail("", "an epsilon must be > 0 (.inf = unlimited)", v, "a number > 0")
            return float(v)
        if isinstance(v, list):
            if not v:
                _fail("", "an empty list", v, "one epsilon > 0 per client")
            for i, e in enumerate(v):
                if not _epsilon_ok(e):
                    _fail(str(i), "not an epsilon", e, "a number > 0 (.inf = unlimited)")
            return [float(e) for e in v]
        if isinstance(v, dict):
            if "distribution" not in v:
                _fail("distribution", "required field is missing", ..., ", ".join(BUDGET_DISTRIBUTION_MODELS))
            kind = v["distribution"]
            name = _budget_distribution_name(kind) if isinstance(kind, str) else None
            if isinstance(name, list):
                _fail("distribution", "ambiguous budget distribution: names differing only in case are different "
                      "distributions", kind, " or ".join(name))
            if name is None:
                _fail("distribution", "unknown budget distribution", kind, ", ".join(BUDGET_DISTRIBUTION_MODELS))
            return _sub_validate(BUDGET_DISTRIBUTION_MODELS[name], {**v, "distribution": name})
        _fail("", "wrong type", v, _BUDGETS_ALLOWED)

    @field_serializer("budgets")
    def _dump_budgets(self, v: Any) -> Any:
        return v.model_dump() if isinstance(v, BaseModel) else v

    @property
    def private(self) -> bool:
        return self.mechanism not in (None, "none")


class _FedAvgParams(_Section):
    weighting: Literal["uniform", "samples", "epsilon"] = "uniform"
    server_lr: float = Field(1.0, gt=0)


class _CentralParams(_Section):
    server_lr: float = Field(1.0, gt=0)


class _EpsTargetParams(_FedAvgParams):
    """min_eps / max_eps: everyone's noise calibrated to one epsilon: `observed` (the smallest / largest
    reported epsilon) or a number (PFA: 0.1 or 1.0 for Minimum, 10.0 for Maximum)."""

    epsilon: Literal["observed"] | float = "observed"

    @field_validator("epsilon")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        if v != "observed" and not v > 0:
            _fail("", "must be > 0", v, "'observed' or a number > 0")
        return v


class _NoisyParams(_Section):
    """Noisy-FedAvg (spec fdp_accounting.md §1.1): K clipped local steps (clip norm privacy.clip, per example or
    on the batch mean), N(0, std²) on every uploaded parameter, a plain mean. Step sizes η_{k,t} from the base
    rate training.optimizer.lr: constant η, cyclic η/(k+1), stagewise η/(t+1), continuous η/(tK+k+1), or
    custom `step_sizes` ([rounds][local_steps]). batch_sampling: shuffled epochs or a fresh uniform subset per
    step (both independent of the data; no sampling amplification is claimed)."""

    std: float = Field(gt=0)
    schedule: Literal["constant", "cyclic", "stagewise", "continuous", "custom"] = "constant"
    step_sizes: list[list[Annotated[float, Field(gt=0)]]] | None = None
    clip_mode: Literal["per_example", "batch"] = "per_example"
    batch_sampling: Literal["shuffle", "fixed"] = "shuffle"

    @model_validator(mode="after")
    def _custom_steps(self) -> _NoisyParams:
        if (self.schedule == "custom") != (self.step_sizes is not None):
            _fail("step_sizes", "give step_sizes exactly when schedule is 'custom'", self.step_sizes,
                  "a [rounds][local_steps] list of numbers > 0 with schedule: custom, else null")
        return self


class _NoisyProxParams(_NoisyParams):
    """Noisy-FedProx: Noisy-FedAvg's steps plus α(w − w_t), added after clipping (α = 0 is Noisy-FedAvg)."""

    alpha: float = Field(ge=0)


class _ProxParams(_FedAvgParams):
    mu: float = Field(gt=0)


class _PFAParams(_Section):
    """PFA (spec heterogeneous_dp §4.2): public/private split by reported epsilon, projection of the
    private clients' updates onto the public clients' top-k subspace, per tensor."""

    split: Literal["top_fraction", "gmm", "kmeans", "explicit"] = "top_fraction"
    public_fraction: float = Field(0.1, gt=0, le=1)
    public_clients: list[int] | None = None
    subspace: Literal["centered", "second-moment", "mean-outer", "random"] = "centered"
    k: int = Field(1, ge=1)
    scope: Literal["tensor", "model"] = "tensor"
    svd_solver: Literal["exact", "lanczos"] = "exact"
    lanczos_iters: int = Field(256, ge=1)
    weighting: Literal["epsilon", "count"] = "epsilon"
    server_lr: float = Field(1.0, gt=0)


class _PFAPlusParams(_PFAParams):
    """PFA+ (spec heterogeneous_dp §4.3): private clients upload k coordinates per tensor in the previous
    round's public subspace; `warmup_rounds` rounds with private clients are aggregated in full first."""

    warmup_rounds: int = Field(1, ge=1)
    subspace_broadcast: Literal["private", "all"] = "private"


class _RobustHDPParams(_Section):
    """Robust-HDP (spec heterogeneous_dp §4.4): robust PCA of the stacked updates estimates each update's
    noise from the updates themselves; weights ∝ 1/estimated variance. Never reads reported epsilons."""

    p_prime: int = Field(200_000, ge=1)
    blocks: Literal["all", "first"] = "all"
    schedule: Literal["every_round", "once"] = "every_round"
    mu_norm: Literal["entrywise", "max_col_sum"] = "entrywise"
    lam: float | None = Field(None, gt=0)
    tol: float = Field(1e-7, gt=0)
    max_iter: int = Field(10_000, ge=1)
    server_lr: float = Field(1.0, gt=0)


class _FedCEOParams(_Section):
    """FedCEO (spec fedceo.md §2-3): T-tSVD smoothing of the uploaded models every `interval` rounds at
    threshold theta^j / (2 lam); clients start from their own smoothed model in the round after."""

    lam: float = Field(gt=0)
    theta: float = Field(1.0, ge=1)
    interval: int = Field(1, ge=1)
    layers: Literal["all"] | int = "all"
    personalize: bool = True
    personal_staleness: Literal["any", "last"] = "any"
    prox_dtype: Literal["float64", "float32"] = "float64"
    rfft: bool = True

    @field_validator("layers")
    @classmethod
    def _layers(cls, v: Any) -> Any:
        if v != "all" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            _fail("layers", "must be 'all' or a number of last layers >= 1", v, "all | 1, 2, ...")
        return v


class _PPSGDParams(_Section):
    """PPSGD (spec fedceo.md §6.2): θ_k = w + u_k; u_k stays on the client and moves alpha times as fast."""

    alpha: float = Field(1.0, gt=0)


class _CentaurParams(_Section):
    """CENTAUR (spec fedceo.md §6.3): private heads; each round fits the head for head_epochs with the
    representation frozen, then trains the representation (the only shared part) with the head frozen."""

    head_epochs: float = Field(1.0, gt=0)


ALGORITHM_PARAMS: dict[str, type[_Section]] = {
    "fedavg": _FedAvgParams,
    "dp_fedavg_local": _FedAvgParams,
    "dp_fedavg_central": _CentralParams,
    "udp_fedavg": _FedAvgParams,
    "noisy_fedavg": _NoisyParams,
    "noisy_fedprox": _NoisyProxParams,
    "fedprox": _ProxParams,
    "weiavg": _CentralParams,
    "min_eps": _EpsTargetParams,
    "max_eps": _EpsTargetParams,
    "oracle": _CentralParams,
    "pfa": _PFAParams,
    "pfa_plus": _PFAPlusParams,
    "robust_hdp": _RobustHDPParams,
    "fedceo": _FedCEOParams,
    "ppsgd": _PPSGDParams,
    "centaur": _CentaurParams,
}


class AlgorithmConfig(_Section):
    """An algorithm bundle by name, with its hyperparameters in `params` (checked per algorithm).

    params: fedavg / dp_fedavg_local / udp_fedavg: weighting (uniform|samples), server_lr;
    dp_fedavg_central: server_lr; fedprox: mu (required) + fedavg's;
    noisy_fedavg: std (required), schedule, step_sizes (schedule custom), clip_mode, batch_sampling;
    noisy_fedprox: noisy_fedavg's + alpha (required, >= 0);
    weiavg (weights ∝ reported epsilon) and oracle (weights ∝ 1/true noise variance; privileged): server_lr;
    min_eps / max_eps: epsilon ('observed' or a number) + fedavg's. max_eps needs privacy.allow_budget_violation.
    pfa: split, public_fraction, public_clients, subspace, k, scope, svd_solver, lanczos_iters, weighting, server_lr.
    pfa_plus: pfa's, plus warmup_rounds (>= 1) and subspace_broadcast (private | all).
    robust_hdp: p_prime, blocks, schedule, mu_norm, lam, tol, max_iter, server_lr.
    fedceo: lam (required), theta (>= 1), interval, layers (all | last n), personalize, personal_staleness
    (any | last), prox_dtype, rfft. ppsgd: alpha (> 0, local / global step size).
    centaur: head_epochs (> 0; needs a model with a head: mlp2, lenet5).
    """

    name: AlgorithmName
    params: dict[str, Any] = Field(default_factory=dict, validate_default=True)

    @field_validator("params")
    @classmethod
    def _params(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        name = info.data.get("name")
        if name not in ALGORITHM_PARAMS:
            return v  # the name's own error is reported
        return _sub_validate(ALGORITHM_PARAMS[name], v).model_dump()


class EvaluationConfig(_Section):
    every: int = Field(1, ge=1)


class CheckpointConfig(_Section):
    every: int = Field(1, ge=1)


class RunConfig(_Section):
    """One run. See configs/*.yaml for examples and `config_to_yaml` for every field with its value."""

    name: str = Field("run", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    seed: int = Field(0, ge=0)
    device: Literal["cpu", "cuda"] = "cpu"
    backend: Literal["local", "ray"] = "local"
    data: DataConfig
    model: ModelConfig
    algorithm: AlgorithmConfig
    training: TrainingConfig
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @field_validator("device")
    @classmethod
    def _device_available(cls, v: str) -> str:
        if v == "cuda":
            import torch

            if not torch.cuda.is_available():
                _fail("", "cuda is not available on this machine", v, "cpu")
        return v

    @field_validator("backend")
    @classmethod
    def _backend_available(cls, v: str) -> str:
        if v == "ray":
            _fail("", "the ray backend is not available yet", v, "local")
        return v

    @property
    def planned_cohort(self) -> int | None:
        """Uploads averaged per round as planned: every client, or k of a fixed cohort (None under Poisson)."""
        sel = self.training.selection
        return self.data.clients if sel.kind == "all" else sel.k

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        self._resolve_threat_model()
        self._check_privacy_fields()
        self._check_per_client_lengths()
        return self

    # The declared threat model must be the one the algorithm provides; missing parts are filled in.
    def _resolve_threat_model(self) -> None:
        p, alg = self.privacy, self.algorithm.name
        allowed = ALGORITHM_MECHANISMS[alg]
        if p.mechanism is None:
            p.mechanism = allowed[0]
        elif p.mechanism not in allowed:
            _fail("privacy.mechanism", f"algorithm {alg!r} runs with mechanism {' or '.join(map(repr, allowed))}",
                  p.mechanism, ", ".join(allowed))
        unit = MECHANISM_UNIT[p.mechanism]
        if p.unit is None:
            p.unit = unit  # type: ignore[assignment]
        elif p.unit != unit:
            _fail("privacy.unit", f"mechanism {p.mechanism!r} of algorithm {alg!r} protects unit {unit!r}",
                  p.unit, unit)
        observer = MECHANISM_OBSERVER[p.mechanism]
        if p.mechanism == "param_noise":  # the f-DP view: uploads seen (server) or only their averages
            observer = p.observer if p.observer in ("server", "aggregate") else (
                "aggregate" if p.secure_aggregation else "server")
        if p.observer is None:
            p.observer = observer  # type: ignore[assignment]
        elif p.observer != observer:
            _fail("privacy.observer", f"with algorithm {alg!r} and mechanism {p.mechanism!r} the guarantee "
                  f"holds against observer {observer!r} ({_OBSERVER_WHY[observer]})", p.observer, observer)

    def _check_privacy_fields(self) -> None:
        p, alg, mech = self.privacy, self.algorithm.name, self.privacy.mechanism
        not_private = f"algorithm {alg!r} with mechanism {mech!r}"
        if mech == "dpsgd":
            if p.sampling is None:
                p.sampling = "poisson"
        elif p.sampling is not None:
            _fail("privacy.sampling", f"record sampling is only used by mechanism 'dpsgd' (this run: {mech!r}); "
                  "client sampling is training.selection", p.sampling, "null")
        if mech in _NEEDS_CLIP and p.clip is None:
            _fail("privacy.clip", f"required by mechanism {mech!r}", None, "a number > 0")
        if mech not in _NEEDS_CLIP and p.clip is not None:
            _fail("privacy.clip", f"not used by {not_private}", p.clip, "null")
        if mech == "udp" and p.noise_multiplier is None:
            _fail("privacy.noise_multiplier", "required by mechanism 'udp' (its calibration is not available yet)",
                  None, "a number >= 0")
        if mech in ("param_noise", "none") and p.noise_multiplier is not None:
            hint = "; the noise of 'param_noise' is algorithm.params.std" if mech == "param_noise" else ""
            _fail("privacy.noise_multiplier", f"not used by {not_private}{hint}", p.noise_multiplier, "null")
        if mech != "param_noise":
            for name in _FDP_FIELDS:
                if getattr(p, name) != PrivacyConfig.model_fields[name].default:
                    _fail(f"privacy.{name}", f"only used by the f-DP accounting of {' and '.join(_NOISY)} (this run: "
                          f"{not_private})", getattr(p, name), repr(PrivacyConfig.model_fields[name].default))
        else:
            self._check_noisy()
        if mech in _NEEDS_BUDGETS and p.budgets is None:
            _fail("privacy.budgets", f"required by mechanism {mech!r}", None, _BUDGETS_ALLOWED)
        if mech == "none" and p.budgets is not None:
            _fail("privacy.budgets", f"{not_private} is not private, so budgets have no effect", p.budgets, "null")
        if mech in _CALIBRATED and p.noise_multiplier is None and _has_unlimited(p.budgets):
            _fail("privacy.budgets", "unlimited (.inf) budgets cannot calibrate noise; give "
                  "privacy.noise_multiplier or finite budgets", p.budgets, "finite numbers > 0")
        if p.calibration == "pfa-heuristic" and (mech != "dpsgd" or p.noise_multiplier is not None):
            _fail("privacy.calibration", "the PFA heuristic calibrates DP-SGD noise from the budgets (mechanism 'dpsgd', "
                  "no explicit noise_multiplier)", p.calibration, "accountant")
        if alg == "max_eps" and not p.allow_budget_violation:
            _fail("privacy.allow_budget_violation", "max_eps calibrates everyone to the largest epsilon, violating the "
                  "smaller budgets: it is a non-private reference and must be allowed explicitly", False, "true")
        if alg in ("min_eps", "max_eps") and p.noise_multiplier is not None:
            _fail("privacy.noise_multiplier", f"{alg} calibrates the noise itself", p.noise_multiplier, "null")
        if p.misreport is not None and p.misreport.client >= self.data.clients:
            _fail("privacy.misreport.client", f"no such client (data.clients is {self.data.clients})",
                  p.misreport.client, f"an integer in [0, {self.data.clients - 1}]")
        sel = self.training.selection.kind
        if p.accountant == "pld" and ((mech == "dpsgd" and p.sampling == "fixed") or (mech == "central" and sel == "fixed")):
            what = "privacy.sampling" if mech == "dpsgd" else "training.selection.kind"
            _fail("privacy.accountant", f"'pld' cannot account fixed-size sampling (replace-one; {what} is 'fixed')",
                  p.accountant, "rdp")

    def _check_noisy(self) -> None:
        """What the f-DP analysis of Noisy-FedAvg/FedProx assumes (spec fdp_accounting.md §1.1)."""
        t, p, alg = self.training, self.privacy, self.algorithm
        name = alg.name
        if t.local_steps is None:
            _fail("training.local_steps", f"{name} needs a fixed number K of local steps (the sensitivities sum over "
                  "them); local_epochs would give clients different K", t.local_epochs, "local_steps: an integer >= 1")
        if t.optimizer.momentum:
            _fail("training.optimizer.momentum", f"{name} takes plain clipped steps: the sensitivity analysis has no "
                  "momentum", t.optimizer.momentum, "0")
        if t.selection.kind == "poisson":
            _fail("training.selection.kind", f"{name} runs with full participation or fixed-size cohorts (the "
                  "accountant uses the cohort size and claims no sampling amplification)", "poisson", "all | fixed")
        steps = alg.params.get("step_sizes")
        if steps is not None and (len(steps) != t.rounds or any(len(row) != t.local_steps for row in steps)):
            shape = f"[{len(steps)}][{', '.join(sorted({str(len(row)) for row in steps}))}]"
            _fail("algorithm.params.step_sizes", f"must have training.rounds rows of training.local_steps step sizes "
                  f"([{t.rounds}][{t.local_steps}])", shape, f"a [{t.rounds}][{t.local_steps}] list")
        cohort = self.planned_cohort
        if p.honest_clients is not None and cohort is not None and p.honest_clients > cohort:
            _fail("privacy.honest_clients", f"more than the {cohort} clients averaged per round", p.honest_clients,
                  f"an integer in [1, {cohort}]")

    def _check_per_client_lengths(self) -> None:
        n = self.data.clients
        sel = self.training.selection
        if sel.kind == "fixed" and sel.k is not None and sel.k > n:
            _fail("training.selection.k", f"more clients than data.clients ({n})", sel.k, f"an integer in [1, {n}]")
        bs = self.training.batch_size
        if isinstance(bs, list) and len(bs) != n:
            _fail("training.batch_size", f"has {len(bs)} entries for {n} clients (data.clients)", bs,
                  f"one integer per client ({n})")
        if bs == "rhdp20" and n != len(RHDP_BATCH20):
            _fail("training.batch_size", f"the rhdp20 list has {len(RHDP_BATCH20)} clients, data.clients is {n}", bs,
                  f"hetero, an integer, a list of {n} integers or {{distribution: choice, ...}}")
        b = self.privacy.budgets
        if isinstance(b, list) and len(b) != n:
            _fail("privacy.budgets", f"has {len(b)} entries for {n} clients (data.clients)", b,
                  f"one epsilon per client ({n}), a number or a distribution")
        if isinstance(b, Rhdp20Budgets) and n != len(RHDP_EPS20[b.dist]):
            _fail("privacy.budgets", f"rhdp20 lists have {len(RHDP_EPS20[b.dist])} clients; for {n} clients use "
                  f"distribution {b.dist} (sampled)", b, f"{{distribution: {b.dist}}} or data.clients: 20")


def _has_unlimited(budgets: Any) -> bool:
    if isinstance(budgets, float):
        return math.isinf(budgets)
    if isinstance(budgets, list):
        return any(math.isinf(e) for e in budgets)
    return False


# ---- YAML ---------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads 1e-5 as a float (YAML 1.1 wants 1.0e-5) and rejects duplicate keys."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _no_duplicates(loader: _Loader, node: yaml.MappingNode) -> dict:
    loader.flatten_mapping(node)
    seen: set = set()
    for key_node, _ in node.value:
        if isinstance(key_node, yaml.ScalarNode):
            key = loader.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{where}invalid YAML: {problem}"


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """YAML text -> data, reading 1e-5 as a float and refusing duplicate keys; errors are one-line ConfigErrors."""
    return _load_yaml(text, source)


def _load_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {_yaml_problem(exc)}", source) from None


# ---- overrides ----------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """``"a.b=c"`` -> (("a", "b"), value), the value read as YAML: 5, 0.1, 1e-5, true, null, [1, 2], {k: v}."""
    if not isinstance(text, str) or "=" not in text:
        raise ConfigError(f"--set {_show(text)}: expected FIELD.PATH=VALUE, e.g. training.rounds=5", "--set")
    key, _, raw = text.partition("=")
    path = tuple(p.strip() for p in key.strip().split("."))
    if not key.strip() or any(not p for p in path):
        raise ConfigError(f"--set {_show(text)}: empty field name in {key.strip()!r}; expected FIELD.PATH=VALUE",
                          "--set")
    value = _load_yaml(raw, f"--set {'.'.join(path)}") if raw.strip() else None
    return path, value


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of `data` with each ``FIELD.PATH=VALUE`` set in turn (missing mappings are created).

    Unknown field names are not rejected here: they fail validation like any other field. A list item
    can be addressed by its index (``privacy.budgets.2=8``).
    """
    import copy

    out = copy.deepcopy(dict(data))
    for text in overrides:
        path, value = parse_override(text)
        cur: Any = out
        for depth, key in enumerate(path):
            last = depth == len(path) - 1
            where = ".".join(path[: depth + 1])
            if isinstance(cur, dict):
                if last:
                    cur[key] = value
                else:
                    if key not in cur or cur[key] is None:
                        cur[key] = {}
                    cur = cur[key]
            elif isinstance(cur, list) and key.lstrip("-").isdigit() and -len(cur) <= int(key) < len(cur):
                if last:
                    cur[int(key)] = value
                else:
                    cur = cur[int(key)]
            else:
                parent = ".".join(path[:depth])
                raise ConfigError(
                    f"{where}: cannot set {'.'.join(path)}: {parent} is not a mapping"
                    + (f" (a list of {len(cur)}; index it with 0..{len(cur) - 1})" if isinstance(cur, list) else "")
                    + f" (got {_show(cur)})", where)
    return out


# ---- public entry points ------------------------------------------------------------------------------


def validate_config(data: Any) -> RunConfig:
    """Validate a config mapping; every problem is a one-line ConfigError."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"config: the config must be a mapping of fields (got {_show(data)})", "config")
    try:
        return RunConfig.model_validate(dict(data))
    except ValidationError as exc:
        raise _config_error(exc, RunConfig) from None


def load_config(path: Path | str, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML config, apply ``FIELD.PATH=VALUE`` overrides in order, validate.

    Raises ConfigError (one line) for a missing/unreadable file, invalid YAML, a document that is not a
    mapping, a malformed override, and any invalid field.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found", str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config file ({type(exc).__name__}: {exc})", str(path)) from None
    data = _load_yaml(text, str(path))
    if data is None:
        raise ConfigError(f"{path}: the config file is empty", str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config must be a YAML mapping of fields (got {_show(data)})", str(path))
    return validate_config(apply_overrides(data, overrides))


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    """The resolved config as plain data (every field, defaults and inferred values filled in)."""
    return cfg.model_dump(mode="python")


def config_to_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML; ``load_config`` of it gives back an equal RunConfig."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=None, allow_unicode=True,
                          width=100)

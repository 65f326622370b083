"""The `training`, `evaluation` and `checkpoint` sections: rounds, local program, batch sizes, optimizer,
client selection, and how often to evaluate and checkpoint."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_serializer, field_validator, model_validator

from dpfl.experiment.config.base import _check_probs, _Section
from dpfl.experiment.config.errors import _fail, _sub_validate
from dpfl.experiment.config.limits import MAX_BATCH_SIZE, MAX_LOCAL_EPOCHS, MAX_LOCAL_STEPS, MAX_ROUNDS, _at_most
from dpfl.privacy.budget_distributions import BATCH_SIZE_KINDS, HETERO_BATCH_SIZES


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

    @field_validator("values")
    @classmethod
    def _values_limit(cls, v: list[int]) -> list[int]:
        for i, b in enumerate(v):
            _at_most(b, MAX_BATCH_SIZE, "records per batch", str(i))
        return v

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

    dpfl's limits (`dpfl.experiment.config.limits`), far above any published setting, so that no typo runs
    for years or overflows: rounds and local_steps at most 1,000,000, local_epochs at most 10,000, every
    batch size at most 1,000,000 (a batch above a client's records is its whole set); Noisy-FedAvg/FedProx
    also need rounds x local_steps <= 10,000,000 (their f-DP accounting keeps one step size per local step).
    micro_batch: DP-SGD computes per-sample gradients of at most this many records at once and sums the clipped
    ones (gradient accumulation: the same step, the noise drawn once; for batches that do not fit in memory).
    Unset, a step whose records alone exceed the engine's memory budget is accumulated automatically.
    precision: ``float32`` (default) or ``bfloat16``: the local gradients' matrix products with bfloat16 operands
    (GPUs with bf16 tensor cores); norms, clipping, noise and the update stay float32 (`LocalSpec.precision`).
    """

    rounds: int = Field(ge=1)
    local_steps: int | None = Field(None, ge=1)
    local_epochs: float | None = Field(None, gt=0)
    batch_size: int | list[int] | BatchSizeKind | BatchSizeChoice
    optimizer: OptimizerConfig
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    micro_batch: int | None = Field(None, ge=1, le=1_000_000)
    precision: Literal["float32", "bfloat16"] = "float32"

    @field_validator("rounds", "local_steps", "local_epochs")
    @classmethod
    def _length_limit(cls, v: Any, info: ValidationInfo) -> Any:
        if info.field_name == "local_epochs":
            return _at_most(v, MAX_LOCAL_EPOCHS, "local epochs")
        return _at_most(v, MAX_ROUNDS if info.field_name == "rounds" else MAX_LOCAL_STEPS,
                        "rounds" if info.field_name == "rounds" else "local steps")

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
            return _at_most(v, MAX_BATCH_SIZE, "records per batch")
        if isinstance(v, list):
            if not v:
                _fail("", "an empty list", v, "one integer >= 1 per client")
            for i, b in enumerate(v):
                if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                    _fail(str(i), "not a batch size", b, "an integer >= 1")
                _at_most(b, MAX_BATCH_SIZE, "records per batch", str(i))
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


class EvaluationConfig(_Section):
    every: int = Field(1, ge=1)


class CheckpointConfig(_Section):
    every: int = Field(1, ge=1)

"""The `data` section: which dataset and how it is split among clients."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from dpfl.data.registry import PROVIDED, dataset_names, dataset_options
from dpfl.experiment.config.base import _Section
from dpfl.experiment.config.errors import _allowed, _fail
from dpfl.experiment.config.limits import MAX_CLIENTS, _at_most



class ClusteredData(_Section):
    """data.partition clustered (clustered_dpfl.md §2): M planted clusters (0 the minority), one shift per cluster;
    each client draws train_per_client training records plus val_fraction of its draw for validation."""

    clusters: int = Field(4, ge=2, le=1000)
    shift: Literal["rotation", "label_flip", "label_shift"] = "rotation"
    minority_ratio: float = Field(0.15, ge=0, lt=1)
    train_per_client: int = Field(8000, ge=1, le=MAX_CLIENTS)
    val_fraction: float = Field(0.2, ge=0, lt=1)
    purity: float = Field(0.9, gt=0, le=1)
    disjoint: bool = False
    normalize: list[float] | None = Field(None, min_length=2, max_length=2)  # (mean, std), after the shift


class DataConfig(_Section):
    """Which dataset and how it is split among clients (`dpfl.data.federated_dataset`).

    partition: iid; shards; dirichlet (each class split among clients by Dir(alpha)); dirichlet_quota (each
    client draws class proportions from Dir(alpha) and fills `samples_per_client` samples, default all / clients;
    spec fdp_accounting.md §8); iid_equal (equal shards of one seeded permutation, `samples_per_client` each, default
    all / clients, each in the permutation's order: MP-DP's comparison, spec bidirectional.md §11).

    clients: 1 to 1,000,000 (`MAX_CLIENTS`, above the records of every dataset dpfl loads; a split needs at
    least one training record per client, which `dpfl.data` checks against the dataset itself).
    """

    dataset: str
    root: str | None = None
    clients: int = Field(ge=1)
    partition: Literal["iid", "shards", "dirichlet", "dirichlet_quota", "iid_equal", "clustered"] = "iid"
    clustered: ClusteredData | None = None
    alpha: float = Field(0.5, gt=0)
    samples_per_client: int | None = Field(None, ge=1)
    shards_per_client: int = Field(2, ge=1)
    max_train_samples: int | None = Field(None, ge=1)
    client_test_fraction: float = Field(0.0, ge=0, lt=1)
    client_val_fraction: float = Field(0.0, ge=0, lt=1)
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("dataset")
    @classmethod
    def _dataset_known(cls, v: str) -> str:
        """A built-in or registered (`dpfl.register_dataset`) name, or 'provided' (data passed to dpfl.run)."""
        if v != PROVIDED and v not in dataset_names():
            _fail("", "not an allowed value", v, _allowed(dataset_names()))
        return v

    @field_validator("clients")
    @classmethod
    def _clients_limit(cls, v: int) -> int:
        return _at_most(v, MAX_CLIENTS, "clients")

    @model_validator(mode="after")
    def _options_known(self) -> DataConfig:
        if self.samples_per_client is not None and self.partition not in ("dirichlet_quota", "iid_equal"):
            _fail("samples_per_client", "only used by partitions 'dirichlet_quota' and 'iid_equal'",
                  self.samples_per_client, "null")
        if (self.partition == "clustered") != (self.clustered is not None):
            _fail("clustered", "partition 'clustered' needs the `clustered` section, and the section needs that "
                  "partition", self.clustered, "both or neither")
        if self.partition == "clustered" and (self.client_test_fraction or self.client_val_fraction
                                              or self.max_train_samples is not None):
            _fail("partition", "clustered clients draw their own train/validation/test records (data.clustered); "
                  "client_test_fraction, client_val_fraction and max_train_samples do not apply", self.partition,
                  "those fields unset")
        if self.client_test_fraction + self.client_val_fraction >= 1:
            _fail("client_val_fraction", "the test and validation splits must leave training data",
                  self.client_val_fraction,
                  f"a fraction below 1 - client_test_fraction = {1 - self.client_test_fraction:g}")
        if self.dataset == PROVIDED:
            self._check_provided()
            return self
        allowed = dataset_options(self.dataset)
        for key in self.options:
            if key == "seed":
                _fail("options.seed", "the dataset seed is the run's top-level seed; set `seed` instead",
                      self.options[key], ", ".join(a for a in allowed if a != "seed") or "none")
            if key not in allowed:
                _fail(f"options.{key}", f"unknown option for dataset {self.dataset!r}", self.options[key],
                      ", ".join(a for a in allowed if a != "seed") or "none")
        return self

    def _check_provided(self) -> None:
        """Data passed as an object is already split among clients: nothing here may try to split it."""
        for name in ("root", "partition", "alpha", "shards_per_client", "max_train_samples", "client_test_fraction",
                     "client_val_fraction", "options", "clustered"):
            default = DataConfig.model_fields[name].get_default(call_default_factory=True)
            if getattr(self, name) != default:
                _fail(name, f"dataset {PROVIDED!r} is passed as an object, already split among clients; this "
                      "field does not apply", getattr(self, name), repr(default))

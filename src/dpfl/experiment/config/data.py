"""The `data` section: which dataset and how it is split among clients, or the user's own silo files
(`data.silos`, see `own_data`), which are never split among clients."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, SerializerFunctionWrapHandler, field_validator, model_serializer, \
    model_validator

from dpfl.data.registry import PROVIDED, dataset_names, dataset_options
from dpfl.data.silos import FILES
from dpfl.experiment.config.base import _Section
from dpfl.experiment.config.errors import _allowed, _fail
from dpfl.experiment.config.limits import MAX_CLIENTS, _at_most
from dpfl.experiment.config.own_data import (ScalingConfig, SchemaConfig, SiloEntry, absolute, check_scaling,
                                             refuse_fitted_scaling)

# Fields that say how a dataset is split among clients; none applies to given silos (dataset 'files').
_SPLIT_FIELDS = ("root", "partition", "alpha", "samples_per_client", "shards_per_client", "max_train_samples",
                 "options", "clustered")
_FILES_FIELDS = ("silos", "test", "schema_", "scaling")  # only for given silos


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

    clients: 1 to 10,000,000 (`MAX_CLIENTS`, a cross-device population; a split needs at least one training record
    per client, which `dpfl.data` checks against the dataset itself).

    silos: the user's own data, one file or folder per client (`own_data`); dataset is then 'files' and clients the
    number of silos (both filled in), nothing is split among clients, and the resolved config (config.yaml) records
    the silos, test, schema and scaling as given instead of the split fields, which do not apply.
    """

    # `schema` is also a (deprecated) BaseModel method, hence the field name schema_ under the YAML key `schema`.
    model_config = ConfigDict(validate_by_alias=True, validate_by_name=True, serialize_by_alias=True)

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
    silos: list[str | SiloEntry] | None = Field(None, min_length=1, max_length=MAX_CLIENTS)
    test: str | None = Field(None, min_length=1)
    schema_: SchemaConfig | None = Field(None, alias="schema")
    scaling: Literal["none"] | ScalingConfig = "none"

    @model_validator(mode="before")
    @classmethod
    def _silos_fill_in(cls, data: Any) -> Any:
        """Given silos: dataset 'files' and one client per silo, unless stated."""
        if isinstance(data, dict) and isinstance(data.get("silos"), list):
            data = {"dataset": FILES, **data}
            data.setdefault("clients", max(1, len(data["silos"])))  # an empty list: the error is about silos
        return data

    @field_validator("dataset")
    @classmethod
    def _dataset_known(cls, v: str) -> str:
        """A built-in or registered (`dpfl.register_dataset`) name, 'provided' (data passed to dpfl.run) or 'files'
        (data.silos)."""
        if v not in (PROVIDED, FILES) and v not in dataset_names():
            _fail("", "not an allowed value", v, _allowed((*dataset_names(), FILES)))
        return v

    @field_validator("scaling", mode="before")
    @classmethod
    def _scaling_public(cls, v: Any) -> Any:
        return refuse_fitted_scaling(v)

    @field_validator("silos")
    @classmethod
    def _silo_paths_absolute(cls, v: list[str | SiloEntry] | None) -> list[str | SiloEntry] | None:
        """Relative paths are relative to the current folder here (`load_config` resolves them against the config
        file's folder first)."""
        if v is None:
            return v
        return [absolute(s) if isinstance(s, str) else s.model_copy(update={"path": absolute(s.path)}) for s in v]

    @field_validator("test")
    @classmethod
    def _test_path_absolute(cls, v: str | None) -> str | None:
        return absolute(v) if v is not None else None

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Only the fields that apply: given silos without the split fields, a split dataset without silo fields."""
        out = handler(self)
        if self.dataset == FILES:
            drop = set(_SPLIT_FIELDS) | {f for f in ("test", "scaling") if out.get(f) in (None, "none")} | \
                {f for f in ("client_test_fraction", "client_val_fraction") if not out.get(f)}
        else:
            drop = {"silos", "test", "schema", "scaling"}
        return {k: v for k, v in out.items() if k not in drop}

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
        if self.dataset == FILES:
            self._check_files()
            return self
        for name in _FILES_FIELDS:
            default = DataConfig.model_fields[name].get_default(call_default_factory=True)
            if getattr(self, name) != default:
                key = "schema" if name == "schema_" else name
                _fail(key, "only for the user's own silo files (data.silos); dataset "
                      f"{self.dataset!r} is loaded by dpfl", getattr(self, name), "null (or give data.silos)")
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

    def _check_files(self) -> None:
        """Given silos are the clients: nothing splits them, their schema is declared, a test set exists."""
        if self.silos is None:
            _fail("silos", f"dataset {FILES!r} reads the user's files: list one file or folder per client", None,
                  "a list of paths")
        if self.clients != len(self.silos):
            _fail("clients", f"one client per silo: data.silos lists {len(self.silos)}", self.clients,
                  f"{len(self.silos)} (or leave it out)")
        paths = [s if isinstance(s, str) else s.path for s in self.silos]
        for i, p in enumerate(paths):
            if p in paths[:i]:
                _fail(f"silos.{i}", f"the same file as silo {paths.index(p)}: every client has its own silo", p,
                      "a different file or folder")
        if self.test in paths:
            _fail("test", f"the test file is also silo {paths.index(self.test)}: the global model would be evaluated "
                  "on records it trained on", self.test, "a file that is not a silo")
        for name in _SPLIT_FIELDS:
            default = DataConfig.model_fields[name].get_default(call_default_factory=True)
            if getattr(self, name) != default:
                _fail(name, "the silos are the clients' own data, as given; nothing splits them among clients, so "
                      "this field does not apply", getattr(self, name), repr(default))
        if self.schema_ is None:
            _fail("schema", "given silos need a declared schema (n_classes, and features: {column: dtype} and label "
                  "for tables, or shape for arrays and images); nothing is inferred", None, "a schema mapping")
        if self.test is None and not self.client_test_fraction:
            _fail("test", "the global model is evaluated on a shared test file or on a share held out of each silo",
                  None, "a path, or client_test_fraction > 0")
        if isinstance(self.scaling, ScalingConfig):
            check_scaling(self.scaling, self.schema_)

    def _check_provided(self) -> None:
        """Data passed as an object is already split among clients: nothing here may try to split it."""
        for name in ("root", "partition", "alpha", "shards_per_client", "max_train_samples", "client_test_fraction",
                     "client_val_fraction", "options", "clustered"):
            default = DataConfig.model_fields[name].get_default(call_default_factory=True)
            if getattr(self, name) != default:
                _fail(name, f"dataset {PROVIDED!r} is passed as an object, already split among clients; this "
                      "field does not apply", getattr(self, name), repr(default))

"""The parts of the `data` section that name the user's own files: one silo per client, a shared test file, the
declared schema and public scaling (`dpfl.data.silos.federated_files` reads them).

    data:
      silos: [hospital_a.csv, hospital_b.csv, {path: hospital_c.csv, name: hospital_c}]
      test: test.csv                       # or client_test_fraction: 0.2 (each silo keeps a share for testing)
      schema:
        label: outcome
        n_classes: 2
        features: {age: float32, systolic_bp: float32, smoker: int64}
      scaling: {mean: [60, 130, 0.3], std: [12, 20, 0.5]}    # public statistics; default none

Relative paths are relative to the config file's folder (`load_config`), or to the current folder for a config
given as a mapping; they are stored absolute, so a run directory's config.yaml finds the same files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from dpfl.data.schema import DTYPES, FITTED_REFUSAL, Scaling, SiloSchema
from dpfl.experiment.config.base import _Section
from dpfl.experiment.config.errors import _fail

Dtype = Literal["float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8"]
assert set(Dtype.__args__) == set(DTYPES)  # type: ignore[attr-defined]


class SiloEntry(_Section):
    """One client's file or folder, with a name for reports (default: the file's stem)."""

    path: str = Field(min_length=1)
    name: str | None = Field(None, min_length=1, max_length=100)

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class SchemaConfig(_Section):
    """One record as declared (never inferred): a table's feature columns and dtypes, or an array's or image's shape.

    n_classes is declared (a label outside 0..n_classes-1 is an error in the data); classes names them (an image
    folder's class sub-folders, in label order).
    """

    n_classes: int = Field(ge=1, le=1_000_000)
    label: str = Field("label", min_length=1)
    features: dict[str, Dtype] | None = None
    shape: list[int] | None = Field(None, min_length=1, max_length=4)
    dtype: Dtype = "float32"
    classes: list[str] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> SchemaConfig:
        if (self.features is None) == (self.shape is None):
            _fail("features", "declare either features (a table's columns: {name: dtype}) or shape (an array's or "
                  "image's record shape), not both or neither", self.features, "one of features, shape")
        if self.features is not None and not self.features:
            _fail("features", "must name at least one column", self.features, "{column: dtype, ...}")
        if self.features is not None and self.label in self.features:
            _fail("label", "the label column is also a feature column", self.label, "a column not in features")
        if self.shape is not None and any(s < 1 for s in self.shape):
            _fail("shape", "sizes must be >= 1", self.shape, "positive integers")
        if self.classes is not None and (len(self.classes) != self.n_classes or len(set(self.classes)) !=
                                         len(self.classes)):
            _fail("classes", f"must be n_classes ({self.n_classes}) distinct names", self.classes,
                  f"{self.n_classes} names")
        return self

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A table's schema without the array fields, an array's without the table fields (left at their defaults)."""
        out = handler(self)
        drop = {"shape", "dtype"} if self.features is not None else {"features", "label"}
        return {k: v for k, v in out.items() if not (k in drop and v == SchemaConfig.model_fields[k].default)
                and not (k == "classes" and v is None)}

    def to_schema(self) -> SiloSchema:
        return SiloSchema(self.n_classes, self.features, label=self.label, shape=self.shape, dtype=self.dtype,
                          classes=self.classes)


class ScalingConfig(_Section):
    """Public per-feature (tables: a list in feature order or a mapping by column) or per-channel statistics."""

    mean: list[float] | dict[str, float]
    std: list[float] | dict[str, float]

    def to_scaling(self, schema: SchemaConfig) -> Scaling:
        def ordered(values: list[float] | dict[str, float]) -> list[float]:
            if isinstance(values, dict):
                assert schema.features is not None  # checked with the section
                return [values[c] for c in schema.features]
            return values

        return Scaling(ordered(self.mean), ordered(self.std))


def refuse_fitted_scaling(value: Any) -> Any:
    """A string other than 'none' asks to fit the scaling on the clients' records: refused with the reason."""
    if isinstance(value, str) and value != "none":
        _fail("", FITTED_REFUSAL.split(";")[0] + " (its DP guarantee would not hold)", value,
              "none, or {mean: [...], std: [...]} of public statistics")
    return value


def check_scaling(scaling: ScalingConfig, schema: SchemaConfig) -> None:
    """One mean and one std per feature column (tables; a mapping names every column) or per channel."""
    need = len(schema.features) if schema.features is not None else (schema.shape or [0])[0]
    for name in ("mean", "std"):
        values = getattr(scaling, name)
        if isinstance(values, dict):
            if schema.features is None or list(values) != list(schema.features):
                _fail(f"scaling.{name}", "a mapping must name every feature column, in the schema's order", values,
                      ", ".join(schema.features or ()) or "a list (arrays and images have no columns)")
        elif len(values) != need:
            what = "feature column" if schema.features is not None else "channel (the shape's first axis)"
            _fail(f"scaling.{name}", f"needs one value per {what} ({need})", values, f"{need} numbers")
        if name == "std" and any(v <= 0 for v in (values.values() if isinstance(values, dict) else values)):
            _fail("scaling.std", "standard deviations must be > 0", values, "numbers > 0")


def absolute(path: str, base: Path | None = None) -> str:
    """`path` made absolute against `base` (default: the current folder), normalised; '~' expanded."""
    p = Path(os.path.expanduser(path))
    return p.as_posix() if p.is_absolute() else Path(os.path.abspath((base or Path.cwd()) / p)).as_posix()


def resolve_paths(raw: Any, base: Path) -> Any:
    """A config mapping whose data.silos and data.test paths are made absolute against `base` (the config file's
    folder); anything malformed is left for validation to report."""
    data = raw.get("data") if isinstance(raw, Mapping) else None
    if not isinstance(data, Mapping):
        return raw
    data = dict(data)
    if isinstance(data.get("test"), str) and data["test"]:
        data["test"] = absolute(data["test"], base)
    silos = data.get("silos")
    if isinstance(silos, list):
        data["silos"] = [absolute(s, base) if isinstance(s, str) and s else
                         ({**s, "path": absolute(s["path"], base)} if isinstance(s, Mapping)
                          and isinstance(s.get("path"), str) and s["path"] else s) for s in silos]
    return {**raw, "data": data}

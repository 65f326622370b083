"""What the user declares about their records, checked on every silo: `SiloSchema` and the public `Scaling`.

Nothing here is inferred from the data. The number of classes in particular is declared, never the largest label + 1:
a silo that happens to miss the top class must not shrink the model, and a label outside the classes is an error in
the data, not a wider model. Scaling uses public statistics only: a mean or std fitted on a client's records makes
every scaled record depend on all the others, which the DP accounting (one record changes one gradient) does not cover.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpfl.data.errors import DataError

__all__ = ["DTYPES", "FITTED_SCALING", "Scaling", "SiloSchema", "as_scaling", "refuse_fitted_scaling"]

# dtypes a feature may be declared with (numpy names); the engine trains on float32 whatever was declared.
DTYPES = ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8")
# Names users reach for when they mean "fit the scaling on the data": refused with the reason, not as a typo.
FITTED_SCALING = ("fit", "fitted", "auto", "standardize", "standardise", "normalize", "normalise", "zscore",
                  "z-score", "minmax", "min-max", "local")
FITTED_REFUSAL = ("scaling fitted on a client's own records makes every scaled record depend on all the others, "
                  "which the privacy accounting does not cover; give public per-feature statistics "
                  "(scaling: {mean: [...], std: [...]}) or none")


def refuse_fitted_scaling(value: Any, where: str = "scaling") -> None:
    """Raise DataError for a request to fit the scaling on the clients' data (any string but 'none')."""
    if isinstance(value, str) and value != "none":
        raise DataError(f"{where}: {value!r} refused: {FITTED_REFUSAL}")


@dataclass(frozen=True)
class SiloSchema:
    """One record as declared: a table's feature columns with their dtypes and its label column, or an array's
    shape and dtype (NPZ/NPY silos, image folders); `n_classes` always, `classes` to name them (an image folder's
    class sub-folders, in label order).

    Tables: ``SiloSchema(n_classes=2, label="outcome", features={"age": "float32", "bmi": "float32"})``.
    Arrays and images: ``SiloSchema(n_classes=10, shape=(1, 28, 28), dtype="uint8")``.
    """

    n_classes: int
    features: tuple[tuple[str, str], ...] | None = None
    label: str = "label"
    shape: tuple[int, ...] | None = None
    dtype: str = "float32"
    classes: tuple[str, ...] | None = None

    def __init__(self, n_classes: int, features: Mapping[str, str] | Sequence[tuple[str, str]] | None = None, *,
                 label: str = "label", shape: Sequence[int] | None = None, dtype: str = "float32",
                 classes: Sequence[str] | None = None) -> None:
        if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 1:
            raise DataError(f"schema: n_classes must be an integer >= 1, got {n_classes!r}")
        cols = None
        if features is not None:
            items = list(features.items()) if isinstance(features, Mapping) else [tuple(f) for f in features]
            if not items:
                raise DataError("schema: features must name at least one column")
            for name, kind in items:
                if not isinstance(name, str) or not name:
                    raise DataError(f"schema: a feature column name must be a non-empty string, got {name!r}")
                if kind not in DTYPES:
                    raise DataError(f"schema: column {name!r} has dtype {kind!r}; allowed: {', '.join(DTYPES)}")
            names = [n for n, _ in items]
            if len(set(names)) != len(names) or label in names:
                raise DataError(f"schema: feature columns must be distinct and differ from the label column "
                                f"{label!r}, got {names}")
            cols = tuple((str(n), str(k)) for n, k in items)
        if (cols is None) == (shape is None):
            raise DataError("schema: declare either features (a table's columns and dtypes) or shape (an array's or "
                            "image's record shape), not both or neither")
        if shape is not None:
            shape = tuple(int(s) for s in shape)
            if not shape or any(s < 1 for s in shape):
                raise DataError(f"schema: shape must be a non-empty list of positive sizes, got {list(shape)}")
        if dtype not in DTYPES:
            raise DataError(f"schema: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        if classes is not None:
            classes = tuple(str(c) for c in classes)
            if len(classes) != n_classes or len(set(classes)) != len(classes):
                raise DataError(f"schema: classes must be n_classes ({n_classes}) distinct names, got {list(classes)}")
        object.__setattr__(self, "n_classes", int(n_classes))
        object.__setattr__(self, "features", cols)
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "classes", classes)

    @property
    def is_table(self) -> bool:
        return self.features is not None

    @property
    def record_shape(self) -> tuple[int, ...]:
        """The shape of one record as the model sees it: (number of feature columns,) or the declared shape."""
        return (len(self.features),) if self.features is not None else tuple(self.shape or ())

    @property
    def n_channels(self) -> int:
        """How many means/stds a Scaling needs: one per feature column, or per channel (the shape's first axis)."""
        return self.record_shape[0]


@dataclass(frozen=True)
class Scaling:
    """Public per-feature (tables) or per-channel (arrays, images) statistics: records become (x - mean) / std.

    They must come from outside the clients' records (a published reference, domain knowledge); `dpfl` never fits
    them on the data (`refuse_fitted_scaling`).
    """

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        mean, std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        if len(mean) != len(std) or not mean:
            raise DataError(f"scaling: mean and std need one value per feature, got {len(mean)} and {len(std)}")
        if not all(math.isfinite(m) for m in mean) or not all(math.isfinite(s) and s > 0 for s in std):
            raise DataError("scaling: means must be finite and stds finite and > 0")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)

    def check(self, schema: SiloSchema) -> None:
        if len(self.mean) != schema.n_channels:
            what = "feature column" if schema.is_table else "channel (the shape's first axis)"
            raise DataError(f"scaling: {len(self.mean)} means and stds for {schema.n_channels} values (one per {what})")

    def apply(self, x: np.ndarray) -> np.ndarray:
        """(x - mean) / std along axis 1 (the features or channels of [N, C, ...] records)."""
        view = (1, len(self.mean)) + (1,) * (x.ndim - 2)
        mean = np.asarray(self.mean, dtype=np.float64).reshape(view)
        std = np.asarray(self.std, dtype=np.float64).reshape(view)
        return ((x - mean) / std).astype(np.float32)


def as_scaling(value: Any) -> Scaling | None:
    """A `Scaling` from what a caller may pass: None or "none" (no scaling), a `Scaling`, or a mapping with mean and
    std; a request to fit it on the data ("fit", "standardize", ...) is refused with the reason."""
    if value is None or value == "none":
        return None
    refuse_fitted_scaling(value)
    if isinstance(value, Scaling):
        return value
    if isinstance(value, Mapping) and set(value) == {"mean", "std"}:
        return Scaling(value["mean"], value["std"])
    raise DataError(f"scaling: expected None, 'none', a dpfl.Scaling or {{'mean': [...], 'std': [...]}}, got "
                    f"{type(value).__name__}")

"""privacy.json as a typed, read-only object: `PrivacyReport`, what `dpfl.run` returns as `outcome.privacy`.

The run writes privacy.json from a plain dict (`dpfl.experiment.privacy_report.privacy_summary`, plus the ledger);
this is the reader's side. The fields callers use are typed; every other key is kept in `extra`, and the file's key
order in `key_order`, so `to_dict()` gives back exactly the dict the file was written from (same keys, same order,
same values): `PrivacyReport.from_dict(d).to_dict() == d`, and privacy.json's format does not change.

Dict-style access (`report["unit"]`, `"fdp" in report`, `.get`, `.keys()`, `.items()`, iteration), what the dict
this replaces offered, still works for one release and emits a DeprecationWarning naming the attribute to use.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Self

from dpfl.results.run_files import read_privacy

__all__ = ["ClientPrivacy", "ClientSampling", "Guarantee", "PrivacyReport", "read_privacy_report"]


_TYPED_KEYS: dict[type, tuple[str, ...]] = {}


class _Record:
    """`from_dict` / `to_dict` for a frozen dataclass whose fields are named as its JSON keys, plus `extra` (the keys
    without a field) and `key_order` (the keys present, in order): to_dict(from_dict(d)) == d, key order included.
    A key absent from the JSON leaves its field at the default and stays absent in to_dict."""

    ONE: ClassVar[Mapping[str, type[_Record]]] = {}  # key -> the typed class of its object (or null)
    MANY: ClassVar[Mapping[str, type[_Record]]] = {}  # key -> the typed class of each object of its list
    extra: Mapping[str, Any]
    key_order: tuple[str, ...]

    @classmethod
    def typed_keys(cls) -> tuple[str, ...]:
        """The JSON keys that have a field of their own (every field but `extra` and `key_order`)."""
        keys = _TYPED_KEYS.get(cls)
        if keys is None:  # once per class: a report reads one object per client (100,000 clients: 100,000 calls)
            keys = _TYPED_KEYS[cls] = tuple(f.name for f in fields(cls)  # type: ignore[arg-type]
                                            if f.name not in ("extra", "key_order"))
        return keys

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        """The typed object of the JSON object `d`; `d` is copied, not kept (each value once: a typed sub-object
        copies its own, so a report's per-client list is not deep-copied again at every level)."""
        typed = cls.typed_keys()
        values: dict[str, Any] = {}
        for k in typed:
            if k not in d:
                continue
            v = d[k]
            if k in cls.ONE and v is not None:
                values[k] = cls.ONE[k].from_dict(v)
            elif k in cls.MANY and v is not None:
                values[k] = tuple(cls.MANY[k].from_dict(x) for x in v)
            else:
                values[k] = copy.deepcopy(v)
        extra = {k: copy.deepcopy(v) for k, v in d.items() if k not in typed}
        return cls(**values, extra=extra, key_order=tuple(d))  # type: ignore[call-arg]

    def to_dict(self) -> dict[str, Any]:
        """Exactly the JSON object this was read from: same keys, same order, same values."""
        typed = self.typed_keys()
        out: dict[str, Any] = {}
        for key in self.key_order:
            if key not in typed:
                out[key] = copy.deepcopy(self.extra[key])
                continue
            value = getattr(self, key)
            if key in self.ONE and value is not None:
                out[key] = value.to_dict()
            elif key in self.MANY and value is not None:
                out[key] = [x.to_dict() for x in value]
            else:
                out[key] = copy.deepcopy(value)
        return out


def _deprecated(what: str, instead: str) -> None:
    warnings.warn(f"{what} is deprecated (dict-style access to a typed result); use {instead} instead",
                  DeprecationWarning, stacklevel=3)


@dataclass(frozen=True)
class ClientSampling(_Record):
    """privacy.json `client_sampling`: how clients were drawn each round (kind all / fixed / poisson)."""

    kind: str | None = None
    k: int | None = None
    rate: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)
    key_order: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class ClientPrivacy(_Record):
    """One row of privacy.json `clients`: a client's budget, noise and epsilons (FORMATS.md says which is which).

    epsilon_guarantee is the run's guarantee for this client at its `delta`; epsilon_spent the ledger's (budgets are
    enforced on it); epsilon_heuristic, present only under PFA's heuristic calibration, is NOT a guarantee.
    """

    client: int
    epsilon_budget: float | None = None
    delta: float | None = None
    noise_multiplier: float | None = None
    batch_size: int | None = None
    records: int | None = None
    epsilon_spent: float | None = None
    epsilon_reported: float | None = None
    epsilon_heuristic: float | None = None
    epsilon_guarantee: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)
    key_order: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class Guarantee(_Record):
    """privacy.json `guarantee`: the run's one epsilon (the largest client guarantee), which number it is
    (`source`), and the other epsilons privacy.json reports with why each is not the guarantee."""

    epsilon_max: float | None = None
    source: str | None = None
    unit: str | None = None
    observer: str | None = None
    other_epsilons: list[dict[str, Any]] | None = None
    note: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)
    key_order: tuple[str, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class PrivacyReport(_Record):
    """What a run promises, as its privacy.json says: the threat model, each client's budget, noise and guarantee.

    A field is None (clients: empty) where privacy.json has no such key; `key_order` lists the keys it has, in order.
    `extra` holds the blocks without a field of their own (fdp, aggregate_view, secure_aggregation, ledger,
    eps_per_participation, ...), as in the file. `rigorous` / `caveats` say whether the guarantee holds as stated.
    """

    algorithm: str | None = None
    unit: str | None = None
    observer: str | None = None
    mechanism: str | None = None
    accountant: str | None = None
    client_sampling: ClientSampling | None = None
    local_sampling: str | None = None
    stop_reason: str | None = None
    accounted: bool = False
    oracle: bool | None = None
    warning: str | None = None
    clients: tuple[ClientPrivacy, ...] = ()
    calibrated_to: str | float | None = None
    calibration: str | None = None
    heuristic: str | None = None
    meets_budgets: bool | None = None
    noise_calibration: Mapping[str, Any] | None = None
    per_upload_amplification: str | None = None
    guarantee: Guarantee | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)  # the ledger alone may be megabytes
    key_order: tuple[str, ...] = field(default=(), repr=False)
    ONE: ClassVar[Mapping[str, type[_Record]]] = {"client_sampling": ClientSampling, "guarantee": Guarantee}
    MANY: ClassVar[Mapping[str, type[_Record]]] = {"clients": ClientPrivacy}

    # ---- per client ----------------------------------------------------------------------------------
    @property
    def epsilon(self) -> tuple[float | None, ...]:
        """Each client's guarantee (clients[].epsilon_guarantee, at its own delta), in client order."""
        return tuple(c.epsilon_guarantee for c in self.clients)

    @property
    def delta(self) -> tuple[float | None, ...]:
        return tuple(c.delta for c in self.clients)

    @property
    def epsilon_budget(self) -> tuple[float | None, ...]:
        return tuple(c.epsilon_budget for c in self.clients)

    @property
    def epsilon_spent(self) -> tuple[float | None, ...]:
        """The ledger's epsilon per client (budgets are enforced on it; not always the guarantee, see `guarantee`)."""
        return tuple(c.epsilon_spent for c in self.clients)

    @property
    def noise_multiplier(self) -> tuple[float | None, ...]:
        return tuple(c.noise_multiplier for c in self.clients)

    @property
    def epsilon_max(self) -> float | None:
        """The run's one epsilon (guarantee.epsilon_max), None for a run without a guarantee."""
        return None if self.guarantee is None else self.guarantee.epsilon_max

    @property
    def noise_source(self) -> str | None:
        """Where the noise came from: the calibration method (`accountant`, `pfa-heuristic`) when the noise was
        calibrated from the budgets, `configured` when it was given (an accounted run without a calibration block),
        None for a run without accounting."""
        if self.noise_calibration is not None:
            return self.noise_calibration.get("method")
        return "configured" if self.accounted else None

    # ---- is the guarantee rigorous -------------------------------------------------------------------
    @property
    def caveats(self) -> tuple[str, ...]:
        """Why the run's guarantee does not hold as stated, from privacy.json's own labels; empty when it does.

        Read from: `accounted` and `warning` (no epsilon, or budgets overspent), `meets_budgets`, `heuristic` (noise
        from PFA's formula: the budgets are not met by construction, though epsilon_guarantee stays the
        accountant's epsilon of the noise used), `per_upload_amplification` (an ASSUMPTION about the server),
        the f-DP headline `shifted-interpolation` (an ASSUMED smoothness L), and any UNACCOUNTED stage in the
        `secure_aggregation` block.
        """
        out = []
        if not self.accounted:
            out.append("not accounted (accounted): the run reports no epsilon")
        if self.warning:
            out.append(f"warning (warning): {self.warning}")
        if self.meets_budgets is False:
            out.append("budget violation (meets_budgets): false, some client spent more than its budget")
        if self.heuristic:
            out.append(f"heuristic calibration (heuristic): {self.heuristic}")
        if self.per_upload_amplification:
            out.append(f"assumption (per_upload_amplification): {self.per_upload_amplification}")
        fdp = self.extra.get("fdp")
        if isinstance(fdp, Mapping) and fdp.get("headline") == "shifted-interpolation":
            out.append("assumption (fdp.headline): the guarantee is the shifted-interpolation bound, which holds only "
                       "if the loss is L-smooth with the ASSUMED L")
        secure = self.extra.get("secure_aggregation")
        if isinstance(secure, Mapping):
            out.extend(f"unaccounted stage (secure_aggregation.{k}): {v}" for k, v in secure.items()
                       if isinstance(v, str) and v.startswith("UNACCOUNTED"))
        return tuple(out)

    @property
    def rigorous(self) -> bool:
        """True when the run is accounted and its guarantee holds with nothing heuristic, assumed, unaccounted or
        violated (no `caveats`)."""
        return not self.caveats

    # ---- dict-style access: deprecated, for one release ----------------------------------------------
    def _replacement(self, key: str) -> str:
        if key in PrivacyReport.typed_keys():
            return f"PrivacyReport.{key}"
        return f"PrivacyReport.extra[{key!r}]"

    def __getitem__(self, key: str) -> Any:
        _deprecated(f"PrivacyReport[{key!r}]", self._replacement(key))
        if key not in self.key_order:
            raise KeyError(key)
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        _deprecated(f"PrivacyReport.get({key!r})", self._replacement(key))
        return self.to_dict()[key] if key in self.key_order else default

    def __contains__(self, key: object) -> bool:
        _deprecated(f"{key!r} in PrivacyReport", "PrivacyReport.key_order (the keys privacy.json has)")
        return key in self.key_order

    def __iter__(self) -> Iterator[str]:
        _deprecated("iterating a PrivacyReport", "PrivacyReport.key_order or PrivacyReport.to_dict()")
        return iter(self.key_order)

    def __len__(self) -> int:
        _deprecated("len(PrivacyReport)", "len(PrivacyReport.key_order)")
        return len(self.key_order)

    def __bool__(self) -> bool:
        """Always true, as privacy.json's dict always was (it has `accounted`); defined so that `if report:` does
        not go through the deprecated __len__."""
        return True

    def keys(self) -> Any:
        _deprecated("PrivacyReport.keys()", "PrivacyReport.key_order")
        return self.to_dict().keys()

    def items(self) -> Any:
        _deprecated("PrivacyReport.items()", "PrivacyReport.to_dict().items()")
        return self.to_dict().items()

    def values(self) -> Any:
        _deprecated("PrivacyReport.values()", "PrivacyReport.to_dict().values()")
        return self.to_dict().values()


def read_privacy_report(run_dir: str | os.PathLike[str]) -> PrivacyReport:
    """A run directory's privacy.json as a `PrivacyReport` (checked as `read_privacy` checks it)."""
    return PrivacyReport.from_dict(read_privacy(run_dir))

"""``dpfl.privacy.ledger`` as it was before its per-client state became arrays (a dict per client of relation, last
event and history; commit ae50569), kept verbatim below this note as the reference that ``test_ledger_arrays``
checks the array-backed ledger against: the same answers, the same ``to_dict``.

Per-client privacy ledgers: which DP events touched each client's data, and what that costs.

Each client has its own delta, optional epsilon budget, neighbouring relation and list of events. The
spent epsilon is always the accountant's epsilon of the composition of the client's recorded events
(never a running sum of per-round epsilons). Storage is built for large populations:

* the log stores each ``record_many`` call once, as (round, event id, clients), with each distinct
  event stored once;
* accounting uses per-client counts of identical events, so a client's ledger is a short signature
  {event id: count}; epsilons are cached per (signature, delta), so clients with the same history are
  accounted once, and a budget check for a recorded event shares its entry with the spent epsilon after
  recording it. With the RDP accountant each distinct event's curve is computed once (from the shared
  curve cache) and a signature's epsilon is ``sum(count x curve)`` converted over the orders in one step.

The relation (add/remove for Poisson or full-batch, replace-one for fixed-size sampling) is detected
from the events and stored per client; mixing relations for one client raises, because the resulting
epsilons would not be comparable. ``to_dict``/``from_dict`` round-trip exactly for checkpoints.
"""

from __future__ import annotations

import bisect
import dataclasses
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dp_accounting as dpa
import numpy as np

from dpfl.privacy.accountant import (
    ACCOUNTANTS,
    Accountant,
    Guarantee,
    check_gdp_supports,
    check_pld_supports,
    epsilon,
    rdp_to_epsilon,
)
from dpfl.privacy.events import ADD_REMOVE, describe_event, neighboring_relation
from dpfl.privacy.orders import normalize_orders
from dpfl.privacy.rdp_curves import RDP_CURVES
from dpfl.privacy.serialization import decode_float, encode_float, event_from_dict, event_to_dict

__all__ = ["LedgerEntry", "PrivacyLedger", "UNITS", "index_by_identity"]

UNITS: tuple[str, ...] = ("sample", "client")
_FORMAT = "dpfl.privacy_ledger"
_VERSION = 1
_EPS_CACHE_MAX = 1 << 16


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One recorded event of one client, with the relation its epsilon is computed under."""

    round: int
    event: dpa.DpEvent
    relation: str


def _client_id(value: object) -> int:
    if type(value) is int:  # fast path: record_many touches every participant
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"client ids must be integers, got {value!r}")
    return int(value)


def _round(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 0:
        raise ValueError(f"round_ must be an integer >= 0, got {value!r}")
    return int(value)


def _per_client(
    name: str, value: Mapping[int, float] | float | None, clients: Sequence[int], check
) -> dict[int, float | None]:
    if value is None:
        return {c: None for c in clients}
    if isinstance(value, Mapping):
        mapping = {_client_id(k): v for k, v in value.items()}
        missing = [c for c in clients if c not in mapping]
        if missing:
            raise ValueError(f"{name} has no value for clients {missing[:10]}")
        extra = sorted(set(mapping) - set(clients))
        if extra:
            raise ValueError(f"{name} names unknown clients {extra[:10]}")
        return {c: check(f"{name}[{c}]", mapping[c]) for c in clients}
    v = check(name, value)
    return {c: v for c in clients}


def _check_delta(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0.0 < float(value) < 1.0):
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    return float(value)


def _check_budget(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value) > 0.0:
        raise ValueError(f"{name} must be a number > 0 (inf for unlimited), got {value!r}")
    return float(value)


def index_by_identity(events: Iterable[dpa.DpEvent | None]) -> tuple[np.ndarray, list[dpa.DpEvent | None]]:
    """(for each event, its index among the distinct objects; those objects): the `event_index, events` pair of
    `PrivacyLedger.exceeding_mask` for one event per client, where clients with equal events share one object."""
    index: list[int] = []
    distinct: list[dpa.DpEvent | None] = []
    seen: dict[int, int] = {}  # id(event) -> its index in `distinct` (which keeps the object alive)
    for event in events:
        k = seen.get(id(event))
        if k is None:
            k = seen[id(event)] = len(distinct)
            distinct.append(event)
        index.append(k)
    return np.array(index, dtype=np.int64), distinct


class PrivacyLedger:
    """Per-client DP event ledgers with per-client delta, budget, relation and spent epsilon."""

    def __init__(
        self,
        client_ids: Iterable[int],
        deltas: Mapping[int, float] | float,
        budgets: Mapping[int, float] | float | None = None,
        accountant: Accountant = "rdp",
        unit: str = "sample",
        *,
        orders: Sequence[float] | None = None,
    ) -> None:
        clients = [_client_id(c) for c in client_ids]
        if len(set(clients)) != len(clients):
            raise ValueError("client_ids contains duplicates")
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
        self.accountant: str = accountant
        self.unit: str = unit
        self.orders: tuple[float, ...] | None = None if orders is None else normalize_orders(orders)
        self._clients: list[int] = clients
        self._known: set[int] = set(clients)
        delta_of = _per_client("deltas", deltas, clients, _check_delta)
        budget_of = _per_client("budgets", budgets, clients, _check_budget)
        self._events: list[dpa.DpEvent] = []
        self._event_ids: dict[str, int] = {}
        self._event_relation: list[str] = []
        self._log: list[tuple[int, int, tuple[int, ...]]] = []
        self._relation: dict[int, str] = {}
        self._last_event: dict[int, int] = {}
        self._user_meta: dict[int, dict[str, Any]] = {}
        self._history: dict[int, list[tuple[int, float]]] = {}
        self._dirty: set[int] = set()
        self._open_round: int | None = None  # largest round recorded since the last close_round
        self._closed_round: int | None = None
        self._eps_cache: dict[tuple, float] = {}
        self._curves: dict[int, np.ndarray] = {}  # event id -> its RDP curve at the ledger's orders ("rdp" only)
        # Clients grouped by history: clients with the same signature (events and counts) are one class, so a
        # population's budget check and spent epsilons are answered once per class (`exceeding_mask`,
        # `spent_array`) with per-client work left to numpy. Class 0 is the empty history. A client's signature,
        # delta and budget are read from these arrays at its position (`_at`).
        self._ids = np.array(clients, dtype=np.int64)
        self._ids_are_positions = bool(np.array_equal(self._ids, np.arange(len(clients))))  # a run's 0..n-1
        self._position = None if self._ids_are_positions else {c: i for i, c in enumerate(clients)}
        self._class = np.zeros(len(clients), dtype=np.int64)
        self._class_signature: list[tuple[tuple[int, int], ...]] = [()]
        self._class_of_signature: dict[tuple[tuple[int, int], ...], int] = {(): 0}
        self._class_after: dict[tuple[int, int], int] = {}  # (class, event id) -> the class after that event
        self._delta_array = np.array([delta_of[c] for c in clients], dtype=np.float64)
        # nan: no budget (a budget itself is > 0, never nan)
        self._budget_array = np.array([np.nan if budget_of[c] is None else budget_of[c] for c in clients],
                                      dtype=np.float64)

    # ------------------------------------------------------------------ queries on configuration
    @property
    def client_ids(self) -> list[int]:
        return list(self._clients)

    def delta(self, client_id: int) -> float:
        return self._delta(self._check_client(client_id))

    def budget(self, client_id: int) -> float | None:
        return self._budget(self._check_client(client_id))

    def _at(self, c: int) -> int:
        """The position of known client `c` in the per-client arrays."""
        return c if self._position is None else self._position[c]

    def _delta(self, c: int) -> float:
        return float(self._delta_array[self._at(c)])

    def _budget(self, c: int) -> float | None:
        budget = float(self._budget_array[self._at(c)])
        return None if budget != budget else budget  # nan: no budget

    def relation(self, client_id: int) -> str | None:
        """``"add_remove"``/``"replace_one"`` once the client has events, else None."""
        return self._relation.get(self._check_client(client_id))

    def _check_client(self, client_id: object) -> int:
        c = client_id if type(client_id) is int else _client_id(client_id)
        if c not in self._known:
            raise ValueError(f"unknown client_id {c}; this ledger holds {len(self._clients)} clients")
        return c

    # ------------------------------------------------------------------ recording
    def _relation_of(self, event: dpa.DpEvent) -> str:
        """The event's neighbouring relation, if this ledger's accountant can account it."""
        if self.accountant == "pld":
            check_pld_supports(event)
        elif self.accountant == "gdp":
            check_gdp_supports(event)
        return neighboring_relation(event)

    def _check_relation(self, client_id: int, relation: str) -> None:
        have = self._relation.get(client_id)
        if have is not None and have != relation:
            raise ValueError(
                f"client {client_id} has {have} events; cannot add a {relation} event. "
                "Poisson/full-batch (add/remove) and fixed-size (replace-one) epsilons are not "
                "comparable, so one client's ledger must use one sampling kind"
            )

    def _intern(self, event: dpa.DpEvent, relation: str) -> int:
        key = repr(event)
        eid = self._event_ids.get(key)
        if eid is None:
            eid = len(self._events)
            self._events.append(event)
            self._event_ids[key] = eid
            self._event_relation.append(relation)
        return eid

    def record(self, client_id: int, round_: int, event: dpa.DpEvent) -> None:
        """Append ``event`` (e.g. one round of local DP-SGD) to one client's ledger."""
        self.record_many([client_id], round_, event)

    def record_many(self, client_ids: Iterable[int], round_: int, event: dpa.DpEvent) -> None:
        """Append the same ``event`` to several clients' ledgers; stored once, O(1) work per client."""
        r = _round(round_)
        clients = [self._check_client(c) for c in client_ids]
        if len(set(clients)) != len(clients):
            raise ValueError(f"client_ids for round {r} contains duplicates; each client is recorded once")
        if self._closed_round is not None and r <= self._closed_round:
            raise ValueError(f"round_={r} is already closed (last closed round {self._closed_round})")
        if not isinstance(event, dpa.DpEvent):
            raise ValueError(f"event must be a dp_accounting DpEvent, got {type(event).__name__}")
        relation = self._relation_of(event)
        for c in clients:  # validate everything before mutating anything
            self._check_relation(c, relation)
        eid = self._intern(event, relation)
        if not clients:
            return
        self._log.append((r, eid, tuple(sorted(clients))))
        positions = np.fromiter((self._at(c) for c in clients), dtype=np.int64, count=len(clients))
        before = self._class[positions]
        for old in np.unique(before).tolist():
            self._class[positions[before == old]] = self._next_class(old, eid)
        for c in clients:
            self._relation[c] = relation
            self._last_event[c] = eid
        self._dirty.update(clients)
        self._open_round = r if self._open_round is None else max(self._open_round, r)

    def close_round(self, round_: int) -> None:
        """Log (round, spent epsilon) for every client with events since the last close."""
        r = _round(round_)
        if self._closed_round is not None and r <= self._closed_round:
            raise ValueError(f"round_={r} must be > the last closed round {self._closed_round}")
        if self._open_round is not None and r < self._open_round:
            raise ValueError(f"round_={r} is before recorded round {self._open_round}; close that round")
        for c in sorted(self._dirty):
            self._history.setdefault(c, []).append((r, self._spent_of(c)))
        self._dirty.clear()
        self._open_round = None
        self._closed_round = r

    def _next_class(self, current: int, eid: int) -> int:
        """The class of a history of class `current` after one more event `eid`."""
        after = self._class_after.get((current, eid))
        if after is None:
            counts = dict(self._class_signature[current])
            counts[eid] = counts.get(eid, 0) + 1
            signature = tuple(sorted(counts.items()))
            after = self._class_of_signature.get(signature)
            if after is None:
                after = self._class_of_signature[signature] = len(self._class_signature)
                self._class_signature.append(signature)
            self._class_after[(current, eid)] = after
        return after

    def _positions(self, client_ids: np.ndarray) -> np.ndarray:
        """Positions of `client_ids` in the ledger's client list (unknown ids refused, as `_check_client` does)."""
        ids = np.asarray(client_ids, dtype=np.int64)
        if self._position is None:
            bad = (ids < 0) | (ids >= len(self._ids))
            if bad.any():
                self._check_client(int(ids[bad][0]))
            return ids
        return np.fromiter((self._at(self._check_client(int(c))) for c in ids), dtype=np.int64, count=len(ids))

    # ------------------------------------------------------------------ accounting
    def _signature(self, client_id: int) -> tuple[tuple[int, int], ...]:
        """The client's events and their counts, sorted by event id: its history class's signature."""
        return self._class_signature[int(self._class[self._at(client_id)])]

    def _epsilon(self, signature: tuple, extra: dpa.DpEvent | None, delta: float) -> float:
        """Epsilon at ``delta`` of the events counted in ``signature`` plus ``extra``.

        An ``extra`` event the ledger already holds is folded into the signature, so a budget check
        (``epsilon_if``) and the spent epsilon after recording that event share one cache entry: the value
        checked against the budget is the value later reported.
        """
        extra_key = None
        if extra is not None:
            extra_key = repr(extra)
            eid = self._event_ids.get(extra_key)
            if eid is not None:
                counts = dict(signature)
                counts[eid] = counts.get(eid, 0) + 1
                signature, extra, extra_key = tuple(sorted(counts.items())), None, None
        key = (signature, extra_key, delta)
        cached = self._eps_cache.get(key)
        if cached is not None:
            return cached
        if not signature and extra is None:
            eps = 0.0
        elif self.accountant == "rdp":
            eps = self._rdp_epsilon(signature, extra, delta)
        else:
            parts: list[dpa.DpEvent] = [dpa.SelfComposedDpEvent(self._events[eid], n) for eid, n in signature]
            if extra is not None:
                parts.append(extra)
            eps = epsilon(dpa.ComposedDpEvent(parts), delta, self.accountant, self.orders)
        if len(self._eps_cache) >= _EPS_CACHE_MAX:
            self._eps_cache.clear()
        self._eps_cache[key] = eps
        return eps

    def _rdp_epsilon(self, signature: tuple, extra: dpa.DpEvent | None, delta: float) -> float:
        """``epsilon(ComposedDpEvent([SelfComposedDpEvent(event, n), ..., extra]), delta, "rdp", orders)`` from
        each event's cached RDP curve, composed in the same order with the same arithmetic."""
        orders = normalize_orders(self.orders)
        total = np.zeros(len(orders))
        for eid, n in signature:
            curve = self._curves.get(eid)
            if curve is None:
                curve = self._curves[eid] = RDP_CURVES.curve(self._events[eid], orders)
            total = total + n * curve
        if extra is not None:
            total = total + RDP_CURVES.curve(extra, orders)
        return rdp_to_epsilon(orders, total, delta)[0]

    def spent(self, client_id: int) -> float:
        """Epsilon at the client's delta of all its recorded events (0 without events)."""
        return self._spent_of(self._check_client(client_id))

    def _spent_of(self, c: int) -> float:
        return self._epsilon(self._signature(c), None, self._delta(c))  # cached per (signature, delta)

    def spent_all(self) -> dict[int, float]:
        return dict(zip(self._clients, self.spent_array().tolist(), strict=True))

    def epsilon_if(self, client_id: int, extra_event: dpa.DpEvent) -> float:
        """Epsilon the client would have spent after ``extra_event`` too (budget pre-check)."""
        c = self._check_client(client_id)
        self._check_relation(c, self._relation_of(extra_event))
        return self._epsilon(self._signature(c), extra_event, self._delta(c))

    def would_exceed(self, client_id: int, extra_event: dpa.DpEvent, tol: float = 1e-9) -> bool:
        """True iff ``epsilon_if(client_id, extra_event) > budget * (1 + tol)``."""
        c = self._check_client(client_id)
        budget = self._budget(c)
        if budget is None:
            raise ValueError(f"client {c} has no epsilon budget; pass budgets= to PrivacyLedger")
        if not tol >= 0.0:
            raise ValueError(f"tol must be >= 0, got {tol}")
        if budget == float("inf"):  # nothing exceeds an unlimited budget: skip the accountant
            return False
        return self.epsilon_if(c, extra_event) > budget * (1.0 + tol)

    def exceeding(self, checks: Iterable[tuple[int, dpa.DpEvent]], tol: float = 1e-9) -> set[int]:
        """The clients among ``(client, event)`` pairs for which ``would_exceed(client, event, tol)`` is True.

        Each check is answered once per distinct (history, budget, delta, event object), by `exceeding_mask`: in a
        large population most clients share all of these. Pass the same event object for clients whose events are
        equal to profit from it.
        """
        pairs = [(self._check_client(client_id), event) for client_id, event in checks]
        for c, event in pairs:
            if not isinstance(event, dpa.DpEvent):
                raise ValueError(f"exceeding: client {c}'s event must be a DpEvent, got {event!r}")
        ids = np.array([c for c, _ in pairs], dtype=np.int64)
        index, events = index_by_identity(event for _, event in pairs)
        return set(ids[self.exceeding_mask(ids, index, events, tol)].tolist())

    def exceeding_mask(self, client_ids: np.ndarray, event_index: np.ndarray,
                       events: Sequence[dpa.DpEvent | None], tol: float = 1e-9) -> np.ndarray:
        """`exceeding` for a population at once: True where client `client_ids[j]`'s event `events[event_index[j]]`
        would take it past its budget (an index of -1, or a None event, checks nothing).

        Answered once per distinct (history class, event, budget, delta) with `would_exceed` on one client of
        it, so the work per client is numpy's, not Python's: clients of one class have the same events, so the
        same relation and the same answer.
        """
        ids = np.asarray(client_ids, dtype=np.int64)
        index = np.asarray(event_index, dtype=np.int64)
        if ids.shape != index.shape or ids.ndim != 1:
            raise ValueError(f"client_ids and event_index must be 1-D of one length, got {ids.shape}, {index.shape}")
        absent = np.array([e is None for e in events] + [True], dtype=bool)  # index -1: the appended True
        checked = ~absent[index]
        out = np.zeros(len(ids), dtype=bool)
        if not checked.any():
            return out
        ids, index = ids[checked], index[checked]
        pos = self._positions(ids)
        keys = np.stack([self._class[pos].astype(np.float64), index.astype(np.float64),
                         self._budget_array[pos], self._delta_array[pos]], axis=1)
        unique, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        answers = np.array([self.would_exceed(int(ids[j]), events[int(index[j])], tol)  # type: ignore[arg-type]
                            for j in first.tolist()], dtype=bool)
        out[checked] = answers[inverse.reshape(-1)]
        return out

    def spent_array(self) -> np.ndarray:
        """`spent` of every client in `client_ids` order, computed once per distinct (history class, delta)."""
        keys = np.stack([self._class.astype(np.float64), self._delta_array], axis=1)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        eps = np.array([self._epsilon(self._class_signature[int(k)], None, float(d)) for k, d in unique.tolist()],
                       dtype=np.float64)
        return eps[inverse.reshape(-1)] if len(keys) else np.zeros(0)

    def guarantee(self, client_id: int) -> Guarantee:
        """The client's spent epsilon, labelled with its delta, relation, accountant and unit."""
        c = self._check_client(client_id)
        return Guarantee(
            self.spent(c), self._delta(c), self._relation.get(c, ADD_REMOVE), self.accountant, self.unit  # type: ignore[arg-type]
        )

    # ------------------------------------------------------------------ history and metadata
    def history(self, client_id: int) -> list[tuple[int, float]]:
        """(round, epsilon spent after that round) for each closed round in which the client had events."""
        return list(self._history.get(self._check_client(client_id), []))

    def entries(self, client_id: int) -> list[LedgerEntry]:
        """The client's recorded events in recording order."""
        c = self._check_client(client_id)
        out = []
        for r, eid, clients in self._log:
            i = bisect.bisect_left(clients, c)
            if i < len(clients) and clients[i] == c:
                out.append(LedgerEntry(r, self._events[eid], self._event_relation[eid]))
        return out

    def set_metadata(self, client_id: int, **fields: Any) -> None:
        """Attach JSON-able facts about a client's mechanism (e.g. clip norm, calibration mode)."""
        c = self._check_client(client_id)
        for k, v in fields.items():
            if not (v is None or isinstance(v, (bool, int, float, str))):
                raise ValueError(f"metadata {k}={v!r} must be None, bool, int, float or str")
        self._user_meta.setdefault(c, {}).update(fields)

    def metadata(self, client_id: int) -> dict[str, Any]:
        """Mechanism facts read from the client's latest event, overridden by ``set_metadata``."""
        c = self._check_client(client_id)
        out: dict[str, Any] = {
            "relation": self._relation.get(c),
            "unit": self.unit,
            "accountant": self.accountant,
            "delta": self._delta(c),
            "budget": self._budget(c),
        }
        eid = self._last_event.get(c)
        info = describe_event(self._events[eid]) if eid is not None else None
        if info is not None:
            out.update(
                sampling=info.sampling,
                noise_multiplier=info.noise_multiplier,
                sample_rate=info.sample_rate,
                steps_per_round=info.steps,
                population=info.population,
                sample_size=info.sample_size,
            )
        out.update(self._user_meta.get(c, {}))
        return out

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot; ``from_dict(to_dict())`` restores an identical ledger."""
        budgets = [self._budget(c) for c in self._clients]  # all None or all numbers (constructor)
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "accountant": self.accountant,
            "unit": self.unit,
            "orders": None if self.orders is None else list(self.orders),
            "clients": list(self._clients),
            "deltas": self._delta_array.tolist(),
            "budgets": None if budgets[:1] == [None] else [encode_float(b) for b in budgets],  # type: ignore[arg-type]
            "events": [event_to_dict(e) for e in self._events],
            "log": [[r, eid, list(clients)] for r, eid, clients in self._log],
            "relations": [[c, self._relation[c]] for c in self._clients if c in self._relation],
            "history": [[c, [[r, encode_float(e)] for r, e in self._history[c]]]
                        for c in self._clients if c in self._history],
            "open_clients": sorted(self._dirty),
            "open_round": self._open_round,
            "closed_round": self._closed_round,
            "metadata": [[c, dict(self._user_meta[c])] for c in self._clients if c in self._user_meta],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyLedger:
        if data.get("format") != _FORMAT or data.get("version") != _VERSION:
            raise ValueError(
                f"not a {_FORMAT} v{_VERSION} payload (format={data.get('format')!r}, version={data.get('version')!r})"
            )
        clients = list(data["clients"])
        budgets = data["budgets"]
        ledger = cls(
            clients,
            dict(zip(clients, data["deltas"], strict=True)),
            None if budgets is None else {c: decode_float(b) for c, b in zip(clients, budgets, strict=True)},
            data["accountant"],
            data["unit"],
            orders=data["orders"],
        )
        for e in data["events"]:
            event = event_from_dict(e)
            ledger._intern(event, ledger._relation_of(event))
        if len(ledger._events) != len(data["events"]):
            raise ValueError("payload lists the same event twice")
        for r, eid, members in data["log"]:
            if not (isinstance(eid, int) and 0 <= eid < len(ledger._events)):
                raise ValueError(f"log entry refers to unknown event id {eid!r}")
            ledger.record_many(members, r, ledger._events[eid])
        stored = {int(c): rel for c, rel in data["relations"]}
        if stored != ledger._relation:
            raise ValueError("payload relations do not match its events")
        ledger._history = {int(c): [(int(r), decode_float(e)) for r, e in h] for c, h in data["history"]}
        ledger._dirty = {ledger._check_client(c) for c in data["open_clients"]}
        ledger._open_round = data["open_round"]
        ledger._closed_round = data["closed_round"]
        ledger._user_meta = {int(c): dict(m) for c, m in data["metadata"]}
        return ledger

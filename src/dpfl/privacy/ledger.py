"""Per-client privacy ledgers: which DP events touched each client's data, and what that costs.

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
from the events and kept per history class; mixing relations for one client raises, because the resulting
epsilons would not be comparable. ``to_dict``/``from_dict`` round-trip exactly for checkpoints.

A client's standing state is a few numbers in arrays indexed by its position (history class, delta, budget, the
group of its (budget, delta), its last event: 36 bytes), never a Python object per client, so a ledger of
10,000,000 clients fits in memory; the history and the log grow with the participations, one array per round.
"""

from __future__ import annotations

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
    check_prv_supports,
    epsilon,
    rdp_to_epsilon,
)
from dpfl.privacy.events import ADD_REMOVE, describe_event, neighboring_relation
from dpfl.privacy.orders import normalize_orders
from dpfl.privacy.prv import prv_bounds
from dpfl.privacy.rdp_curves import RDP_CURVES
from dpfl.privacy.serialization import decode_float, encode_float, event_from_dict, event_to_dict

__all__ = ["LedgerEntry", "PrivacyLedger", "UNITS", "group_keys", "group_rows", "index_by_identity"]

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


def _per_client_array(name: str, value: Mapping[int, float] | Sequence[float] | np.ndarray | float | None,
                      clients: np.ndarray, check) -> np.ndarray:
    """One float per client in `clients` order (nan: none): from a mapping client -> value, an array or list aligned
    with the clients (checked with numpy, not one by one), a scalar, or None (nan for everyone)."""
    n = len(clients)
    if value is None:
        return np.full(n, np.nan, dtype=np.float64)
    if isinstance(value, (np.ndarray, list, tuple)):
        arr = np.asarray(value)
        if arr.shape != (n,):
            raise ValueError(f"{name} has {len(arr)} values for {n} clients")
        if arr.dtype.kind not in "fiu":  # objects, booleans: the scalar check names the first bad one
            return np.array([check(f"{name}[{c}]", v) for c, v in zip(clients.tolist(), arr.tolist(), strict=True)],
                            dtype=np.float64)
        arr = arr.astype(np.float64)
        valid = ((arr > 0.0) & (arr < 1.0)) if name == "deltas" else (arr > 0.0)
        if not valid.all():
            j = int(np.flatnonzero(~valid)[0])
            check(f"{name}[{int(clients[j])}]", float(arr[j]))
        return arr
    if isinstance(value, Mapping):
        mapped = _per_client(name, value, clients.tolist(), check)
        return np.array([mapped[c] for c in clients.tolist()], dtype=np.float64)
    return np.full(n, check(name, value), dtype=np.float64)


def group_rows(columns: Sequence[np.ndarray]) -> np.ndarray:
    """For each row of the equal-length `columns` (numbers), the index of its distinct row (0, 1, ...): the key
    `group_keys` groups by, made without a sort of the rows where a column holds one value for everyone."""
    code = np.zeros(len(columns[0]) if columns else 0, dtype=np.int64)
    for column in columns:
        values = np.asarray(column)
        if not len(values) or bool((values == values[0]).all()):
            continue  # one value: it splits nothing
        inverse = np.unique(values, return_inverse=True)[1].reshape(-1).astype(np.int64)
        width = int(inverse.max()) + 1
        if (int(code.max()) + 1) * width >= 2**62:  # keep the combined code in int64: renumber it densely first
            code = np.unique(code, return_inverse=True)[1].reshape(-1).astype(np.int64)
        code = code * width + inverse
    return code


def group_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Public name of `_groups`: (one position per distinct key, each key's group) of non-negative int64 keys."""
    return _groups(keys)


def _groups(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(one position of each distinct key, for each key the index of its distinct key), like `np.unique`'s
    `return_index`/`return_inverse` of non-negative int64 `keys`, but in one pass where the keys are few and small
    (a population's history classes): a round's check costs O(clients), not a sort of them."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    top = int(keys.max()) + 1
    if top > 4 * len(keys) + 1024:
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        return first.astype(np.int64), inverse.reshape(-1).astype(np.int64)
    one = np.full(top, -1, dtype=np.int64)
    one[keys] = np.arange(len(keys), dtype=np.int64)  # some position of each key (which one does not matter)
    present = np.flatnonzero(one >= 0)
    rank = np.zeros(top, dtype=np.int64)
    rank[present] = np.arange(len(present), dtype=np.int64)
    return one[present], rank[keys]


def _dense(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows of `values` (1- or 2-D float), each row's index among them as int32): a fixed per-client
    fact (delta, budget) made a small integer, so a grouped check combines it with others in one int64 key."""
    rows = values.reshape(len(values), -1)
    rows = np.where(np.isnan(rows), -1.0, rows)  # nan (no budget) as one value; a budget or delta is > 0
    if not len(rows) or (rows == rows[0]).all():  # one value for everyone (the common case): no sort
        return rows[:1].copy(), np.zeros(len(rows), dtype=np.int32)
    unique, inverse = np.unique(rows, axis=0, return_inverse=True)
    return unique, inverse.reshape(-1).astype(np.int32)


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


def _client_array(client_ids: Iterable[int]) -> np.ndarray:
    """`client_ids` as an int64 array: an integer array or a range at once, anything else checked one by one."""
    if isinstance(client_ids, range) and client_ids.step == 1:
        return np.arange(client_ids.start, client_ids.stop, dtype=np.int64)
    if isinstance(client_ids, np.ndarray) and client_ids.dtype.kind in "iu":
        return client_ids.astype(np.int64).reshape(-1)
    return np.array([_client_id(c) for c in client_ids], dtype=np.int64)


class PrivacyLedger:
    """Per-client DP event ledgers with per-client delta, budget, relation and spent epsilon.

    `deltas` and `budgets` are a mapping client -> value, one value for everyone, or (for a population) an array
    aligned with `client_ids`."""

    def __init__(
        self,
        client_ids: Iterable[int],
        deltas: Mapping[int, float] | Sequence[float] | np.ndarray | float,
        budgets: Mapping[int, float] | Sequence[float] | np.ndarray | float | None = None,
        accountant: Accountant = "rdp",
        unit: str = "sample",
        *,
        orders: Sequence[float] | None = None,
    ) -> None:
        ids = _client_array(client_ids)
        n = len(ids)
        self._ids_are_positions = bool(n == 0 or (ids[0] == 0 and (n == 1 or bool((np.diff(ids) == 1).all()))))
        self._order: np.ndarray | None = None  # positions sorted by client id (ids other than 0..n-1 only)
        self._sorted: np.ndarray | None = None  # the client ids sorted
        if not self._ids_are_positions:
            self._order = np.argsort(ids, kind="stable")
            self._sorted = ids[self._order]
            if n > 1 and bool((np.diff(self._sorted) == 0).any()):
                raise ValueError("client_ids contains duplicates")
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
        self.accountant: str = accountant
        self.unit: str = unit
        self.orders: tuple[float, ...] | None = None if orders is None else normalize_orders(orders)
        self._ids = ids
        if deltas is None:
            raise ValueError("deltas must be given (a number in (0, 1) per client)")
        self._delta_array = _per_client_array("deltas", deltas, ids, _check_delta)
        self._budget_array = _per_client_array("budgets", budgets, ids, _check_budget)  # nan: no budget
        if budgets is not None and np.isnan(self._budget_array).any():
            raise ValueError("budgets must give every client a number > 0 (inf for unlimited)")
        self._events: list[dpa.DpEvent] = []
        self._event_ids: dict[str, int] = {}
        self._event_relation: list[str] = []
        self._log: list[tuple[int, int, np.ndarray]] = []  # (round, event id, the client ids, sorted)
        self._user_meta: dict[int, dict[str, Any]] = {}
        # history: per closed round with participants, (round, their positions sorted, their spent epsilons)
        self._closes: list[tuple[int, np.ndarray, np.ndarray]] = []
        self._dirty: list[np.ndarray] = []  # positions recorded since the last close (may repeat)
        self._open_round: int | None = None  # largest round recorded since the last close_round
        self._closed_round: int | None = None
        self._eps_cache: dict[tuple, float] = {}
        self._curves: dict[int, np.ndarray] = {}  # event id -> its RDP curve at the ledger's orders ("rdp" only)
        # Clients grouped by history: clients with the same signature (events and counts) are one class, so a
        # population's budget check and spent epsilons are answered once per class (`exceeding_mask`,
        # `spent_array`) with per-client work left to numpy. Class 0 is the empty history. A client's class, delta,
        # budget and last event are read from these arrays at its position (`_at`); its relation is its class's.
        self._class = np.zeros(n, dtype=np.int32)
        self._class_count = [n]  # clients in each class (spent_counts without a pass over the population)
        self._last_event = np.full(n, -1, dtype=np.int32)
        self._class_signature: list[tuple[tuple[int, int], ...]] = [()]
        self._class_relation: list[str | None] = [None]
        self._class_of_signature: dict[tuple[tuple[int, int], ...], int] = {(): 0}
        self._class_after: dict[tuple[int, int], int] = {}  # (class, event id) -> the class after that event
        # fixed facts as small integers, for one int64 key per client in a grouped answer
        self._delta_values, self._delta_group = _dense(self._delta_array)
        self._bd_values, self._bd_group = _dense(np.stack([self._budget_array, self._delta_array], axis=1))

    # ------------------------------------------------------------------ queries on configuration
    @property
    def client_ids(self) -> list[int]:
        return self._ids.tolist()

    @property
    def client_ids_array(self) -> np.ndarray:
        """`client_ids` as a read-only int64 array (no list of a population)."""
        view = self._ids.view()
        view.flags.writeable = False
        return view

    def delta(self, client_id: int) -> float:
        return self._delta(self._check_client(client_id))

    def budget(self, client_id: int) -> float | None:
        return self._budget(self._check_client(client_id))

    def _at(self, c: int) -> int:
        """The position of known client `c` in the per-client arrays."""
        if self._ids_are_positions:
            return c
        assert self._sorted is not None and self._order is not None
        return int(self._order[int(np.searchsorted(self._sorted, c))])

    def _delta(self, c: int) -> float:
        return float(self._delta_array[self._at(c)])

    def _budget(self, c: int) -> float | None:
        budget = float(self._budget_array[self._at(c)])
        return None if budget != budget else budget  # nan: no budget

    def _relation_at(self, c: int) -> str | None:
        return self._class_relation[int(self._class[self._at(c)])]

    def relation(self, client_id: int) -> str | None:
        """``"add_remove"``/``"replace_one"`` once the client has events, else None."""
        return self._relation_at(self._check_client(client_id))

    def _check_client(self, client_id: object) -> int:
        c = client_id if type(client_id) is int else _client_id(client_id)
        if self._ids_are_positions:
            known = 0 <= c < len(self._ids)
        else:
            assert self._sorted is not None
            j = int(np.searchsorted(self._sorted, c))
            known = j < len(self._sorted) and int(self._sorted[j]) == c
        if not known:
            raise ValueError(f"unknown client_id {c}; this ledger holds {len(self._ids)} clients")
        return c

    # ------------------------------------------------------------------ recording
    def _relation_of(self, event: dpa.DpEvent) -> str:
        """The event's neighbouring relation, if this ledger's accountant can account it."""
        if self.accountant == "pld":
            check_pld_supports(event)
        elif self.accountant == "gdp":
            check_gdp_supports(event)
        elif self.accountant == "prv":
            check_prv_supports(event)
        return neighboring_relation(event)

    @staticmethod
    def _relation_refused(client_id: int, have: str, relation: str) -> ValueError:
        return ValueError(
            f"client {client_id} has {have} events; cannot add a {relation} event. "
            "Poisson/full-batch (add/remove) and fixed-size (replace-one) epsilons are not "
            "comparable, so one client's ledger must use one sampling kind"
        )

    def _check_relation(self, client_id: int, relation: str) -> None:
        have = self._relation_at(client_id)
        if have is not None and have != relation:
            raise self._relation_refused(client_id, have, relation)

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

    def record_many(self, client_ids: Iterable[int] | np.ndarray, round_: int, event: dpa.DpEvent) -> None:
        """Append the same ``event`` to several clients' ledgers (a list, or an integer array for a population at
        once); stored once, numpy's work per client."""
        r = _round(round_)
        ids = self._known_ids(client_ids)
        pos = self._positions(ids)
        if len(pos) > 1 and len(np.unique(pos)) != len(pos):
            raise ValueError(f"client_ids for round {r} contains duplicates; each client is recorded once")
        if self._closed_round is not None and r <= self._closed_round:
            raise ValueError(f"round_={r} is already closed (last closed round {self._closed_round})")
        if not isinstance(event, dpa.DpEvent):
            raise ValueError(f"event must be a dp_accounting DpEvent, got {type(event).__name__}")
        relation = self._relation_of(event)
        refused = np.array([have is not None and have != relation for have in self._class_relation], dtype=bool)
        bad = refused[self._class[pos]]
        if bad.any():  # validate everything before mutating anything; name the first refused client
            j = int(np.flatnonzero(bad)[0])
            raise self._relation_refused(int(ids[j]), self._class_relation[int(self._class[pos[j]])], relation)  # type: ignore[arg-type]
        eid = self._intern(event, relation)
        if not len(pos):
            return
        self._log.append((r, eid, np.sort(ids)))
        before = self._class[pos]
        for old in np.unique(before).tolist():
            moved = pos[before == old]
            new = self._next_class(old, eid)
            self._class[moved] = new
            self._class_count[old] -= len(moved)
            self._class_count[new] += len(moved)
        self._last_event[pos] = eid
        self._dirty.append(pos)
        self._open_round = r if self._open_round is None else max(self._open_round, r)

    def _known_ids(self, client_ids: Iterable[int] | np.ndarray) -> np.ndarray:
        """`client_ids` as int64, each known to the ledger (else the first unknown one is named)."""
        if isinstance(client_ids, np.ndarray) and client_ids.dtype.kind in "iu":
            ids = client_ids.astype(np.int64).reshape(-1)
            self._positions(ids)  # refuses an unknown id
            return ids
        return np.array([self._check_client(c) for c in client_ids], dtype=np.int64)

    def close_round(self, round_: int) -> None:
        """Log (round, spent epsilon) for every client with events since the last close."""
        r = _round(round_)
        if self._closed_round is not None and r <= self._closed_round:
            raise ValueError(f"round_={r} must be > the last closed round {self._closed_round}")
        if self._open_round is not None and r < self._open_round:
            raise ValueError(f"round_={r} is before recorded round {self._open_round}; close that round")
        if self._dirty:
            pos = np.unique(np.concatenate(self._dirty))
            self._closes.append((r, pos, self._spent_at(pos)))
        self._dirty = []
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
                self._class_count.append(0)
                self._class_relation.append(self._event_relation[eid])  # one relation per history (record_many)
            self._class_after[(current, eid)] = after
        return after

    def _positions(self, client_ids: np.ndarray) -> np.ndarray:
        """Positions of `client_ids` in the ledger's client list (unknown ids refused, as `_check_client` does)."""
        ids = np.asarray(client_ids, dtype=np.int64)
        if self._ids_are_positions:
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= len(self._ids)):
                self._check_client(int(ids[(ids < 0) | (ids >= len(self._ids))][0]))
            return ids
        assert self._sorted is not None and self._order is not None
        j = np.minimum(np.searchsorted(self._sorted, ids), max(0, len(self._sorted) - 1))
        bad = (self._sorted[j] != ids) if len(self._sorted) else np.ones(len(ids), dtype=bool)
        if bad.any():
            self._check_client(int(ids[bad][0]))
        return self._order[j]

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
        return dict(zip(self._ids.tolist(), self.spent_array().tolist(), strict=True))

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
        if not checked.all():
            ids, index = ids[checked], index[checked]
        pos = self._positions(ids)
        first, inverse = _groups(self._keys(pos, index, len(events)))
        answers = np.array([self.would_exceed(int(ids[j]), events[int(index[j])], tol)  # type: ignore[arg-type]
                            for j in first.tolist()], dtype=bool)
        out[checked] = answers[inverse]
        return out

    def _keys(self, pos: np.ndarray | None, index: np.ndarray | None, n_events: int) -> np.ndarray:
        """One non-negative int64 per client at `pos` (None: everyone): equal exactly where (history class, event
        index, budget and delta) are equal, or (class, delta) where `index` is None."""
        if pos is None:
            classes, delta_group = self._class.astype(np.int64), self._delta_group
        else:
            classes, delta_group = self._class[pos].astype(np.int64), self._delta_group[pos]
        if index is None:
            return classes * len(self._delta_values) + delta_group if len(self._delta_values) > 1 else classes
        bd = self._bd_group if pos is None else self._bd_group[pos]
        if len(self._class_signature) * max(1, n_events) * len(self._bd_values) < 2**62:
            keys = classes * n_events + index if n_events > 1 else classes  # a term with one value splits nothing
            return keys * len(self._bd_values) + bd if len(self._bd_values) > 1 else keys
        rows = np.stack([classes, index, bd.astype(np.int64)], axis=1)  # too many to combine
        return np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)

    def _spent_groups(self, pos: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(the spent epsilon of each distinct (history class, delta) among the clients at `pos` (None: everyone),
        each client's group)."""
        if (len(self._ids) if pos is None else len(pos)) == 0:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        first, inverse = _groups(self._keys(pos, None, 0))
        at = first if pos is None else pos[first]
        eps = np.array([self._epsilon(self._class_signature[int(self._class[p])], None, float(self._delta_array[p]))
                        for p in at.tolist()], dtype=np.float64)
        return eps, inverse

    def _spent_at(self, pos: np.ndarray | None) -> np.ndarray:
        """`spent` of the clients at positions `pos` (None: everyone), once per distinct (history class, delta)."""
        eps, inverse = self._spent_groups(pos)
        return eps[inverse]

    def spent_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct spent epsilons, increasing; how many clients spent each): `spent_array`'s values counted,
        from the history classes, without a sort of the population."""
        if len(self._delta_values) == 1:  # one delta: a class is a group, and its count is kept
            counts = np.array(self._class_count, dtype=np.int64)
            held = np.flatnonzero(counts)
            delta = float(self._delta_values[0, 0]) if len(self._ids) else 0.0
            eps = np.array([self._epsilon(self._class_signature[k], None, delta) for k in held.tolist()])
            counts = counts[held]
        else:
            eps, inverse = self._spent_groups(None)
            counts = np.bincount(inverse, minlength=len(eps))
        values, where = np.unique(eps, return_inverse=True)
        return values, np.bincount(where.reshape(-1), weights=counts, minlength=len(values)).astype(np.int64)

    def spent_array(self) -> np.ndarray:
        """`spent` of every client in `client_ids` order, computed once per distinct (history class, delta)."""
        return self._spent_at(None)

    def prv_bounds_array(self) -> np.ndarray:
        """accountant 'prv' only: every client's (lower, estimate, upper, eps_error) of its spent epsilon, one row per
        client in `client_ids` order (upper is `spent_array`; each distinct (history class, delta) accounted once,
        from the same cache as the spent epsilon), so the report can show the error bars of what it reports."""
        if self.accountant != "prv":
            raise ValueError(f"prv_bounds_array needs accountant 'prv', this ledger's is {self.accountant!r}")
        if not len(self._ids):
            return np.zeros((0, 4))
        first, inverse = _groups(self._keys(None, None, 0))
        rows = []
        for p in first.tolist():
            signature = self._class_signature[int(self._class[p])]
            if not signature:
                rows.append((0.0, 0.0, 0.0, 0.0))
                continue
            event = dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(self._events[eid], n) for eid, n in signature])
            b = prv_bounds(event, float(self._delta_array[p]))
            rows.append((b.lower, b.estimate, b.upper, b.eps_error))
        return np.array(rows, dtype=np.float64)[inverse]

    def guarantee(self, client_id: int) -> Guarantee:
        """The client's spent epsilon, labelled with its delta, relation, accountant and unit."""
        c = self._check_client(client_id)
        return Guarantee(
            self.spent(c), self._delta(c), self._relation_at(c) or ADD_REMOVE, self.accountant, self.unit  # type: ignore[arg-type]
        )

    # ------------------------------------------------------------------ history and metadata
    def history(self, client_id: int) -> list[tuple[int, float]]:
        """(round, epsilon spent after that round) for each closed round in which the client had events."""
        p = self._at(self._check_client(client_id))
        out = []
        for r, pos, spent in self._closes:
            j = int(np.searchsorted(pos, p))
            if j < len(pos) and int(pos[j]) == p:
                out.append((r, float(spent[j])))
        return out

    def entries(self, client_id: int) -> list[LedgerEntry]:
        """The client's recorded events in recording order."""
        c = self._check_client(client_id)
        out = []
        for r, eid, clients in self._log:
            i = int(np.searchsorted(clients, c))
            if i < len(clients) and int(clients[i]) == c:
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
            "relation": self._relation_at(c),
            "unit": self.unit,
            "accountant": self.accountant,
            "delta": self._delta(c),
            "budget": self._budget(c),
        }
        eid = int(self._last_event[self._at(c)])
        info = describe_event(self._events[eid]) if eid >= 0 else None
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
    def _history_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every history row (position, round, spent), by position and then round."""
        if not self._closes:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
        pos = np.concatenate([p for _, p, _ in self._closes])
        rounds = np.concatenate([np.full(len(p), r, dtype=np.int64) for r, p, _ in self._closes])
        spent = np.concatenate([s for _, _, s in self._closes])
        order = np.argsort(pos, kind="stable")  # the closes are in round order
        return pos[order], rounds[order], spent[order]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able snapshot; ``from_dict(to_dict())`` restores an identical ledger."""
        no_budgets = bool(len(self._budget_array)) and bool(np.isnan(self._budget_array[0]))
        pos, rounds, spent = self._history_rows()
        starts = np.flatnonzero(np.diff(pos, prepend=-1)) if len(pos) else np.zeros(0, dtype=np.int64)
        ends = np.append(starts[1:], len(pos)).astype(np.int64) if len(pos) else starts
        rounds_l, spent_l, ids = rounds.tolist(), spent.tolist(), self._ids
        history = [[int(ids[pos[a]]), [[rounds_l[j], encode_float(spent_l[j])] for j in range(a, b)]]
                   for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        recorded = np.flatnonzero(self._class != 0)
        open_pos = np.unique(np.concatenate(self._dirty)) if self._dirty else np.zeros(0, dtype=np.int64)
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "accountant": self.accountant,
            "unit": self.unit,
            "orders": None if self.orders is None else list(self.orders),
            "clients": self._ids.tolist(),
            "deltas": self._delta_array.tolist(),
            "budgets": None if no_budgets else [encode_float(b) for b in self._budget_array.tolist()],
            "events": [event_to_dict(e) for e in self._events],
            "log": [[r, eid, clients.tolist()] for r, eid, clients in self._log],
            "relations": [[int(ids[p]), self._class_relation[int(k)]]
                          for p, k in zip(recorded.tolist(), self._class[recorded].tolist(), strict=True)],
            "history": history,
            "open_clients": sorted(ids[open_pos].tolist()),
            "open_round": self._open_round,
            "closed_round": self._closed_round,
            "metadata": [[c, dict(self._user_meta[c])] for c in sorted(self._user_meta, key=self._at)],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyLedger:
        if data.get("format") != _FORMAT or data.get("version") != _VERSION:
            raise ValueError(
                f"not a {_FORMAT} v{_VERSION} payload (format={data.get('format')!r}, version={data.get('version')!r})"
            )
        clients = list(data["clients"])
        budgets = data["budgets"]
        deltas = list(data["deltas"])
        if len(deltas) != len(clients) or (budgets is not None and len(budgets) != len(clients)):
            raise ValueError("payload's deltas or budgets list is shorter or longer than its clients: a client has no "
                             "value")
        ledger = cls(
            clients,
            deltas,
            None if budgets is None else [decode_float(b) for b in budgets],
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
        recorded = np.flatnonzero(ledger._class != 0)
        derived = {int(ledger._ids[p]): ledger._class_relation[int(ledger._class[p])] for p in recorded.tolist()}
        if stored != derived:
            raise ValueError("payload relations do not match its events")
        rows = [(c, int(r), decode_float(e)) for c, h in data["history"] for r, e in h]
        if rows:
            pos = ledger._positions(np.array([ledger._check_client(c) for c, _, _ in rows], dtype=np.int64))
            rounds = np.array([r for _, r, _ in rows], dtype=np.int64)
            spent = np.array([e for _, _, e in rows], dtype=np.float64)
            order = np.lexsort((pos, rounds))
            pos, rounds, spent = pos[order], rounds[order], spent[order]
            cuts = np.flatnonzero(np.diff(rounds)) + 1
            ledger._closes = [(int(rs[0]), p, s) for rs, p, s in
                              zip(np.split(rounds, cuts), np.split(pos, cuts), np.split(spent, cuts), strict=True)]
        else:
            ledger._closes = []
        open_ids = np.array([ledger._check_client(c) for c in data["open_clients"]], dtype=np.int64)
        ledger._dirty = [ledger._positions(open_ids)] if len(open_ids) else []
        ledger._open_round = data["open_round"]
        ledger._closed_round = data["closed_round"]
        ledger._user_meta = {int(c): dict(m) for c, m in data["metadata"]}
        return ledger

"""The array-backed ledger (a client's standing state is numbers at its position, its history one array per closed
round) answers exactly as the ledger with a Python object per client did (`previous_ledger`, kept verbatim): the
same spent epsilons, histories, relations, entries, metadata and checkpoint payload after random recordings, and a
client's standing state stays a few dozen bytes."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from dpfl.privacy import PrivacyLedger, dpsgd_event, gaussian_event
from tests.privacy.previous_ledger import PrivacyLedger as PreviousLedger

EVENTS = [dpsgd_event(1.1, 20, sampling="poisson", sample_rate=0.02),
          dpsgd_event(0.9, 10, sampling="poisson", sample_rate=0.05),
          dpsgd_event(3.0, 2, sampling="full"), gaussian_event(2.0)]


def both(seed: int, ids: list[int], rounds: int = 6) -> tuple[PrivacyLedger, PreviousLedger]:
    rng = np.random.default_rng(seed)
    budgets = {c: float(rng.choice([0.5, 2.0, np.inf])) for c in ids}
    deltas = {c: float(rng.choice([1e-5, 1e-6])) for c in ids}
    new, old = PrivacyLedger(ids, deltas, budgets), PreviousLedger(ids, deltas, budgets)
    for r in range(rounds):
        for e in EVENTS:
            members = [c for c in ids if rng.random() < 0.3]
            new.record_many(members, r, e)
            old.record_many(members, r, e)
        if r != 3:  # round 3 stays open into round 4: two rounds' events in one close
            new.close_round(r)
            old.close_round(r)
    new.record_many(ids[:3], rounds, EVENTS[0])  # an open round in the payload
    old.record_many(ids[:3], rounds, EVENTS[0])
    new.set_metadata(ids[-1], clip=1.0)
    old.set_metadata(ids[-1], clip=1.0)
    return new, old


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", ["0..n-1", "other ids"])
def test_the_array_ledger_answers_as_the_per_client_ledger_did(seed, shape):
    ids = list(range(40)) if shape == "0..n-1" else [9 * i + 5 for i in range(40)][::-1]
    new, old = both(seed, ids)
    for c in ids:
        assert new.spent(c) == old.spent(c)
        assert new.history(c) == old.history(c)
        assert new.relation(c) == old.relation(c)
        assert [(e.round, e.event, e.relation) for e in new.entries(c)] == [
            (e.round, e.event, e.relation) for e in old.entries(c)]  # two LedgerEntry classes
        assert new.metadata(c) == old.metadata(c)
        assert new.guarantee(c) == old.guarantee(c)
        assert new.epsilon_if(c, EVENTS[1]) == old.epsilon_if(c, EVENTS[1])
    assert json.dumps(new.to_dict()) == json.dumps(old.to_dict())
    again = PrivacyLedger.from_dict(json.loads(json.dumps(new.to_dict())))
    assert json.dumps(again.to_dict()) == json.dumps(old.to_dict())
    assert [again.history(c) for c in ids] == [old.history(c) for c in ids]


def test_a_population_is_recorded_from_arrays_and_refuses_as_before():
    new, old = PrivacyLedger(range(5), np.full(5, 1e-5), np.full(5, 2.0)), PreviousLedger(range(5), 1e-5, 2.0)
    new.record_many(np.array([4, 1]), 0, EVENTS[0])
    old.record_many([4, 1], 0, EVENTS[0])
    fixed = dpsgd_event(1.0, 3, sampling="fixed", sample_size=2, population=10)
    for ledger in (new, old):
        with pytest.raises(ValueError, match="client 4 has add_remove events"):
            ledger.record_many([0, 4, 1], 1, fixed)
        with pytest.raises(ValueError, match="unknown client_id 7"):
            ledger.record_many([0, 7], 1, EVENTS[0])
        with pytest.raises(ValueError, match="duplicates"):
            ledger.record_many([0, 0], 1, EVENTS[0])
    with pytest.raises(ValueError, match="unknown client_id 7"):
        new.record_many(np.array([0, 7]), 1, EVENTS[0])
    with pytest.raises(ValueError, match=r"deltas\[2\] must be a number in \(0, 1\)"):
        PrivacyLedger(range(5), np.array([1e-5, 1e-5, 1.5, 1e-5, 1e-5]))
    with pytest.raises(ValueError, match="client_ids contains duplicates"):
        PrivacyLedger([3, 1, 3], 1e-5)
    assert new.spent_array().tolist() == [old.spent(c) for c in range(5)]


def _bytes_per_client(n: int) -> float:
    """Bytes a ledger of `n` clients holds (tracemalloc), after one recorded and closed round of 100 of them."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ledger = PrivacyLedger(np.arange(n), np.full(n, 1e-5), np.full(n, 4.0))
    ledger.record_many(np.arange(0, n, n // 100), 0, EVENTS[0])
    ledger.close_round(0)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del ledger
    return held / n


def test_a_clients_standing_state_in_the_ledger_is_a_few_dozen_bytes():
    """Class and last event (int32), delta and budget (float64), their groups (int32) and the id (int64): 40 bytes
    per client, and the same at 20,000 and 200,000 clients (what does not grow with the population, events and
    classes, is a few KB: under 0.5 byte per client at 20,000). A dict or object per client would cost 100+."""
    _bytes_per_client(1_000)  # the accountant's caches (the event's RDP curve) are not a client's
    small, large = _bytes_per_client(20_000), _bytes_per_client(200_000)
    assert 40 <= large <= small < 40.5


@pytest.mark.parametrize("deltas", ["one", "several"])
def test_spent_counts_count_the_spent_array(deltas):
    """`spent_counts` (kept class counts with one delta, grouped otherwise) is `np.unique` of `spent_array`."""
    ids = list(range(50))
    new, _ = both(3, ids)
    if deltas == "one":
        new = PrivacyLedger.from_dict({**new.to_dict(), "deltas": [1e-5] * 50})
    values, counts = new.spent_counts()
    expected = np.unique(new.spent_array(), return_counts=True)
    assert values.tolist() == expected[0].tolist() and counts.tolist() == expected[1].tolist()
    assert len(values) > 2

"""The ledger's population-wide answers (`exceeding_mask`, `spent_array`, and `exceeding`, `spent_all` built on them)
equal its per-client ones (`would_exceed`, `spent`), after random histories, budgets and deltas: they group clients by
history class, so a wrong class (a history counted twice, a class shared by two histories) would change an answer."""

from __future__ import annotations

import numpy as np
import pytest

from dpfl.privacy import PrivacyLedger, dpsgd_event, gaussian_event

EVENTS = [dpsgd_event(1.1, 20, sampling="poisson", sample_rate=0.02),
          dpsgd_event(0.9, 10, sampling="poisson", sample_rate=0.05),
          dpsgd_event(3.0, 2, sampling="full"), gaussian_event(2.0)]


def random_ledger(seed: int, n: int = 60, rounds: int = 8, ids=None) -> PrivacyLedger:
    rng = np.random.default_rng(seed)
    clients = list(range(n)) if ids is None else ids
    budgets = {c: float(rng.choice([0.5, 1.0, 2.0, 8.0, np.inf])) for c in clients}
    deltas = {c: float(rng.choice([1e-5, 1e-6])) for c in clients}
    ledger = PrivacyLedger(clients, deltas=deltas, budgets=budgets)
    for r in range(rounds):
        for e in EVENTS:
            members = [c for c in clients if rng.random() < 0.3]
            ledger.record_many(members, r, e)
        ledger.close_round(r)
    return ledger


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ids", [None, [7 * i + 3 for i in range(60)]], ids=["0..n-1", "other ids"])
def test_population_answers_equal_the_per_client_answers(seed, ids):
    ledger = random_ledger(seed, ids=ids)
    clients = np.array(ledger.client_ids)
    rng = np.random.default_rng(100 + seed)
    events = [EVENTS[0], None, EVENTS[2], EVENTS[3]]
    index = rng.integers(-1, len(events), size=len(clients))
    mask = ledger.exceeding_mask(clients, index, events)
    expected = {int(c) for c, i in zip(clients, index, strict=True)
                if i >= 0 and events[i] is not None and ledger.would_exceed(int(c), events[i])}
    assert set(clients[mask].tolist()) == expected
    assert ledger.exceeding((int(c), events[i]) for c, i in zip(clients, index, strict=True)
                            if i >= 0 and events[i] is not None) == expected
    assert 0 < len(expected) < len(clients)  # both answers occur: the check can fail either way
    spent = ledger.spent_array()
    assert spent.tolist() == [ledger.spent(int(c)) for c in clients]  # the same floats, not just close
    assert ledger.spent_all() == {int(c): ledger.spent(int(c)) for c in clients}


def test_the_classes_follow_a_ledger_read_back():
    ledger = random_ledger(3)
    again = PrivacyLedger.from_dict(ledger.to_dict())
    assert again.spent_array().tolist() == ledger.spent_array().tolist()
    clients = np.array(ledger.client_ids)
    index = np.zeros(len(clients), dtype=np.int64)
    check = [EVENTS[1]]
    assert (again.exceeding_mask(clients, index, check) == ledger.exceeding_mask(clients, index, check)).all()


def test_refusals():
    ledger = random_ledger(4, n=5)
    with pytest.raises(ValueError, match="unknown client_id 9"):
        ledger.exceeding_mask(np.array([0, 9]), np.array([0, 0]), [EVENTS[0]])
    with pytest.raises(ValueError, match="1-D of one length"):
        ledger.exceeding_mask(np.array([0, 1]), np.array([0]), [EVENTS[0]])
    no_budgets = PrivacyLedger([0, 1], deltas=1e-5)
    with pytest.raises(ValueError, match="no epsilon budget"):
        no_budgets.exceeding_mask(np.array([0, 1]), np.array([0, 0]), [EVENTS[0]])
    assert not no_budgets.exceeding_mask(np.array([0, 1]), np.array([-1, -1]), [EVENTS[0]]).any()

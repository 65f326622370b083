"""PrivacyLedger: spent epsilon is the accountant's epsilon of the recorded events, per client."""

import json
import math

import dp_accounting as dpa
import pytest

import dpfl.privacy.ledger as ledger_module
from dpfl.privacy import PrivacyLedger, dpsgd_event, epsilon, gaussian_event, sampled_gaussian_event

POISSON = dpsgd_event(1.1, 20, sampling="poisson", sample_rate=0.02)
POISSON_B = dpsgd_event(0.9, 10, sampling="poisson", sample_rate=0.05)
FULL = dpsgd_event(3.0, 2, sampling="full")
FIXED_ORDERS = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)  # without-replacement curves are slow at default orders
FIXED = dpsgd_event(1.5, 5, sampling="fixed", population=200, sample_size=10)


def test_spent_is_accountant_epsilon_of_composed_events():
    led = PrivacyLedger([0, 1], deltas={0: 1e-5, 1: 1e-4})
    led.record(0, 0, POISSON)
    led.record(0, 1, POISSON_B)
    led.record(0, 1, FULL)
    led.record(0, 2, POISSON)
    led.record(1, 0, POISSON)
    composed = dpa.ComposedDpEvent([POISSON, POISSON_B, FULL, POISSON])
    assert led.spent(0) == pytest.approx(epsilon(composed, 1e-5), rel=1e-12)
    assert led.spent(1) == pytest.approx(epsilon(POISSON, 1e-4), rel=1e-12)  # its own delta


def test_client_without_events_spent_zero():
    led = PrivacyLedger(range(3), 1e-5, 1.0)
    led.record(0, 0, POISSON)
    led.close_round(0)
    assert led.spent(2) == 0.0
    assert led.history(2) == []
    assert led.relation(2) is None
    assert led.spent_all()[2] == 0.0 and led.spent_all()[0] > 0


def test_record_many_equals_individual_records():
    many, single = PrivacyLedger(range(50), 1e-5), PrivacyLedger(range(50), 1e-5)
    for r, (event, clients) in enumerate([(POISSON, range(50)), (POISSON_B, range(0, 50, 3)), (POISSON, range(10))]):
        many.record_many(clients, r, event)
        for c in clients:
            single.record(c, r, event)
        many.close_round(r)
        single.close_round(r)
    assert many.spent_all() == single.spent_all()
    for c in (0, 3, 7, 49):
        assert many.history(c) == single.history(c)
        assert many.entries(c) == single.entries(c)
    assert len(many.to_dict()["log"]) == 3  # shared events are stored once


def test_many_identical_clients_are_accounted_once(monkeypatch):
    calls = []
    for name in ("epsilon", "rdp_to_epsilon"):  # the event path (pld, gdp) and the RDP curves' conversion
        real = getattr(ledger_module, name)
        monkeypatch.setattr(ledger_module, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    led = PrivacyLedger(range(10_000), 1e-5)
    led.record_many(range(10_000), 0, POISSON)
    led.close_round(0)
    spent = led.spent_all()
    assert len(calls) == 1
    assert set(spent.values()) == {epsilon(POISSON, 1e-5)}


def test_would_exceed_detects_the_round_that_crosses_the_budget():
    k = 7
    budget = epsilon(dpa.SelfComposedDpEvent(POISSON, k), 1e-5)  # exactly k rounds fit
    assert epsilon(dpa.SelfComposedDpEvent(POISSON, k + 1), 1e-5) > budget * (1 + 1e-6)
    led = PrivacyLedger([0], 1e-5, {0: budget})
    rounds = 0
    while not led.would_exceed(0, POISSON):
        assert led.epsilon_if(0, POISSON) == pytest.approx(epsilon(dpa.SelfComposedDpEvent(POISSON, rounds + 1), 1e-5))
        led.record(0, rounds, POISSON)
        led.close_round(rounds)
        rounds += 1
        assert led.spent(0) <= budget * (1 + 1e-9)
    assert rounds == k
    assert led.epsilon_if(0, POISSON) > budget
    assert led.spent(0) == pytest.approx(budget, rel=1e-12)


def test_would_exceed_needs_a_budget():
    led = PrivacyLedger([0], 1e-5)
    with pytest.raises(ValueError, match="client 0 has no epsilon budget"):
        led.would_exceed(0, POISSON)


def test_history_logs_spent_after_each_closed_round_for_participants():
    led = PrivacyLedger([0, 1], 1e-5)
    led.record_many([0, 1], 0, POISSON)
    led.close_round(0)
    led.record(0, 1, POISSON)
    led.close_round(1)
    led.record(1, 2, POISSON)
    led.record(1, 2, POISSON_B)
    led.close_round(2)
    e1 = epsilon(POISSON, 1e-5)
    e2 = epsilon(dpa.SelfComposedDpEvent(POISSON, 2), 1e-5)
    e3 = epsilon(dpa.ComposedDpEvent([POISSON, POISSON, POISSON_B]), 1e-5)
    assert led.history(0) == [(0, pytest.approx(e1)), (1, pytest.approx(e2))]
    assert led.history(1) == [(0, pytest.approx(e1)), (2, pytest.approx(e3))]
    with pytest.raises(ValueError, match="already closed"):
        led.record(0, 2, POISSON)
    with pytest.raises(ValueError, match="must be > the last closed round 2"):
        led.close_round(2)


def test_round_trip_through_json_is_exact_and_resumable():
    led = PrivacyLedger([5, 7, 9], {5: 1e-5, 7: 1e-4, 9: 1e-5}, {5: 4.0, 7: math.inf, 9: 2.5}, unit="sample")
    led.record_many([5, 7], 0, POISSON)
    led.record(9, 0, FULL)
    led.close_round(0)
    led.record(9, 1, gaussian_event(0.0))  # no noise: spent becomes inf and must survive JSON
    led.record(5, 1, POISSON_B)
    led.close_round(1)
    led.record(7, 2, POISSON)  # an open round at checkpoint time
    led.set_metadata(5, clip_norm=1.0, calibration="rdp")
    data = led.to_dict()
    text = json.dumps(data, allow_nan=False)  # standard JSON: inf is encoded as a string
    back = PrivacyLedger.from_dict(json.loads(text))
    assert back.to_dict() == data
    assert back.spent_all() == led.spent_all()
    assert back.spent(9) == math.inf
    for c in (5, 7, 9):
        assert back.history(c) == led.history(c)
        assert back.entries(c) == led.entries(c)
        assert back.metadata(c) == led.metadata(c)
        assert back.budget(c) == led.budget(c)
    # resuming continues exactly like the original
    for lg in (led, back):
        lg.close_round(2)
        lg.record_many([5, 7], 3, POISSON_B)
        lg.close_round(3)
    assert back.to_dict() == led.to_dict()


def test_round_trip_rejects_foreign_payload():
    with pytest.raises(ValueError, match="not a dpfl.privacy_ledger"):
        PrivacyLedger.from_dict({"format": "something", "version": 1})


@pytest.mark.parametrize("field", ["deltas", "budgets"])
def test_a_payload_with_a_client_missing_from_deltas_or_budgets_is_refused(field):
    """A truncated deltas or budgets list leaves the last client without its delta or budget: refused (by the
    strict zip that pairs clients with them, or else by the constructor's own check)."""
    led = PrivacyLedger([5, 7, 9], {5: 1e-5, 7: 1e-4, 9: 1e-5}, {5: 4.0, 7: 1.0, 9: 2.5})
    data = led.to_dict()
    data[field] = data[field][:-1]
    with pytest.raises(ValueError, match="shorter|no value"):
        PrivacyLedger.from_dict(data)


def test_fixed_size_ledger_is_labelled_replace_one_and_refuses_mixing():
    led = PrivacyLedger([0, 1], 1e-5, orders=FIXED_ORDERS)
    led.record(0, 0, FIXED)
    led.record(1, 0, POISSON)
    assert led.relation(0) == "replace_one" and led.relation(1) == "add_remove"
    assert "replace-one" in str(led.guarantee(0))
    assert led.spent(0) == pytest.approx(epsilon(FIXED, 1e-5, orders=FIXED_ORDERS))
    assert led.metadata(0)["noise_multiplier"] == 1.5  # the nominal z, not the event's z/2
    assert dict(led.to_dict()["relations"]) == {0: "replace_one", 1: "add_remove"}
    before = led.to_dict()
    with pytest.raises(ValueError, match="client 0 has replace_one events; cannot add a add_remove event"):
        led.record_many([1, 0], 1, POISSON)  # client 1 alone would be fine: nothing may be recorded
    assert led.to_dict() == before
    with pytest.raises(ValueError, match="client 1 has add_remove events"):
        led.epsilon_if(1, FIXED)


def test_pld_ledger_refuses_fixed_size_and_accounts_poisson():
    led = PrivacyLedger([0], 1e-5, accountant="pld")
    with pytest.raises(ValueError, match="pld.*fixed-size"):
        led.record(0, 0, FIXED)
    led.record(0, 0, POISSON)
    assert led.spent(0) == pytest.approx(epsilon(POISSON, 1e-5, "pld"))
    assert led.spent(0) < epsilon(POISSON, 1e-5)


def test_metadata_from_events_and_user():
    led = PrivacyLedger([0], 1e-5, 3.0, unit="client")
    led.record(0, 0, POISSON)
    led.set_metadata(0, clip_norm=0.5)
    meta = led.metadata(0)
    assert meta["sampling"] == "poisson" and meta["noise_multiplier"] == 1.1 and meta["sample_rate"] == 0.02
    assert meta["steps_per_round"] == 20 and meta["relation"] == "add_remove" and meta["clip_norm"] == 0.5
    assert meta["unit"] == "client" and meta["budget"] == 3.0
    with pytest.raises(ValueError, match="metadata"):
        led.set_metadata(0, weights=[1, 2])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(client_ids=[0, 0], deltas=1e-5), "duplicates"),
        (dict(client_ids=[0, 1], deltas={0: 1e-5}), r"deltas has no value for clients \[1\]"),
        (dict(client_ids=[0], deltas={0: 1e-5, 4: 1e-5}), r"deltas names unknown clients \[4\]"),
        (dict(client_ids=[0], deltas=1.0), r"deltas must be a number in \(0, 1\), got 1.0"),
        (dict(client_ids=[0], deltas=1e-5, budgets={0: -1.0}), r"budgets\[0\] must be a number > 0"),
        (dict(client_ids=[0], deltas=1e-5, accountant="zcdp"), "accountant must be one of"),
        (dict(client_ids=[0], deltas=1e-5, unit="record"), r"unit must be one of \('sample', 'client'\)"),
        (dict(client_ids=["a"], deltas=1e-5), "client ids must be integers"),
    ],
)
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PrivacyLedger(**kwargs)


def test_record_validation():
    led = PrivacyLedger([0, 1], 1e-5)
    with pytest.raises(ValueError, match="unknown client_id 3"):
        led.record(3, 0, POISSON)
    with pytest.raises(ValueError, match="duplicates"):
        led.record_many([0, 0], 0, POISSON)
    with pytest.raises(ValueError, match="round_ must be an integer >= 0"):
        led.record(0, -1, POISSON)
    with pytest.raises(ValueError, match="DpEvent"):
        led.record(0, 0, "gaussian")
    assert led.spent_all() == {0: 0.0, 1: 0.0}


def test_gdp_ledger_refuses_sampled_events_and_is_exact_for_gaussians():
    from dpfl.privacy.gdp import gdp_eps

    ledger = PrivacyLedger([0, 1], deltas=1e-5, budgets=2.0, accountant="gdp", unit="sample")
    with pytest.raises(ValueError, match="exact only for compositions of Gaussian"):
        ledger.record(0, 0, sampled_gaussian_event(1.0, sampling="poisson", sample_rate=0.1))
    for r in range(3):
        ledger.record_many([0, 1], r, gaussian_event(5.0))
        ledger.close_round(r)
    assert ledger.spent(0) == pytest.approx(gdp_eps(math.sqrt(3) / 5.0, 1e-5), rel=1e-12)
    assert PrivacyLedger.from_dict(ledger.to_dict()).spent_all() == ledger.spent_all()


def test_exceeding_answers_each_client_as_would_exceed_does():
    """The grouped check (one answer per history, budget, delta and event object) equals the per-client one,
    for clients that share some but not all of those."""
    budgets = {c: (1.0 if c % 3 else 2.5) for c in range(12)}
    deltas = {c: (1e-5 if c % 4 else 1e-3) for c in range(12)}
    led = PrivacyLedger(range(12), deltas=deltas, budgets=budgets)
    for r in range(3):
        led.record_many([c for c in range(12) if c % 2 == 0 or r == 0], r, POISSON)
        led.close_round(r)
    strong = dpsgd_event(0.6, 40, sampling="poisson", sample_rate=0.05)
    checks = [(c, POISSON if c < 6 else strong) for c in range(12)]
    expected = {c for c, e in checks if led.would_exceed(c, e)}
    assert led.exceeding(checks) == expected
    assert 0 < len(expected) < 12  # both answers occur, so a grouping mistake would show

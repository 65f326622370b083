"""DpEvent <-> dict codec: exact round trip, only dp_accounting event classes."""

import json

import dp_accounting as dpa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.privacy import dpsgd_event, event_from_dict, event_to_dict

EVENTS = [
    dpsgd_event(0.1 + 0.2, 7, sampling="poisson", sample_rate=1 / 3),
    dpsgd_event(1.7, 3, sampling="fixed", population=2400, sample_size=16),
    dpsgd_event(2.0, 1, sampling="full"),
    dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(0.5), 4),
                         dpa.NoOpDpEvent()]),
    dpa.NonPrivateDpEvent(),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_round_trip_through_json_is_exact(event):
    back = event_from_dict(json.loads(json.dumps(event_to_dict(event))))
    assert back == event
    assert repr(back) == repr(event)  # same float bits, same int/float types


def test_schema_is_readable():
    d = event_to_dict(dpsgd_event(1.5, 2, sampling="poisson", sample_rate=0.25))
    assert d == {
        "type": "SelfComposedDpEvent",
        "count": 2,
        "event": {"type": "PoissonSampledDpEvent", "sampling_probability": 0.25,
                  "event": {"type": "GaussianDpEvent", "noise_multiplier": 1.5}},
    }


def test_rejects_unknown_types_and_fields():
    with pytest.raises(ValueError, match="unknown DpEvent type 'os.system'"):
        event_from_dict({"type": "os.system"})
    with pytest.raises(ValueError, match=r"GaussianDpEvent needs fields \['noise_multiplier'\]"):
        event_from_dict({"type": "GaussianDpEvent", "sigma": 1.0})


@settings(max_examples=200, deadline=None)
@given(
    z=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    q=st.floats(min_value=1e-12, max_value=1.0),
    steps=st.integers(min_value=1, max_value=10**9),
    n=st.integers(min_value=1, max_value=10**9),
)
def test_round_trip_any_parameters(z, q, steps, n):
    for event in (
        dpsgd_event(z, steps, sampling="poisson", sample_rate=q),
        dpsgd_event(z, steps, sampling="fixed", population=n, sample_size=max(1, n // 3)),
    ):
        assert event_from_dict(json.loads(json.dumps(event_to_dict(event)))) == event

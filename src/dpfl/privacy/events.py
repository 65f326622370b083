"""DP events for the mechanisms dpfl runs, built so that the accountant sees the sampling the code used.

Every epsilon dpfl reports is computed by a ``dp_accounting`` accountant from a ``DpEvent``; this
module is the one place where mechanism parameters become events. The sampling named here must be the
sampling the client program actually performs:

* ``"poisson"``: every record joins a step's batch independently with probability ``sample_rate``
  -> ``PoissonSampledDpEvent`` under add/remove-one adjacency.
* ``"fixed"``: exactly ``sample_size`` of ``population`` records, uniformly without replacement
  -> ``SampledWithoutReplacementDpEvent`` under replace-one adjacency (RDP accountant only).
* ``"full"``: every record in every step -> a plain ``GaussianDpEvent`` (add/remove-one).

Convention for ``noise_multiplier`` z: the mechanism is a clipped sum with per-record clip norm C plus
Gaussian noise of standard deviation z*C. That sum has L2 sensitivity C under add/remove-one and 2C
under replace-one, which is why the fixed-size event carries z/2 (see ``sampled_gaussian_event``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Literal

import dp_accounting as dpa

Sampling = Literal["poisson", "fixed", "full"]
Relation = Literal["add_remove", "replace_one"]

ADD_REMOVE: Relation = "add_remove"
REPLACE_ONE: Relation = "replace_one"
SAMPLINGS: tuple[str, ...] = ("poisson", "fixed", "full")

__all__ = [
    "ADD_REMOVE",
    "REPLACE_ONE",
    "SAMPLINGS",
    "EventInfo",
    "Relation",
    "Sampling",
    "describe_event",
    "dpsgd_event",
    "gaussian_event",
    "neighboring_relation",
    "sampled_gaussian_event",
]


def _check_noise(noise_multiplier: float) -> float:
    if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, numbers.Real):
        raise ValueError(f"noise_multiplier must be a real number >= 0, got {noise_multiplier!r}")
    z = float(noise_multiplier)
    if not (z >= 0.0 and math.isfinite(z)):
        raise ValueError(f"noise_multiplier must be finite and >= 0 (0 means no privacy), got {z}")
    return z


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if v < low or (high is not None and v > high):
        allowed = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {allowed}, got {v}")
    return v


def _reject_unused(sampling: str, **unused: object) -> None:
    given = [name for name, value in unused.items() if value is not None]
    if given:
        raise ValueError(
            f"{', '.join(given)} not used with sampling={sampling!r}; pass only the parameters of that "
            "sampling (poisson: sample_rate; fixed: population, sample_size; full: none)"
        )


def gaussian_event(noise_multiplier: float) -> dpa.GaussianDpEvent:
    """One Gaussian mechanism on all records, noise std = noise_multiplier x add/remove sensitivity.

    ``noise_multiplier=0`` is allowed and means no privacy: every accountant reports epsilon = inf.
    """
    return dpa.GaussianDpEvent(_check_noise(noise_multiplier))


def sampled_gaussian_event(
    noise_multiplier: float,
    *,
    sampling: Sampling,
    sample_rate: float | None = None,
    population: int | None = None,
    sample_size: int | None = None,
) -> dpa.DpEvent:
    """One step of a subsampled Gaussian mechanism on a clipped sum (one DP-SGD step).

    ``poisson`` needs ``sample_rate`` in (0, 1]; ``fixed`` needs ``population`` >= 1 and
    ``sample_size`` in [1, population]; ``full`` needs nothing.

    For ``fixed``, dp_accounting's without-replacement RDP bound (Wang, Balle, Kasiviswanathan 2019)
    takes the noise multiplier relative to the *replace-one* L2 sensitivity. Replacing one record
    moves a clipped sum by up to 2C, so a noise std of z*C is a multiplier of z/2 relative to that
    sensitivity: the event is built with ``GaussianDpEvent(z / 2)``. Building it with z would
    understate epsilon.
    """
    z = _check_noise(noise_multiplier)
    if sampling == "poisson":
        _reject_unused(sampling, population=population, sample_size=sample_size)
        if sample_rate is None:
            raise ValueError("sampling='poisson' needs sample_rate in (0, 1], got None")
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Real):
            raise ValueError(f"sample_rate must be a real number in (0, 1], got {sample_rate!r}")
        q = float(sample_rate)
        if not (0.0 < q <= 1.0):
            raise ValueError(f"sample_rate must be in (0, 1], got {q}")
        return dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z))
    if sampling == "fixed":
        _reject_unused(sampling, sample_rate=sample_rate)
        if population is None or sample_size is None:
            raise ValueError(
                "sampling='fixed' needs population (>= 1) and sample_size (in [1, population]), "
                f"got population={population!r}, sample_size={sample_size!r}"
            )
        n = _check_int("population", population, 1)
        m = _check_int("sample_size", sample_size, 1, n)
        return dpa.SampledWithoutReplacementDpEvent(n, m, dpa.GaussianDpEvent(z / 2.0))
    if sampling == "full":
        _reject_unused(sampling, sample_rate=sample_rate, population=population, sample_size=sample_size)
        return dpa.GaussianDpEvent(z)
    raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")


def dpsgd_event(
    noise_multiplier: float,
    steps: int,
    *,
    sampling: Sampling,
    sample_rate: float | None = None,
    population: int | None = None,
    sample_size: int | None = None,
) -> dpa.SelfComposedDpEvent:
    """``steps`` (>= 1) independent steps of ``sampled_gaussian_event``: one client's local DP-SGD run."""
    steps = _check_int("steps", steps, 1)
    step = sampled_gaussian_event(
        noise_multiplier,
        sampling=sampling,
        sample_rate=sample_rate,
        population=population,
        sample_size=sample_size,
    )
    return dpa.SelfComposedDpEvent(step, steps)


def _relations(event: dpa.DpEvent, out: set[str]) -> None:
    if isinstance(event, dpa.SelfComposedDpEvent):
        _relations(event.event, out)
    elif isinstance(event, dpa.ComposedDpEvent):
        for e in event.events:
            _relations(e, out)
    elif isinstance(event, dpa.PoissonSampledDpEvent):
        out.add(ADD_REMOVE)
    elif isinstance(event, dpa.SampledWithoutReplacementDpEvent):
        out.add(REPLACE_ONE)
    elif isinstance(event, dpa.GaussianDpEvent):
        out.add(ADD_REMOVE)  # dpfl convention: the multiplier is relative to the add/remove sensitivity


def neighboring_relation(event: dpa.DpEvent) -> Relation:
    """The adjacency under which ``event`` must be accounted: ``"add_remove"`` or ``"replace_one"``.

    Fixed-size (without-replacement) sampling means replace-one; Poisson sampling and plain Gaussian
    events mean add/remove. Events with neither (e.g. ``NoOpDpEvent``) default to add/remove. An event
    mixing both cannot be accounted by one accountant and raises ValueError.
    """
    found: set[str] = set()
    _relations(event, found)
    if len(found) > 1:
        raise ValueError(
            "event mixes Poisson/Gaussian (add/remove) and fixed-size (replace-one) sampling; "
            f"one epsilon needs one neighbouring relation: {event!r}"
        )
    return REPLACE_ONE if REPLACE_ONE in found else ADD_REMOVE


@dataclasses.dataclass(frozen=True)
class EventInfo:
    """Mechanism parameters read back from an event built by this module (for ledgers and reports)."""

    sampling: str
    noise_multiplier: float  # nominal z: noise std / clip norm (already undoes the z/2 of "fixed")
    steps: int
    relation: str
    sample_rate: float  # 1.0 for "full"; sample_size / population for "fixed"
    population: int | None = None
    sample_size: int | None = None


def describe_event(event: dpa.DpEvent) -> EventInfo | None:
    """Invert ``dpsgd_event`` / ``sampled_gaussian_event`` / ``gaussian_event``; None for other shapes.

    For without-replacement events the nominal multiplier is recovered as 2x the event's multiplier,
    i.e. the event is assumed to follow this module's convention.
    """
    steps = 1
    if isinstance(event, dpa.SelfComposedDpEvent):
        steps, event = int(event.count), event.event
    if isinstance(event, dpa.PoissonSampledDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        return EventInfo(
            "poisson", float(event.event.noise_multiplier), steps, ADD_REMOVE, float(event.sampling_probability)
        )
    if isinstance(event, dpa.SampledWithoutReplacementDpEvent) and isinstance(event.event, dpa.GaussianDpEvent):
        n, m = int(event.source_dataset_size), int(event.sample_size)
        return EventInfo("fixed", 2.0 * float(event.event.noise_multiplier), steps, REPLACE_ONE, m / n, n, m)
    if isinstance(event, dpa.GaussianDpEvent):
        return EventInfo("full", float(event.noise_multiplier), steps, ADD_REMOVE, 1.0)
    return None

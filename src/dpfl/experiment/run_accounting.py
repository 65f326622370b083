"""A federated run's privacy inputs and costs: what each client reports, the noise set from the budgets, and the DP
event a round costs a client (or every client, for a server-side mechanism).

Every noise-from-budget decision is `dpfl.privacy.run_calibration`'s (`calibrate_run` on a `PlannedRun`); this module
only builds its inputs from a FederatedRun's fields, applies its results to the run's stages, and keeps the
per-client event cache that the ledger's grouped budget check relies on. Apart from the round loop so that what a
round costs (the ledger's checks before a round, its records after it, the privacy report's views) is found in one
place, next to how the noise it is charged for was chosen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from dp_accounting import ComposedDpEvent, DpEvent

from dpfl.algorithms.algorithm import Algorithm
from dpfl.privacy.budgets import Budgets, ClientBudget
from dpfl.privacy.ledger import group_keys, group_rows, index_by_identity
from dpfl.privacy.run_calibration import (CalibratedNoise, PlannedRun, calibrate_run, calibration_targets,
                                          refuse_a_run_that_trains_nothing)

if TYPE_CHECKING:
    from dpfl.experiment.federated_run import FederatedRun

_MISSING = object()
_EVENT_CACHE_MAX = 65_536  # distinct client events kept (records x batch size x noise x upload)


def per_client(value: Any, n: int, name: str, cast: Any) -> np.ndarray:
    """Broadcast a scalar (or check a sequence) to one entry per client."""
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries for {n} clients")
        return np.array(list(value), dtype=object if cast is None else cast)
    return np.array([value] * n, dtype=object if cast is None else cast)


# ---- calibration -----------------------------------------------------------------------------
def reported_epsilons(budgets: Sequence[ClientBudget] | None, n: int, misreport: Mapping[int, float]) -> np.ndarray:
    """What each of the `n` clients tells the server its epsilon is (true budget unless it lies)."""
    true = np.full(n, np.inf) if budgets is None else Budgets.of(budgets).epsilons.astype(float)
    reported = true.copy()
    for client, factor in misreport.items():
        if not 0 <= int(client) < n:
            raise ValueError(f"misreport names client {client}, outside 0..{n - 1}")
        if not factor > 0:
            raise ValueError(f"misreport factor must be > 0, got {factor} for client {client}")
        reported[int(client)] = true[int(client)] * float(factor)
    return reported


def participation_rates(algorithm: Algorithm, n: int) -> np.ndarray:
    """Per client: the probability of taking part in a round, counting re-draws for a required group (PFA)."""
    sel, agg = algorithm.selection, algorithm.aggregator
    required = agg.public_clients
    if not required:
        return np.full(n, float(sel.participation_rate(n)))
    members = np.array(sorted(set(required)), dtype=np.int64)
    rates = np.full(n, float(sel.participation_rate_given(n, len(members), False)))
    rates[members] = float(sel.participation_rate_given(n, len(members), True))
    return rates


def planned_run(run: FederatedRun, mechanism: str) -> PlannedRun:
    """The run as planned, for the calibration of `mechanism`'s noise (dpfl.privacy.run_calibration).

    Reads the run's budgets, algorithm, rounds, accountant and participation and, for DP-SGD, its clients' records,
    batch sizes and reported epsilons and its calibrate_to / enforce_budgets / calibration settings.
    """
    assert run.budgets is not None
    alg, sel = run.algorithm, run.algorithm.selection
    if mechanism == "central":  # the selection the accountant models (a simulated cohort's, if any)
        sel = alg.aggregator.accounted_selection(sel)
    kw: dict[str, Any] = {}
    if mechanism == "dpsgd":
        kw = _dpsgd_fields(run, _targets(run), participation_rates(alg, run.n_clients))
    elif mechanism == "udp":
        kw = dict(upload_cohort=alg.upload.event_cohort, hidden_sampling=alg.upload.hidden_sampling)
    elif mechanism == "param_noise":
        kw = dict(noisy=alg.upload.accounting)
    return PlannedRun(mechanism, run.budgets, run.rounds, accountant=run.accountant, selection=sel.kind,
                      k=sel.k, rate=sel.rate, participation=run.participation, **kw)


def client_noise(run: FederatedRun, given: float | Sequence[float] | None
                 ) -> tuple[np.ndarray, CalibratedNoise | None, np.ndarray | None]:
    """The clients' DP-SGD noise multipliers: given, or calibrated from their budgets; with what they were
    calibrated for (None if they were not) and, under PFA's heuristic, each client's T* steps (else None).

    Reads the run's algorithm, n_clients, enforce_budgets and calibration, and `planned_run(run, "dpsgd")`'s fields.
    """
    n = run.n_clients
    if not run.algorithm.local.private:
        return np.zeros(n), None, None
    if given is not None:
        z = per_client(given, n, "noise_multipliers", float)
        if (z < 0).any():
            raise ValueError("noise multipliers must be >= 0")
        return z, None, None
    plan, inverse = _grouped_dpsgd_plan(run)
    calibrated = calibrate_run(plan)
    if run.enforce_budgets:  # Maximum-epsilon (budgets not enforced) trains every round whatever was planned
        refuse_a_run_that_trains_nothing(plan, calibrated)
    calibrated = replace(calibrated, noise=calibrated.noise[inverse], targets=calibrated.targets[inverse],
                         participations=calibrated.participations[inverse],
                         steps=None if calibrated.steps is None else calibrated.steps[inverse])
    heuristic_steps = calibrated.steps if run.calibration == "pfa-heuristic" else None
    return calibrated.noise, calibrated, heuristic_steps


def _grouped_dpsgd_plan(run: FederatedRun) -> tuple[PlannedRun, np.ndarray]:
    """`planned_run(run, "dpsgd")` with one client per class of clients alike in everything their noise depends on
    (target, delta, records, batch size, participation rate), and each client's class: calibrating the classes and
    giving each client its class's noise is `calibrate_run` of the whole plan, client by client the same numbers,
    in Python work per class, not per client (10,000,000 clients of one size: one class).

    The classes' plan draws all its clients ("all"): DP-SGD's calibration reads the selection only through the
    participation rates, which it is given."""
    assert run.budgets is not None
    alg, n = run.algorithm, run.n_clients
    budgets = Budgets.of(run.budgets, n)
    targets = _targets(run)
    unlimited = np.flatnonzero(np.isinf(targets))
    if len(unlimited):  # calibrate_run's refusal, naming the clients rather than their classes
        raise ValueError(f"clients {unlimited[:10].tolist()} have unlimited budgets, so no noise can be calibrated for "
                         "them; give the noise explicitly")
    rates = participation_rates(alg, n)
    records, batch = np.asarray(run.n_records, dtype=np.int64), np.asarray(run.batch_sizes, dtype=np.int64)
    first, inverse = group_keys(group_rows([targets, budgets.deltas, records.astype(float), batch.astype(float),
                                            rates]))
    plan = PlannedRun("dpsgd", budgets[first], run.rounds, accountant=run.accountant,
                      selection="all", participation=run.participation, **_dpsgd_fields(run, targets, rates, first))
    return plan, inverse


def _targets(run: FederatedRun) -> np.ndarray:
    """The epsilon each client's DP-SGD noise is calibrated to (`calibration_targets` of the run's settings)."""
    assert run.budgets is not None
    return calibration_targets(run.budgets, run.eps_reported, run.calibrate_to, run.enforce_budgets)


def _dpsgd_fields(run: FederatedRun, targets: np.ndarray, rates: np.ndarray,
                  rows: np.ndarray | None = None) -> dict[str, Any]:
    """A DP-SGD `PlannedRun`'s per-client fields (records, batch sizes, local steps and sampling, participation
    rates, targets, method) for the clients `rows` (None: every client), from the run's arrays."""
    records, batch = np.asarray(run.n_records, dtype=np.int64), np.asarray(run.batch_sizes, dtype=np.int64)
    if rows is not None:
        records, batch, rates, targets = records[rows], batch[rows], rates[rows], targets[rows]
    local = run.algorithm.local
    return dict(records=records.tolist(), batch_sizes=batch.tolist(),
                local_steps=[local.steps_for(int(m), int(b)) for m, b in zip(records, batch, strict=True)],
                local_sampling=local.sampling, participation_rates=rates.tolist(), targets=targets,
                method=run.calibration)


def calibrate_stage(run: FederatedRun) -> tuple[Algorithm, CalibratedNoise] | None:
    """The run's algorithm with the stage whose noise is unset (central server, client uploads, parameter noise)
    given its noise from the budgets, and what it was calibrated for; None if no stage lacks noise.

    Reads the run's algorithm and budgets, and `planned_run(run, <the stage's mechanism>)`'s fields.
    """
    name = run.algorithm.uncalibrated_stage()
    if name is None:
        return None
    if run.budgets is None:
        raise ValueError(f"algorithm {run.algorithm.name!r}: no noise given and no budgets to calibrate it from")
    stage = getattr(run.algorithm, name)
    calibrated = calibrate_run(planned_run(run, stage.calibration_family))
    return replace(run.algorithm, **{name: stage.with_noise(float(calibrated.noise[0]))}), calibrated


# ---- events ----------------------------------------------------------------------------------
class RunEvents:
    """What a round costs: a client's batch size and planned local steps in round r, the DP event its round costs
    it, and the event a round costs every client still in the population.

    Reads the run's `algorithm` (calibration replaces its stages after this is made), `n_records`, `batch_sizes`
    and `noise` at every call; holds nothing but the client-event cache.
    """

    def __init__(self, run: FederatedRun) -> None:
        self._run = run
        self._client_events: tuple[tuple[Any, Any], dict] = ((None, None), {})  # see _event_cache
        self._settings: tuple[tuple[Any, ...], np.ndarray] | None = None  # see _setting_groups

    def client(self, i: int, r: int, cohort: int) -> DpEvent | None:
        """The event taking part in round r (0-based), `cohort` uploads averaged, costs client i (local program and
        upload).

        Built once per distinct (records, batch size, noise, upload event) and then shared: the local program's
        event is a pure function of the first three, and in a large population most clients share all four, so
        they share one event object (which the ledger's grouped budget check relies on).
        """
        run = self._run
        up = run.algorithm.upload.event(i, r, cohort) if run.algorithm.upload.accounted else None
        key = (int(run.n_records[i]), self.batch(i, r), float(run.noise[i]), None if up is None else repr(up))
        cache = self._event_cache()
        event = cache.get(key, _MISSING)
        if event is _MISSING:
            local = run.algorithm.local.event(*key[:3])
            events = [e for e in (local, up) if e is not None]
            event = None if not events else events[0] if len(events) == 1 else ComposedDpEvent(events)
            if len(cache) >= _EVENT_CACHE_MAX:
                cache.clear()
            cache[key] = event
        return event  # type: ignore[return-value]

    def client_groups(self, clients: np.ndarray, r: int, cohort: int) -> tuple[np.ndarray, list[DpEvent | None]]:
        """`client(i, r, cohort)` for every client of `clients` at once: (an index into the events per client, the
        distinct events). The same event objects as `client` (one cache), found once per distinct (records, batch
        size, noise) with numpy instead of once per client; per client only where the upload stage's event depends
        on the client (`UploadMechanism.events_for_every_client`)."""
        run = self._run
        ids = np.asarray(clients, dtype=np.int64)
        upload = run.algorithm.upload
        if upload.accounted and not upload.events_for_every_client():
            return index_by_identity(self.client(i, r, cohort) for i in ids.tolist())
        first, inverse = group_keys(self._setting_groups()[ids])
        return inverse, [self.client(int(ids[j]), r, cohort) for j in first.tolist()]

    def _setting_groups(self) -> np.ndarray:
        """Each client's group of equal (records, batch size, noise): made once (numpy) for the run's arrays, so a
        round groups its candidates in one pass over them, not a sort."""
        run = self._run
        arrays = (run.n_records, run.batch_sizes, run.noise)
        if self._settings is None or any(a is not b for a, b in zip(self._settings[0], arrays, strict=True)):
            self._settings = (arrays, group_rows([np.asarray(a, dtype=np.float64) for a in arrays]))
        return self._settings[1]

    def batch(self, i: int, r: int) -> int:
        """Client i's batch size in round r (the local program may schedule it: R-DPCFL's full-batch round 1)."""
        run = self._run
        return int(run.algorithm.local.batch_for(int(run.n_records[i]), int(run.batch_sizes[i]), r))

    def steps(self, i: int, r: int) -> int:
        """Client i's local steps in round r as planned: what its ledger is charged and its T* budget counts."""
        return self._run.algorithm.local.steps_for(int(self._run.n_records[i]), self.batch(i, r))

    def steps_of(self, clients: np.ndarray, r: int) -> np.ndarray:
        """`steps(i, r)` of every client of `clients`, once per distinct (records, batch size)."""
        ids = np.asarray(clients, dtype=np.int64)
        pairs = np.stack([self._run.n_records[ids], self._run.batch_sizes[ids]], axis=1).astype(np.int64)
        unique, first, inverse = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
        steps = np.array([self.steps(int(ids[j]), r) for j in first.tolist()], dtype=np.int64)
        return steps[inverse.reshape(-1)] if len(ids) else np.zeros(0, dtype=np.int64)

    def _event_cache(self) -> dict:
        """The client-event cache of the current local program and upload stage (emptied when either changes,
        e.g. when calibration gives a stage its noise)."""
        algorithm = self._run.algorithm
        (local, upload), cache = self._client_events
        if local is not algorithm.local or upload is not algorithm.upload:
            cache = {}
            self._client_events = ((algorithm.local, algorithm.upload), cache)
        return cache

    def server(self, population: int) -> DpEvent | None:
        """The event one round costs every client still in the population (central DP, or UDP uploads whose
        sampling is assumed hidden from the server)."""
        algorithm = self._run.algorithm
        if not algorithm.central:
            return algorithm.upload.round_event(algorithm.selection, population)
        agg = algorithm.aggregator
        return agg.accounted_selection(algorithm.selection).client_level_event(agg.noise_multiplier, population)

"""The round loop: select -> broadcast -> local -> upload -> aggregate -> account, evaluate, log.

One loop for every algorithm. Privacy is accounted per client, in a ledger of DP events: before a
round, each client's next-round event is checked against its budget and a client whose budget would
be exceeded is retired (it never trains again); after the round the events that actually happened are
recorded. Noise multipliers are calibrated per client from (epsilon_i, delta_i) with the same
accountant, unless given explicitly.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from dp_accounting import ComposedDpEvent, DpEvent
from torch import nn

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.server.oracle import NoiseChannel, OracleAverage
from dpfl.algorithms.server.pfa import NoPublicClients
from dpfl.algorithms.server.stop import StopTraining
from dpfl.algorithms.server.view import ServerView
from dpfl.experiment.client_round import train_phases
from dpfl.engine import params as P
from dpfl.engine.allocator import tune_malloc
from dpfl.engine.evaluation import evaluate
from dpfl.engine.backends.base import Backend
from dpfl.engine.backends.local import LocalBackend
from dpfl.engine.local_training import DEFAULT_MAX_ELEMENTS, ClientPlan, replay_noise, trainable_names
from dpfl.engine.pooled import PooledData
from dpfl.privacy.accountant import epsilon, guarantee
from dpfl.privacy.budgets import ClientBudget
from dpfl.privacy.run_calibration import (PARTICIPATIONS, CalibratedNoise, PlannedRun, calibrate_run,
                                          calibration_targets, refuse_a_run_that_trains_nothing)
from dpfl.privacy.ledger import PrivacyLedger
from dpfl.seeding import Purpose, numpy_generator

REDRAWS = 50  # draws of a round's sample before giving up on a public participant (spec §4.2)
FLOAT_BYTES = 4


_MISSING = object()
_EVENT_CACHE_MAX = 65_536  # distinct client events kept (records x batch size x noise x upload)


def plain_row(value: Any) -> Any:
    """A metrics row with its NumPy scalars made Python numbers, recursively: rows go into the checkpoint, which
    `torch.load(weights_only=True)` refuses to read back if one NumPy scalar hides in it (an accountant's epsilon
    was one), and into metrics.jsonl, where they print the same either way."""
    if isinstance(value, dict):
        return {k: plain_row(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_row(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_row(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass
class RunState:
    """Everything needed to continue a run after `round` finished rounds (checkpoint content)."""

    round: int
    params: P.Params
    retired: list[int]
    ledger: dict[str, Any] | None
    history: list[dict[str, Any]]
    stop_reason: str | None
    steps_done: list[int]  # local steps each client has taken (the heuristic's budget is in steps)
    aggregator_state: dict[str, Any] | None = None  # stateful aggregators (PFA+ subspace, FedCEO's ŵ_k, ...)
    client_state: dict[str, Any] | None = None  # client-side state that never leaves the client (PPSGD's u_k)

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "params": self.params, "retired": self.retired, "ledger": self.ledger,
                "history": self.history, "stop_reason": self.stop_reason, "steps_done": self.steps_done,
                "aggregator_state": self.aggregator_state, "client_state": self.client_state}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunState:
        return cls(d["round"], d["params"], list(d["retired"]), d["ledger"], list(d["history"]), d["stop_reason"],
                   list(d["steps_done"]), d.get("aggregator_state"), d.get("client_state"))


@dataclass
class LocalRound:
    """One round's local training as the server receives it, plus the engine-only noise facts."""

    uploads: P.Params  # [K, ...] in view order
    view: ServerView
    channel: NoiseChannel
    noise_sq_norm: list[float] | None  # per client: ||sum_t xi_t||^2 of the Gaussian noise it drew (None: unknown)
    dim: int  # model parameters p


@dataclass
class RemoteRound:
    """What remote clients return for a round: their uploads (in the order asked) and their local facts."""

    uploads: P.Params  # [K, ...]
    steps: list[int]
    noise_sq_norm: list[float] | None  # None: the clients keep their noise to themselves (secret seeds)


@dataclass
class RunResult:
    """What a run produced: the final global model, one metrics row per round, and the ledger."""

    params: P.Params
    history: list[dict[str, Any]]
    ledger: PrivacyLedger | None
    noise_multipliers: np.ndarray
    stop_reason: str
    privacy: dict[str, Any] = field(default_factory=dict)

    @property
    def final_accuracy(self) -> float | None:
        """The server's model's last test accuracy (for methods with personal models, not their metric)."""
        return self._last("test_accuracy")

    @property
    def final_personal_accuracy(self) -> float | None:
        """The last acc_personal (methods whose clients use personal models: their metric); None for the others."""
        return self._last("acc_personal")

    def _last(self, key: str) -> float | None:
        for row in reversed(self.history):
            if row.get(key) is not None:
                return row[key]
        return None

    def spent(self) -> dict[int, float]:
        return self.ledger.spent_all() if self.ledger is not None else {}


class FederatedRun:
    """A federated training run over `data` (a FederatedDataset) with `algorithm`.

    budgets: one ClientBudget per client (or one for all); required for any private algorithm. These
    are the *true* budgets: calibration and accounting use them.
    noise_multipliers: the DP-SGD multipliers per client (or one); None calibrates each client's multiplier so
    that its planned participation over `rounds` spends exactly its calibration target. A stage built
    without noise (central DP-FedAvg's server, UDP uploads, Noisy-FedAvg's parameter noise) is calibrated
    from the budgets too; every noise-from-budget decision is `dpfl.privacy.run_calibration.calibrate_run`.
    participation: "expected" (rounds x participation rate, the PFA spec's T*: a client drawn more often
    retires when its budget is reached, and a fixed-K run may stop early with stop_reason "budget") or
    "worst_case" (every round: nobody retires before the last round, at the price of more noise).
    calibrate_to: "own" (each client its own budget), "min" / "max" (everyone the smallest / largest
    *reported* epsilon: PFA's Minimum-ε and Maximum-ε baselines) or a number (everyone that epsilon).
    allow_budget_violation: needed for targets above some budget (Maximum-ε): budgets are then not
    enforced, the run is tagged `meets_budgets: false`, and spent epsilons are still reported.
    misreport: {client: factor}: that client reports factor × its true epsilon to the server; only
    components that trust reports (WeiAvg weights, min/max targets) see it (spec heterogeneous_dp §6).
    calibration: "accountant" (default: bisection against the run's accountant) or "pfa-heuristic",
    PFA's formula, which is NOT a guarantee: clients then stop after the T* steps the formula was
    computed for (PFA semantics), and the epsilon reported is still the accountant's epsilon of the
    noise actually used, which may exceed the budget (the run is then tagged meets_budgets: false).
    batch_sizes: per client (or one).
    backend: where the cohort's local training runs (engine/backends: in process by default, or Ray actors); the
    run's result does not depend on it (all randomness is keyed by seed, round and client).
    """

    def __init__(
        self,
        data: Any,
        model: nn.Module,
        algorithm: Algorithm,
        *,
        rounds: int,
        batch_sizes: int | Sequence[int],
        budgets: ClientBudget | Sequence[ClientBudget] | None = None,
        noise_multipliers: float | Sequence[float] | None = None,
        accountant: str = "rdp",
        seed: int = 0,
        eval_every: int = 1,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
        calibrate_to: str | float = "own",
        allow_budget_violation: bool = False,
        misreport: Mapping[int, float] | None = None,
        calibration: str = "accountant",
        participation: str = "expected",
        backend: Backend | None = None,
    ) -> None:
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        if eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {eval_every}")
        declared = getattr(model, "loss_kind", None)
        if declared is not None and declared != algorithm.local.spec.loss:
            raise ValueError(f"the model is trained with loss {declared!r} but the local program uses "
                             f"{algorithm.local.spec.loss!r}; pass loss={declared!r} to the local program")
        self.data, self.model, self.algorithm = data, model, algorithm
        self.rounds, self.seed, self.eval_every, self.max_elements = rounds, seed, eval_every, max_elements
        self.accountant = accountant
        self.backend: Backend = backend if backend is not None else LocalBackend()
        self._client_events: tuple[tuple[Any, Any], dict] = ((None, None), {})  # see _event_cache
        self.pooled = PooledData.from_clients([c.x_train for c in data.clients], [c.y_train for c in data.clients])
        n = self.pooled.n_clients
        self.n_clients = n
        self.n_records = self.pooled.sizes.numpy()
        with_val = [c for c in data.clients if getattr(c, "n_val", 0)]  # the union the searches select on
        self.val_data = ((torch.cat([c.x_val for c in with_val]), torch.cat([c.y_val for c in with_val]))
                         if with_val else None)
        self.batch_sizes = _per_client(batch_sizes, n, "batch_sizes", int)
        if (self.batch_sizes < 1).any():
            raise ValueError("every batch size must be >= 1")
        self.budgets = _per_client(budgets, n, "budgets", None) if budgets is not None else None
        private = algorithm.unit is not None and algorithm.accounted
        if algorithm.unit is not None and self.budgets is None:
            raise ValueError(f"algorithm {algorithm.name!r} is private ({algorithm.unit}-level): give budgets")
        self.eps_reported = self._reported_epsilons(misreport or {})
        fit = getattr(algorithm.aggregator, "fit_split", None)
        if fit is not None:  # aggregators that need population-level facts (PFA's public/private split)
            self.algorithm = algorithm = replace(algorithm, aggregator=fit(np.arange(n), self.eps_reported, seed))
        self.calibrate_to, self.enforce_budgets = calibrate_to, not allow_budget_violation
        if calibration not in ("accountant", "pfa-heuristic"):
            raise ValueError(f"calibration must be 'accountant' or 'pfa-heuristic', got {calibration!r}")
        if participation not in PARTICIPATIONS:
            raise ValueError(f"participation must be one of {', '.join(PARTICIPATIONS)}, got {participation!r}")
        self.calibration, self.participation = calibration, participation
        self.heuristic_steps: np.ndarray | None = None  # T*_i under the heuristic
        self.steps_done = np.zeros(self.n_clients, dtype=np.int64)
        self.ledger: PrivacyLedger | None = None
        if private and self.budgets is not None:
            self.ledger = PrivacyLedger(
                list(range(n)),
                deltas={i: b.delta for i, b in enumerate(self.budgets)},
                budgets={i: b.epsilon for i, b in enumerate(self.budgets)},
                accountant=accountant,
                unit=algorithm.unit,
            )
        self.calibrated: CalibratedNoise | None = None  # what the noise was calibrated for, if it was
        # privacy audits only (dpfl.evaluate.audit): (client ids, their local updates, round) -> the updates that go
        # into the upload stage; canary clients' updates are replaced there, before any clipping or noise
        self.update_hook: Callable[[list[int], P.Params, int], P.Params] | None = None
        # a real federation (dpfl.flower): `round(run, r, w, ids)` returns the selected clients' uploads `[K, ...]`,
        # their local steps and noise norms (a `RemoteRound`), computed by the clients themselves
        self.remote_clients: Any = None
        self.noise = self._noise_multipliers(noise_multipliers)
        self._calibrate_stage()

    # ---- calibration -----------------------------------------------------------------------------
    def _reported_epsilons(self, misreport: Mapping[int, float]) -> np.ndarray:
        """What each client tells the server its epsilon is (true budget unless it lies)."""
        n = self.n_clients
        true = np.array([b.epsilon for b in self.budgets] if self.budgets is not None else [np.inf] * n, dtype=float)
        reported = true.copy()
        for client, factor in misreport.items():
            if not 0 <= int(client) < n:
                raise ValueError(f"misreport names client {client}, outside 0..{n - 1}")
            if not factor > 0:
                raise ValueError(f"misreport factor must be > 0, got {factor} for client {client}")
            reported[int(client)] = true[int(client)] * float(factor)
        return reported

    def _participation_rates(self) -> list[float]:
        """Per client: the probability of taking part in a round, counting re-draws for a required group (PFA)."""
        n, sel, agg = self.n_clients, self.algorithm.selection, self.algorithm.aggregator
        required = getattr(agg, "public_clients", None) if hasattr(agg, "accepts_selection") else None
        if not required:
            return [sel.participation_rate(n)] * n
        members = set(required)
        return [sel.participation_rate_given(n, len(members), i in members) for i in range(n)]

    def planned_run(self, mechanism: str) -> PlannedRun:
        """The run as planned, for the calibration of `mechanism`'s noise (dpfl.privacy.run_calibration)."""
        assert self.budgets is not None
        alg, sel = self.algorithm, self.algorithm.selection
        kw: dict[str, Any] = {}
        if mechanism == "dpsgd":
            local = alg.local
            steps = [local.steps_for(int(m), int(b)) for m, b in zip(self.n_records, self.batch_sizes, strict=True)]
            kw = dict(records=self.n_records.tolist(), batch_sizes=self.batch_sizes.tolist(), local_steps=steps,
                      local_sampling=local.sampling, participation_rates=self._participation_rates(),
                      targets=calibration_targets(list(self.budgets), self.eps_reported, self.calibrate_to,
                                                  self.enforce_budgets),
                      method=self.calibration)
        elif mechanism == "udp":
            kw = dict(upload_cohort=alg.upload.event_cohort, hidden_sampling=alg.upload.hidden_sampling)
        elif mechanism == "param_noise":
            kw = dict(noisy=alg.upload.accounting)
        return PlannedRun(mechanism, list(self.budgets), self.rounds, accountant=self.accountant, selection=sel.kind,
                          k=sel.k, rate=sel.rate, participation=self.participation, **kw)

    def _noise_multipliers(self, given: float | Sequence[float] | None) -> np.ndarray:
        """The clients' DP-SGD noise multipliers: given, or calibrated from their budgets."""
        n = self.n_clients
        if not self.algorithm.local.private:
            return np.zeros(n)
        if given is not None:
            z = _per_client(given, n, "noise_multipliers", float)
            if (z < 0).any():
                raise ValueError("noise multipliers must be >= 0")
            return z
        plan = self.planned_run("dpsgd")
        self.calibrated = calibrate_run(plan)
        if self.enforce_budgets:  # Maximum-epsilon (budgets not enforced) trains every round whatever was planned
            refuse_a_run_that_trains_nothing(plan, self.calibrated)
        if self.calibration == "pfa-heuristic":
            self.heuristic_steps = self.calibrated.steps
        return self.calibrated.noise

    def _calibrate_stage(self) -> None:
        """Give the stage whose noise is unset (central server, client uploads, parameter noise) its noise."""
        name = self.algorithm.uncalibrated_stage()
        if name is None:
            return
        if self.budgets is None:
            raise ValueError(f"algorithm {self.algorithm.name!r}: no noise given and no budgets to calibrate it from")
        stage = getattr(self.algorithm, name)
        self.calibrated = calibrate_run(self.planned_run(stage.mechanism))
        self.algorithm = replace(self.algorithm, **{name: stage.with_noise(float(self.calibrated.noise[0]))})

    # ---- events ----------------------------------------------------------------------------------
    def _client_event(self, i: int, r: int, cohort: int) -> DpEvent | None:
        """The event taking part in round r (0-based), `cohort` uploads averaged, costs client i (local program and
        upload).

        Built once per distinct (records, batch size, noise, upload event) and then shared: the local program's
        event is a pure function of the first three, and in a large population most clients share all four, so
        they share one event object (which the ledger's grouped budget check relies on).
        """
        up = self.algorithm.upload.event(i, r, cohort) if self.algorithm.upload.accounted else None
        key = (int(self.n_records[i]), self._batch(i, r), float(self.noise[i]), None if up is None else repr(up))
        cache = self._event_cache()
        event = cache.get(key, _MISSING)
        if event is _MISSING:
            local = self.algorithm.local.event(*key[:3])
            events = [e for e in (local, up) if e is not None]
            event = None if not events else events[0] if len(events) == 1 else ComposedDpEvent(events)
            if len(cache) >= _EVENT_CACHE_MAX:
                cache.clear()
            cache[key] = event
        return event  # type: ignore[return-value]

    def _batch(self, i: int, r: int) -> int:
        """Client i's batch size in round r (the local program may schedule it: R-DPCFL's full-batch round 1)."""
        batch_for = getattr(self.algorithm.local, "batch_for", None)
        b = int(self.batch_sizes[i])
        return int(batch_for(int(self.n_records[i]), b, r)) if batch_for is not None else b

    def _steps(self, i: int, r: int) -> int:
        """Client i's local steps in round r as planned: what its ledger is charged and its T* budget counts."""
        return self.algorithm.local.steps_for(int(self.n_records[i]), self._batch(i, r))

    def _event_cache(self) -> dict:
        """The client-event cache of the current local program and upload stage (emptied when either changes,
        e.g. when calibration gives a stage its noise)."""
        (local, upload), cache = self._client_events
        if local is not self.algorithm.local or upload is not self.algorithm.upload:
            cache = {}
            self._client_events = ((self.algorithm.local, self.algorithm.upload), cache)
        return cache

    def _server_event(self, population: int) -> DpEvent | None:
        """The event one round costs every client still in the population (central DP, or UDP uploads whose
        sampling is assumed hidden from the server)."""
        if not self.algorithm.central:
            round_event = getattr(self.algorithm.upload, "round_event", None)
            return round_event(self.algorithm.selection, population) if round_event is not None else None
        agg = self.algorithm.aggregator
        return self.algorithm.selection.client_level_event(agg.noise_multiplier, population)

    # ---- the loop --------------------------------------------------------------------------------
    def initial_state(self) -> RunState:
        """The state before round 1: the model's initial parameters, nobody retired, empty ledger."""
        return RunState(0, P.model_params(self.model), [], None, [], None, [0] * self.n_clients)

    def run(
        self,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        *,
        state: RunState | None = None,
        on_checkpoint: Callable[[RunState], None] | None = None,
        checkpoint_every: int = 1,
    ) -> RunResult:
        """Run the remaining rounds from `state` (a fresh start by default).

        All randomness is keyed by (seed, round, client), so resuming from a checkpointed state gives
        exactly the rounds an uninterrupted run would have produced. `on_checkpoint` receives the state
        every `checkpoint_every` rounds and once at the end.
        """
        tune_malloc()
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        state = state if state is not None else self.initial_state()
        if state.ledger is not None:
            if self.ledger is None:
                raise ValueError("the checkpoint has a privacy ledger but this run is not accounted")
            self.ledger = PrivacyLedger.from_dict(state.ledger)
        elif self.ledger is not None and state.round > 0:  # resuming would forget what the clients spent
            raise ValueError(f"the state after round {state.round} has no privacy ledger but this run is accounted")
        if hasattr(self.algorithm.aggregator, "load_state_dict"):
            self.algorithm.aggregator.load_state_dict(state.aggregator_state)
        if self.algorithm.personal is not None:
            self.algorithm.personal.load_state_dict(state.client_state)
        w, retired, history = state.params, set(state.retired), [plain_row(row) for row in state.history]
        self.steps_done = np.array(state.steps_done, dtype=np.int64)
        stop_reason = state.stop_reason
        r = state.round
        try:
            w, r, history, stop_reason = self._rounds(w, r, retired, history, stop_reason, on_round, on_checkpoint,
                                                      checkpoint_every)
        finally:
            self.backend.close()  # workers of a remote backend end with the run (or its failure)
        stop_reason = stop_reason or "rounds"
        if on_checkpoint is not None:
            on_checkpoint(self._state(r, w, retired, history, stop_reason))
        return RunResult(w, history, self.ledger, self.noise, stop_reason,
                         self.privacy_summary(stop_reason, r, history, retired=retired))

    def _rounds(self, w: P.Params, r: int, retired: set[int], history: list[dict[str, Any]], stop_reason: str | None,
                on_round: Callable[[dict[str, Any]], None] | None, on_checkpoint: Callable[[RunState], None] | None,
                checkpoint_every: int) -> tuple[P.Params, int, list[dict[str, Any]], str | None]:
        """Rounds r+1 .. until the last, a budget or a stop; a checkpoint every `checkpoint_every` rounds."""
        while stop_reason is None and r < self.rounds:
            try:
                step = self._one_round(r, w, retired)
            except StopTraining as stop:
                stop_reason = stop.stop_reason
                break
            if step is None:
                stop_reason = "budget"
                break
            w, row = step
            row = plain_row(row)
            history.append(row)
            r += 1
            if on_round is not None:
                on_round(row)
            if on_checkpoint is not None and r % checkpoint_every == 0 and r < self.rounds:
                on_checkpoint(self._state(r, w, retired, history, None))
        return w, r, history, stop_reason

    def _state(self, r: int, w: P.Params, retired: set[int], history: list[dict[str, Any]],
               stop: str | None) -> RunState:
        ledger = self.ledger.to_dict() if self.ledger is not None else None
        agg = self.algorithm.aggregator
        agg_state = copy.deepcopy(agg.state_dict()) if hasattr(agg, "state_dict") else None
        personal = self.algorithm.personal
        client_state = copy.deepcopy(personal.state_dict()) if personal is not None else None
        return RunState(r, {n: t.clone() for n, t in w.items()}, sorted(retired), ledger, list(history), stop,
                        self.steps_done.tolist(), agg_state, client_state)

    def _one_round(self, r: int, w: P.Params, retired: set[int]) -> tuple[P.Params, dict[str, Any]] | None:
        """Round r (0-based): new global parameters and its metrics row, or None if budgets end the run."""
        alg = self.algorithm
        t0, cpu0 = time.perf_counter(), time.process_time()
        dim = P.num_parameters(w)
        active = np.array([i for i in range(self.n_clients) if i not in retired], dtype=np.int64)
        server_event = self._server_event(len(active))
        eligible = self._eligible(active, server_event, r)
        retired.update(int(i) for i in set(active.tolist()) - set(eligible.tolist()))
        if len(eligible) < alg.selection.min_candidates():
            return None
        if server_event is not None and len(eligible) != len(active):
            server_event = self._server_event(len(eligible))
        selected = self._select(eligible, r)
        expected = alg.selection.expected_count(len(eligible))
        for i in selected:
            self.steps_done[i] += self._steps(i, r)
        asks = hasattr(alg.aggregator, "model_choice")  # clients may answer a question after aggregation
        self._record(r, selected, eligible, server_event, close=not asks)  # before aggregation: spent even if it stops
        new_w, bytes_up, bytes_down, diagnostics = w, [], [], {}
        if len(selected):
            start_points = getattr(alg.aggregator, "start_points", None)  # personalised starts (FedCEO)
            ids = [int(i) for i in selected]
            if alg.personal is not None:  # w + the clients' own local parts (PPSGD)
                starts = alg.personal.start_points(w, ids, r)
            else:
                starts = start_points(w, ids, r) if start_points is not None else None
            local = self.local_round(r, w, selected, expected, starts=starts)
            uploads, view, channel = local.uploads, local.view, local.channel
            bytes_up = [alg.upload.bytes_per_upload(P.num_parameters(uploads, leading=1))] * len(selected)
            bytes_down = [FLOAT_BYTES * dim] * len(selected)  # the global model
            encode = getattr(alg.aggregator, "client_payload", None)
            if encode is not None:  # clients send what the broadcast asks for (PFA+: k-dim codes)
                uploads = encode(uploads, view, self.seed)
                bytes_up = list(uploads.bytes_up)
                bytes_down = [d + extra for d, extra in zip(bytes_down, uploads.bytes_down_subspace, strict=True)]
                traffic = uploads.traffic(FLOAT_BYTES * dim)
            if getattr(alg.aggregator, "privileged", False):  # only oracles may read the engine's channel
                new_w = alg.aggregator.aggregate(w, uploads, view, self.seed, r, channel=channel)
            elif alg.personal is not None:  # the server sees and updates the shared tensors only
                shared = alg.aggregator.aggregate({n: w[n] for n in uploads}, uploads, view, self.seed, r)
                new_w = alg.personal.global_model({**w, **shared})
            elif start_points is not None:  # uploads are relative to each client's own start
                new_w = alg.aggregator.aggregate(w, uploads, view, self.seed, r, starts=starts)
            else:
                new_w = alg.aggregator.aggregate(w, uploads, view, self.seed, r)
            diagnostics = self._diagnostics(alg.aggregator, local)
            diagnostics.update(self.noise_passthrough(local, r))
            if hasattr(alg.aggregator, "diagnostics"):
                diagnostics.update(alg.aggregator.diagnostics())
            diagnostics.update({"bytes_up": bytes_up, "bytes_down": bytes_down})
            if encode is not None:
                diagnostics["traffic"] = traffic
        elif alg.central:  # nobody drawn: the server still releases a noised (empty) sum
            empty = {n: t.unsqueeze(0)[:0] for n, t in w.items()}
            new_w = alg.aggregator.aggregate(w, empty, self._view(selected, expected), self.seed, r)
        if asks:
            choice = alg.aggregator.model_choice(r, new_w)
            if choice is not None:
                alg.aggregator.chosen(r, self._private_choices(choice, r))
                diagnostics.update(alg.aggregator.diagnostics())
            if self.ledger is not None:
                self.ledger.close_round(r)
        row = self._row(r, new_w, selected, sum(bytes_up), sum(bytes_down), time.perf_counter() - t0,
                        time.process_time() - cpu0, diagnostics)
        return new_w, {**row, **diagnostics}

    def _private_choices(self, choice: Any, r: int) -> dict[int, int]:
        """Each asked client scores the broadcast models on its own training data and reports the exponential
        mechanism's pick (`private_selection.answer`); its cost goes on the client's ledger. A client whose budget
        cannot pay for it does not answer (and keeps its cluster)."""
        from dpfl.algorithms.client.private_selection import answer
        from dpfl.privacy.two_stage import selection_event

        event = selection_event(choice.eps_sel)
        picks: dict[int, int] = {}
        self.model.eval()
        for i in choice.clients:
            if self.ledger is not None and self.enforce_budgets and self.ledger.would_exceed(i, event):
                continue
            c = self.data.clients[i]
            picks[i] = answer(choice, self.model, c.x_train, c.y_train, self.algorithm.local.spec.loss,
                              numpy_generator(self.seed, Purpose.CHOICE, r, i))
            if self.ledger is not None:
                self.ledger.record(i, r, event)
        self.model.train()
        return picks

    def first_round(self) -> tuple[P.Params, LocalRound]:
        """The initial model and round 1's local training from it of the clients round 1 selects, as the run's own
        round 1 would train them; nothing is recorded. For diagnostics of round 1 at the run's full calibration
        (the round-1 noise table, R-DPCFL's b^1 analysis)."""
        w = P.model_params(self.model)
        selected = self.algorithm.selection.select(list(range(self.n_clients)), self.seed, 0)
        return w, self.local_round(0, w, selected, self.algorithm.selection.expected_count(self.n_clients))

    def local_round(self, r: int, w: P.Params, selected: np.ndarray, expected: float,
                    starts: P.Params | None = None) -> LocalRound:
        """Round r's local training of `selected` from `w`: their uploads, the server's view, the noise facts.

        `starts` (stacked `[K, ...]`) gives each client its own start model instead of `w`; updates are
        then relative to it. Public so that diagnostics (e.g. the round-1 noise statistic of several
        aggregators on the same uploads) can reuse exactly the engine's round; it records nothing in the ledger.
        """
        alg = self.algorithm
        ids = [int(i) for i in selected]
        if self.remote_clients is not None:  # the clients train on their own machines (a Flower federation)
            if starts is not None or alg.personal is not None or self.update_hook is not None:
                raise ValueError(f"algorithm {alg.name!r}: remote clients run stateless local programs from the "
                                 "global model only (no personal starts, client state or audit hook)")
            remote = self.remote_clients.round(self, r, w, ids)
            planned = [self._steps(i, r) for i in ids]
            over = [(i, int(s), p) for i, s, p in zip(ids, remote.steps, planned, strict=True) if int(s) > p]
            if over:  # the ledger charged the planned steps: more would spend more than it recorded
                raise ValueError(f"round {r + 1}: clients took more local steps than the ledger charged "
                                 f"((client, reported, planned): {over[:5]}); the accounting would not cover the run")
            return LocalRound(remote.uploads, self._view(selected, expected), self._channel(selected, remote.steps),
                              remote.noise_sq_norm, P.num_parameters(w))
        trained = train_phases(
            alg, self.model, self.backend, self.pooled,
            lambda phase: self._plans(phase, selected, r),
            starts if starts is not None else w, stacked=starts is not None, seed=self.seed, round_=r,
            max_elements=self.max_elements, global_model=w)
        current = trained.params
        deltas = P.sub(current, starts if starts is not None else P.broadcast(w, len(selected)))
        if alg.personal is not None:  # keep the local part on the client; the rest is the shared update
            deltas = alg.personal.shared_update(deltas, ids)
        if self.update_hook is not None:
            deltas = self.update_hook(ids, deltas, r)
        uploads = alg.upload.apply(deltas, ids, self.seed, r)
        return LocalRound(uploads, self._view(selected, expected), self._channel(selected, trained.steps),
                          trained.noise_sq_norm, P.num_parameters(w))

    def _plans(self, program: Any, selected: Sequence[int], r: int) -> list[ClientPlan]:
        """What each selected client runs in round r under `program` (one phase of the local program)."""
        return [program.plan(int(i), int(self.n_records[i]), int(self.batch_sizes[i]), float(self.noise[i]), r)
                for i in selected]

    def _select(self, eligible: np.ndarray, r: int) -> np.ndarray:
        """The round's participants; re-drawn (up to REDRAWS times) while the aggregator rejects the sample.

        PFA needs a public participant (spec §4.2). The re-draw depends only on reported epsilons, never
        on data, so it does not change any sample-level guarantee.
        """
        selection, accepts = self.algorithm.selection, getattr(self.algorithm.aggregator, "accepts_selection", None)
        selected = selection.select(eligible, self.seed, r)
        if accepts is None:
            return selected
        if not accepts(eligible):
            raise NoPublicClients("no eligible public client remains (stop_reason 'no_public')")
        for attempt in range(1, REDRAWS):
            if accepts(selected):
                return selected
            selected = selection.select(eligible, self.seed, r, attempt)
        if not accepts(selected):
            raise NoPublicClients(f"no public client in {REDRAWS} draws of round {r + 1} (stop_reason 'no_public')")
        return selected

    def _view(self, selected: np.ndarray, expected: float) -> ServerView:
        """What the server sees of the selected clients (reported, not true, epsilons)."""
        deltas = [self.budgets[i].delta for i in selected] if self.budgets is not None else [0.0] * len(selected)
        return ServerView(torch.as_tensor(selected, dtype=torch.int64), torch.as_tensor(self.n_records[selected]),
                          torch.as_tensor(self.batch_sizes[selected], dtype=torch.int64),
                          torch.as_tensor(self.eps_reported[selected], dtype=torch.float64),
                          torch.as_tensor(deltas, dtype=torch.float64), expected)

    def _channel(self, selected: np.ndarray, steps: list[int]) -> NoiseChannel:
        spec = self.algorithm.local.spec
        return NoiseChannel(torch.as_tensor(steps, dtype=torch.int64),
                            torch.as_tensor(self.noise[selected], dtype=torch.float64), spec.clip or 0.0, spec.lr)

    def _diagnostics(self, aggregator: Any, local: LocalRound) -> dict[str, Any]:
        """Aggregation weights, and (for DP-SGD clients and weighted-sum aggregators) the noise statistic."""
        if not hasattr(aggregator, "weights"):
            return {}
        privileged = getattr(aggregator, "privileged", False)
        view = local.view
        w = aggregator.weights(view, local.channel, local.dim) if privileged else aggregator.weights(view)
        out: dict[str, Any] = {"weights": w.to(torch.float64).tolist()}
        linear = getattr(aggregator, "linear_in_updates", True)  # PFA: private updates are projected
        stats = self.noise_statistics(w, local)  # empty unless the clients run DP-SGD without momentum
        if linear:
            out.update(stats)
        public_mask = getattr(aggregator, "public_mask", None)
        if public_mask is not None:  # PFA's group labels (spec §5): which weights reach Δ̄ through the projection
            out["public"] = public_mask(view, self.seed).tolist()
        if stats:
            out.update(self._oracle_comparison(w, local, stats["noise_stat_analytic"] if linear else None))
        return out

    def _oracle_comparison(self, w: torch.Tensor, local: LocalRound, stat: float | None) -> dict[str, Any]:
        """Spec heterogeneous_dp §5 `weights`: the oracle's weights w* (∝ 1/σ_i², the smallest noise statistic a
        weighted mean of the round's uploads reaches), ||w − w*||₁ and, for weighted-sum aggregators,
        noise_stat(w) / noise_stat(w*) ≥ 1 (analytic). Engine-side: w* needs the true noise multipliers. Empty when
        a participant adds no noise (w* would give it all the weight)."""
        if not bool((local.channel.update_noise_variance(local.view, local.dim) > 0).all()):
            return {}
        star = OracleAverage().weights(local.view, local.channel, local.dim).to(torch.float64)
        out: dict[str, Any] = {"oracle_weights": star.tolist(),
                               "weights_l1_to_oracle": float((w.to(torch.float64) - star).abs().sum())}
        if stat is not None:
            out["noise_stat_ratio_to_oracle"] = stat / self.noise_statistics(star, local)["noise_stat_analytic"]
        return out

    def noise_passthrough(self, local: LocalRound, r: int) -> dict[str, float]:
        """PFA's `pfa_noise_passthrough` (spec heterogeneous_dp §5): ||N||^2 / (p eta^2), N the part of the
        aggregate that is the clients' DP noise (their noise pushed through the round's projection). The noise is
        redrawn from the clients' generators (`replay_noise`), so only where the engine trains the clients itself,
        with plain DP-SGD steps at one rate (no momentum, no step schedule, one phase) and uploads equal to the
        updates; empty otherwise. Public for diagnostics of one round (`first_round`), like `noise_statistics`."""
        alg = self.algorithm
        passthrough = getattr(alg.aggregator, "noise_passthrough", None)
        program = alg.local
        if (passthrough is None or local.noise_sq_norm is None or not getattr(program, "private", False)
                or len(getattr(program, "phases", (program,))) != 1 or alg.personal is not None
                or self.update_hook is not None or self.remote_clients is not None
                or not isinstance(alg.upload, FullUpdate)):
            return {}
        spec = program.spec_at(r)
        if spec.momentum != 0 or spec.sampling not in ("poisson", "fixed"):
            return {}
        plans = self._plans(program, local.view.clients.tolist(), r)
        if any(p.step_lrs is not None for p in plans):
            return {}
        like = {n: local.uploads[n] for n in trainable_names(spec, local.uploads)}  # as run_local flattens them
        sums = replay_noise(plans, P.num_parameters(like, leading=1), self.seed, r).to(torch.float64)
        # the noise in client i's update: -(eta / b_i) z_i C sum_t xi_t (Poisson: the nominal batch divides)
        scale = torch.tensor([-spec.lr * p.noise_multiplier * (spec.clip or 0.0) / p.batch_size for p in plans],
                             dtype=torch.float64)
        flat = P.unflatten(sums * scale[:, None], like, leading=1)
        noise = {n: flat[n] if n in flat else torch.zeros_like(u, dtype=torch.float64)
                 for n, u in local.uploads.items()}
        out = passthrough(local.uploads, noise, local.view, self.seed, r)
        sq = sum(float(t.pow(2).sum()) for t in out.values())
        return {"pfa_noise_passthrough": sq / (local.dim * spec.lr * spec.lr)}

    def noise_statistics(self, weights: torch.Tensor, local: LocalRound) -> dict[str, float]:
        """noise_stat = sum_i w_i^2 sigma_i^2 / (p eta^2) of a weighted sum of the round's updates.

        Spec heterogeneous_dp §5: `_analytic` with sigma_i^2 = T_i eta^2 p C^2 z_i^2 / b_i^2, `_empirical`
        with sigma_i^2 = ||n_i||^2, n_i = -(eta / b_i) sum_t xi_t the noise actually injected (exact for
        plain SGD steps, i.e. without momentum). Diagnostics only: never shown to a non-privileged
        aggregator. Empty unless the clients run DP-SGD without momentum.
        """
        spec = self.algorithm.local.spec
        if not self.algorithm.local.private or spec.momentum != 0 or self.algorithm.personal is not None:
            return {}
        w, view, lr = weights.to(torch.float64), local.view, spec.lr
        scale = local.dim * lr * lr  # not lr**2: a float power overflows with an exception, a product to inf
        out = {"noise_stat_analytic": float((w.pow(2) * local.channel.update_noise_variance(view, local.dim)).sum()
                                            / scale)}
        if local.noise_sq_norm is not None:  # unknown when remote clients keep their noise secret
            n_sq = (torch.tensor(local.noise_sq_norm, dtype=torch.float64)
                    * (lr / view.batch_sizes.to(torch.float64)) ** 2)
            out["noise_stat_empirical"] = float((w.pow(2) * n_sq).sum() / scale)
        return out

    def _eligible(self, active: np.ndarray, server_event: DpEvent | None, r: int) -> np.ndarray:
        """Clients whose round r (if they take part) keeps them within budget.

        Where the event depends on the number of uploads averaged (Noisy-FedAvg's aggregate view, everyone taking
        part), a retirement makes the cohort smaller and the others' events stronger: re-check until no one else
        retires, so every recorded event was checked against the budget.
        """
        if self.ledger is None or not self.enforce_budgets:
            return active
        if self.heuristic_steps is not None:  # PFA semantics: a client may spend its T* steps
            fits = [int(i) for i in active if self.steps_done[i] + self._steps(i, r) <= self.heuristic_steps[i]]
            return np.array(fits, dtype=np.int64)
        candidates = [int(i) for i in active]
        while True:
            cohort = self._cohort_size(len(candidates))
            checks = [(i, server_event if server_event is not None else self._client_event(i, r, cohort))
                      for i in candidates]
            over = self.ledger.exceeding((i, e) for i, e in checks if e is not None)
            keep = [i for i in candidates if i not in over]
            if len(keep) == len(candidates) or self._cohort_size(len(keep)) == cohort:
                return np.array(keep, dtype=np.int64)
            candidates = keep

    def _cohort_size(self, eligible: int) -> int:
        """Uploads averaged in a round with `eligible` candidates: all of them, k, or the Poisson expectation."""
        sel = self.algorithm.selection
        if sel.kind == "all":
            return max(1, eligible)
        if sel.kind == "fixed":
            assert sel.k is not None
            return sel.k
        return max(1, round(sel.expected_count(eligible)))

    def _record(self, r: int, selected: np.ndarray, eligible: np.ndarray, server_event: DpEvent | None, *,
                close: bool = True) -> None:
        if self.ledger is None:
            return
        if server_event is not None:
            self.ledger.record_many([int(i) for i in eligible], r, server_event)
        for i in selected:
            event = self._client_event(int(i), r, len(selected))
            if event is not None:
                self.ledger.record(int(i), r, event)
        if close:
            self.ledger.close_round(r)

    def _row(self, r: int, w: P.Params, selected: np.ndarray, up: int, down: int, seconds: float,
             cpu_seconds: float, diagnostics: Mapping[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {"round": r + 1, "selected": [int(i) for i in selected], "uplink_bytes": up,
                               "downlink_bytes": down,
                               # where DP noise accumulates: a random walk in the weights grows this norm (docs)
                               "param_norm": float(P.global_norms(w, leading=0))}
        if (r + 1) % self.eval_every == 0 or r + 1 == self.rounds:
            self.model.eval()
            acc, loss = evaluate(self.model, w, self.data.x_test, self.data.y_test, self.algorithm.local.spec.loss)
            row["test_accuracy"], row["test_loss"] = acc, loss
            row.update(self._validation_accuracy(w))
            row.update(self._client_accuracy(w))
            self.model.train()
        if "smoothing" in diagnostics or "test_accuracy" in row:
            row.update(self._personal_accuracy(w))
        if self.ledger is not None:
            spent = self.ledger.spent_all()
            row["epsilon"] = [spent[i] for i in range(self.n_clients)]
            row["epsilon_max"] = max(row["epsilon"])
        row["seconds"] = seconds
        if isinstance(self.backend, LocalBackend):
            # This process's CPU time (all threads): unlike wall time, not inflated by other processes sharing the
            # machine or by a pause. Absent with a remote backend, whose actors' CPU time is not in it.
            row["cpu_seconds"] = cpu_seconds
        return row

    def _validation_accuracy(self, w: P.Params) -> dict[str, Any]:
        """The global model on the union of the clients' validation splits: what tuning selects on, never the test
        set."""
        if self.val_data is None:
            return {}
        acc, loss = evaluate(self.model, w, *self.val_data, self.algorithm.local.spec.loss)
        return {"val_accuracy": acc, "val_loss": loss}

    def _accuracy_on_client(self, params: P.Params, client: int) -> float | None:
        """Accuracy of `params` on a client's own held-out split (None if it has none); model in eval mode."""
        c = self.data.clients[client]
        if getattr(c, "x_test", None) is None or len(c.x_test) == 0:
            return None
        return evaluate(self.model, params, c.x_test, c.y_test, self.algorithm.local.spec.loss)[0]

    def _client_accuracy(self, w: P.Params) -> dict[str, Any]:
        """The global model's accuracy on each client's held-out split (the RHDP protocol), if clients have one."""
        accs = [self._accuracy_on_client(w, c) for c in range(len(self.data.clients))]
        if not accs or any(a is None for a in accs):
            return {}
        return {"test_acc_clients": accs, "test_acc_clients_mean": float(np.mean(accs))}

    def _personal_models(self) -> Any:
        """Who holds the personal models: the client-side stage (PPSGD) or the server (FedCEO), if any."""
        for stage in (self.algorithm.personal, self.algorithm.aggregator):
            if hasattr(stage, "personal_models"):
                return stage
        return None

    def personal_models(self, w: P.Params) -> dict[int, P.Params]:
        """client -> the personal model it uses (its cluster's, PPSGD's w + u_k, FedCEO's, ...) given the global
        model `w`, for the clients that hold one now; {} for methods without personal models."""
        holder = self._personal_models()
        return (holder.personal_models(w) or {}) if holder is not None else {}

    def _personal_accuracy(self, w: P.Params) -> dict[str, Any]:
        """acc_personal: mean over clients holding a personal model of its accuracy on their own test split."""
        personal = self.personal_models(w)
        if not personal:
            return {}
        self.model.eval()
        accs = [self._accuracy_on_client(p, c) for c, p in sorted(personal.items())]
        self.model.train()
        if any(a is None for a in accs):
            return {}
        out = {"acc_personal": float(np.mean(accs)), "acc_personal_clients": len(accs)}
        info = getattr(self.data, "info", None) or {}
        truth, minority = info.get("true_cluster"), info.get("minority_cluster")
        if truth is not None and minority is not None:  # planted clusters (clustered_split): the parity metric
            mine = [a for c, a in zip(sorted(personal), accs, strict=True) if truth[c] == minority]
            if mine:
                out["acc_personal_minority"] = float(np.mean(mine))
        return out

    def privacy_summary(self, stop_reason: str, rounds_run: int | None = None,
                        history: Sequence[Mapping[str, Any]] = (), retired: Collection[int] = ()) -> dict[str, Any]:
        """The declared threat model and each client's budget, noise and spent epsilon (`history`: the rounds run,
        whose participants the f-DP report of Noisy-FedAvg/FedProx needs; `retired`: the clients that left the run
        on their budgets, which raised the others' sampling rate under fixed-K selection)."""
        alg = self.algorithm
        out: dict[str, Any] = {
            "algorithm": alg.name,
            "unit": alg.unit,
            "observer": alg.observer,
            "mechanism": alg.mechanism,
            "accountant": self.accountant if self.ledger is not None else None,
            "client_sampling": {"kind": alg.selection.kind, "k": alg.selection.k, "rate": alg.selection.rate},
            "local_sampling": alg.local.sampling,
            "stop_reason": stop_reason,
            "accounted": self.ledger is not None,
            "oracle": bool(getattr(alg.aggregator, "privileged", False)),
        }
        protocol = getattr(alg.aggregator, "protocol", None)
        if getattr(alg.aggregator, "secure", False) and protocol is not None:
            out["secure_aggregation"] = protocol.describe()
        if alg.unit is not None and self.ledger is None:
            out["warning"] = "a privacy mechanism ran for which dpfl computes no epsilon; no guarantee is reported"
        if self.ledger is not None and self.budgets is not None:
            spent = self.ledger.spent_all()
            out["clients"] = [
                {"client": i, "epsilon_budget": self.budgets[i].epsilon, "delta": self.budgets[i].delta,
                 "noise_multiplier": float(self.noise[i]) if alg.local.private else None,
                 "batch_size": int(self.batch_sizes[i]), "records": int(self.n_records[i]),
                 "epsilon_spent": spent[i], "epsilon_reported": float(self.eps_reported[i])}
                for i in range(self.n_clients)
            ]
            out["calibrated_to"] = self.calibrate_to if alg.local.private else None
            out["calibration"] = self.calibration if alg.local.private else None
            if self.heuristic_steps is not None:
                out["heuristic"] = ("noise from PFA's heuristic formula sigma = 10 q sqrt(T* log10(1/delta)) / "
                                    "epsilon, which is NOT a DP guarantee; epsilon_spent is the accountant's epsilon "
                                    "of that noise, epsilon_heuristic what the formula claims")
                for c in out["clients"]:
                    i = c["client"]
                    c["epsilon_heuristic"] = float(self.calibrated.targets[i]) * float(
                        np.sqrt(min(1.0, self.steps_done[i] / self.heuristic_steps[i])))
            out["meets_budgets"] = all(spent[i] <= self.budgets[i].epsilon * (1 + 1e-9) for i in range(self.n_clients))
            if not out["meets_budgets"]:
                over = [i for i in range(self.n_clients) if spent[i] > self.budgets[i].epsilon * (1 + 1e-9)]
                out["warning"] = (f"NOT PRIVATE AS PROMISED: clients {over[:10]}{'...' if len(over) > 10 else ''} "
                                  "spent more than their budgets (a non-private reference run)")
            if self.calibrated is not None:
                out["noise_calibration"] = self.calibrated.summary()
            fdp = getattr(alg.upload, "accounting", None)
            if fdp is not None:
                out["fdp"] = self._fdp_report(fdp, history)
            elif alg.unit == "sample":
                out.update(self._sample_level_views(list(spent.values())))
        if rounds_run and self.budgets is not None and hasattr(alg.upload, "aggregate_event"):
            out["aggregate_view"] = self._aggregate_view(rounds_run, len(retired))
        if getattr(alg.upload, "hidden_sampling", False):
            out["per_upload_amplification"] = (
                "ASSUMED: the server cannot tell which clients took part (Poisson client sampling hidden from it), "
                "so each upload's σ/√K is amplified by the sampling rate. A server that receives the individual "
                "uploads (FedCEO's, UDP-FedAvg's) can tell; against it the unamplified per-upload epsilon holds")
        notes = getattr(alg.aggregator, "privacy_notes", None)
        if notes is not None:  # a stage with releases of its own (R-DPCFL's private selections)
            out["stage"] = notes()
        if "clients" in out:
            out["guarantee"] = self._guarantee(out)
            for c, eps in zip(out["clients"], out["guarantee"].pop("per_client"), strict=True):
                c["epsilon_guarantee"] = eps
        return out

    def _guarantee(self, privacy: Mapping[str, Any]) -> dict[str, Any]:
        """The run's ONE epsilon per client, which number it is, and why any other epsilon in privacy.json differs.

        Accounted runs: the per-client ledger's epsilon, except for Noisy-FedAvg/FedProx, whose guarantee is the
        f-DP block's headline bound (spec fdp_accounting.md §4.5): the exact GDP conversion of the composition, or the
        shifted-interpolation bound where it applies (aggregate view, final release, an ASSUMED smoothness L).
        """
        assert self.budgets is not None
        spent = [c["epsilon_spent"] for c in privacy["clients"]]
        others: list[dict[str, Any]] = []
        fdp = privacy.get("fdp")
        if fdp is None:
            per_client = spent
            source = f"the per-client ledger ({self.accountant} accountant): epsilon_spent"
            if "per_upload_amplification" in privacy:
                source += (", amplified by client sampling under an ASSUMPTION (per_upload_amplification: the server "
                           "cannot tell who took part)")
        else:
            per_client = [c["epsilon"][str(self.budgets[c["client"]].delta)] for c in fdp["clients"]]
            head = fdp["headline"]
            source = f"the f-DP block's headline bound, {fdp['labels'][head]}, converted exactly to (epsilon, delta)"
            same = head == "composition" and self.accountant == "gdp"
            if not same:
                if head == "composition":
                    why = (f"the ledger composes the same per-round Gaussians with the {self.accountant} accountant, "
                           "whose conversion to (epsilon, delta) is not exact, so it is larger; budgets are enforced "
                           "on it, which is conservative")
                else:
                    why = ("the ledger composes the per-round Gaussians (the composition bound, on which budgets are "
                           f"enforced, {self.accountant} accountant); the shifted-interpolation bound is smaller "
                           "because only the final model is released and the loss is ASSUMED smooth "
                           f"(L = {fdp['params']['smoothness_L']:g})")
                others.append({"field": "clients[].epsilon_spent", "epsilon_max": max(spent), "why_it_differs": why})
        if "aggregate_view" in privacy:
            others.append({"field": "aggregate_view.epsilon", "epsilon_max": privacy["aggregate_view"]["epsilon"],
                           "why_it_differs": "a different observer: one who sees only the sum of each round's uploads, "
                                             "not the run's server"})
        if "eps_per_participation" in privacy:
            others.append({"field": "eps_per_participation", "epsilon_max": privacy["eps_per_participation"],
                           "why_it_differs": "one round of one client only, not the whole run"})
        return {"epsilon_max": max(per_client), "source": source, "unit": self.algorithm.unit,
                "observer": self.algorithm.observer, "per_client": per_client, "other_epsilons": others,
                "note": "each client's guarantee is clients[].epsilon_guarantee at its own delta; the other epsilons "
                        "listed are computed for the run too but are not its guarantee"}

    def _fdp_report(self, accounting: Any, history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The f-DP block of privacy.json from who actually took part in each round (spec fdp_accounting.md §6)."""
        assert self.budgets is not None
        part = np.zeros((self.n_clients, len(history)), dtype=bool)
        for t, row in enumerate(history):
            part[row["selected"], t] = True
        cohorts = [max(1, len(row["selected"])) for row in history]
        deltas = [sorted({self.budgets[i].delta, 1.0 / (10 * int(self.n_records[i]))}) for i in range(self.n_clients)]
        return accounting.report(part, cohorts, deltas, len(history))

    def _sample_level_views(self, spent: list[float]) -> dict[str, Any]:
        """Per participation and composed, and the plain statement that no user-level guarantee exists."""
        assert self.budgets is not None
        cache: dict[tuple, float] = {}
        per = []
        for i in range(self.n_clients):
            key = (int(self.n_records[i]), int(self.batch_sizes[i]), float(self.noise[i]), self.budgets[i].delta)
            if key not in cache:  # DP-SGD's event depends on neither round nor cohort, except a scheduled round 1
                events = {id(e): e for e in (self._client_event(i, r, 1) for r in range(min(2, self.rounds)))}
                cache[key] = max(epsilon(e, key[3], self.accountant) if e is not None else 0.0 for e in events.values())
            per.append(cache[key])
        return {"eps_per_participation": max(per), "eps_total_max": max(spent), "eps_total_mean": float(np.mean(spent)),
                "user_level": None,
                "user_level_note": "sample-level DP only: a client's whole dataset is not protected as a unit"}

    def _aggregate_view(self, rounds_run: int, n_retired: int = 0) -> dict[str, Any]:
        """The client-level epsilon for an observer of the aggregates only (not the run's server). When clients
        retired, every round is charged at the smallest population the run reached (the largest sampling rate under
        fixed-K selection): an upper bound, since a client's epsilon grows with its sampling rate."""
        assert self.budgets is not None
        up, sel = self.algorithm.upload, self.algorithm.selection
        population = max(sel.min_candidates(), self.n_clients - n_retired)  # a stop below k: rate 1, still a bound
        event = up.aggregate_event(sel, population, rounds_run)
        delta = min(b.delta for b in self.budgets)
        g = guarantee(event, delta, self.accountant, unit="client")
        out = {"epsilon": g.epsilon, "delta": delta, "relation": g.relation, "noise_multiplier": up.noise_multiplier,
               "sample_rate": sel.participation_rate(population), "rounds": rounds_run,
               "valid_for": "an observer who sees only the sum of each round's uploads and not who took part "
                            "(e.g. behind secure aggregation); NOT the run's server, which sees every upload"}
        if n_retired:
            out["population"] = (f"{n_retired} of {self.n_clients} clients retired on their budgets during the run; "
                                 f"every round is charged at a population of {population} (at least the largest "
                                 "sampling rate the run reached): an upper bound for the rounds before they retired")
        return out


def _per_client(value: Any, n: int, name: str, cast: Any) -> np.ndarray:
    """Broadcast a scalar (or check a sequence) to one entry per client."""
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries for {n} clients")
        return np.array(list(value), dtype=object if cast is None else cast)
    return np.array([value] * n, dtype=object if cast is None else cast)


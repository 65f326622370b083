"""The round loop: select -> broadcast -> local -> upload -> aggregate -> account, evaluate, log.

One loop for every algorithm. Privacy is accounted per client, in a ledger of DP events: before a
round, each client's next-round event is checked against its budget and a client whose budget would
be exceeded is retired (it never trains again); after the round the events that actually happened are
recorded. Noise multipliers are calibrated per client from (epsilon_i, delta_i) with the same
accountant, unless given explicitly.

This module is the public entry (FederatedRun and the records it hands out, re-exported from run_records); the
loop's other ideas live beside it: run_accounting (calibration and the DP events a round costs), round_diagnostics
(weights and noise statistics of a round's aggregation), run_evaluation (the accuracies in a row) and
privacy_report (privacy.json).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from dp_accounting import DpEvent
from torch import nn

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.server.oracle import NoiseChannel
from dpfl.algorithms.server.pfa import NoPublicClients
from dpfl.algorithms.server.stop import StopTraining
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import LocalInputs, RoundAborted, RoundInputs
from dpfl.engine import params as P
from dpfl.engine.allocator import tune_malloc
from dpfl.engine.backends.base import Backend
from dpfl.engine.backends.local import LocalBackend
from dpfl.engine.local_training import DEFAULT_MAX_ELEMENTS, ClientPlan
from dpfl.data.on_nodes import on_nodes
from dpfl.engine.pooled import PooledData
from dpfl.experiment import privacy_report, round_diagnostics, run_checks, run_evaluation
from dpfl.experiment.run_accounting import (RunEvents, calibrate_stage, client_noise, per_client, planned_run,
                                            reported_epsilons)
from dpfl.experiment.run_records import (INITIAL, LocalRound, RemoteRound, RunResult, RunState, StageStates,
                                        EVALUATED_AT_STOP, local_state_problem, mechanism_state_problem, plain_row,
                                        resumed_server_state)
from dpfl.data.federated import PooledClients
from dpfl.privacy.budgets import Budgets, ClientBudget
from dpfl.privacy.ledger import PrivacyLedger
from dpfl.privacy.run_calibration import PARTICIPATIONS, CalibratedNoise, PlannedRun
from dpfl.results.privacy_report import PrivacyReport
from dpfl.seeding import Purpose, numpy_generator

__all__ = ["FLOAT_BYTES", "REDRAWS", "FederatedRun", "LocalRound", "RemoteRound", "RunResult", "RunState",
           "plain_row"]

REDRAWS = 50  # draws of a round's sample before giving up on a public participant (spec §4.2)
MAX_ATTEMPTS = 6  # runs of a round the upload protocol discards (`RoundAborted`) before the run fails
FLOAT_BYTES = 4


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
    device: where the model, the clients' records and every engine tensor live ("cpu", "cuda", "cuda:N"). The
    model is moved there (it is built on the CPU, so the initial weights do not depend on the device); test sets
    stay on the CPU and are evaluated batch by batch there. Checkpointed states are on the CPU whatever the device,
    and a resumed state is moved to this run's device.
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
        device: torch.device | str = "cpu",
    ) -> None:
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        if eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {eval_every}")
        declared = getattr(model, "loss_kind", None)
        if declared is not None and declared != algorithm.local.spec.loss:
            raise ValueError(f"the model is trained with loss {declared!r} but the local program uses "
                             f"{algorithm.local.spec.loss!r}; pass loss={declared!r} to the local program")
        self.device = torch.device(device)
        self.data, self.model, self.algorithm = data, model.to(self.device), algorithm
        self.rounds, self.seed, self.eval_every, self.max_elements = rounds, seed, eval_every, max_elements
        self.accountant = accountant
        self.backend: Backend = backend if backend is not None else LocalBackend()
        self.events = RunEvents(self)  # what a round costs each client (run_accounting)
        # every client's training records in one tensor; a federation's server holds counts only (data.on_nodes)
        self._pooled = None if on_nodes(data) else _pooled_records(data.clients).to(self.device)
        n = len(data.clients)
        self.n_clients = n
        self.n_records = self._pooled.sizes.numpy() if self._pooled is not None else data.train_sizes
        self.val_data = _validation_union(data.clients)  # the union the searches select on
        self.batch_sizes = per_client(batch_sizes, n, "batch_sizes", int)
        if (self.batch_sizes < 1).any():
            raise ValueError("every batch size must be >= 1")
        # one ClientBudget per client, held as arrays (made on access)
        self.budgets: Budgets | None = Budgets.of(budgets, n) if budgets is not None else None
        private = algorithm.unit is not None and algorithm.accounted
        if private and self.budgets is None:
            raise ValueError(f"algorithm {algorithm.name!r} is private ({algorithm.unit}-level): give budgets")
        self.eps_reported = reported_epsilons(self.budgets, n, misreport or {})
        # a server step fitted to population-level facts (PFA's public/private split); most steps are unchanged
        fitted = algorithm.aggregator.fit_split(np.arange(n), self.eps_reported, seed)
        if fitted is not algorithm.aggregator:
            self.algorithm = algorithm = replace(algorithm, aggregator=fitted)
        self.calibrate_to, self.enforce_budgets = calibrate_to, not allow_budget_violation
        if calibration not in ("accountant", "pfa-heuristic"):
            raise ValueError(f"calibration must be 'accountant' or 'pfa-heuristic', got {calibration!r}")
        if participation not in PARTICIPATIONS:
            raise ValueError(f"participation must be one of {', '.join(PARTICIPATIONS)}, got {participation!r}")
        self.calibration, self.participation = calibration, participation
        self.heuristic_steps: np.ndarray | None = None  # T*_i under the heuristic
        self.steps_done = np.zeros(self.n_clients, dtype=np.int64)
        self._retired_mask: np.ndarray | None = None  # `_active`: the retired clients as a mask, and their set
        self._retired_of: set[int] | None = None
        self.ledger: PrivacyLedger | None = None
        if private and self.budgets is not None:
            self.ledger = PrivacyLedger(
                range(n),
                deltas=self.budgets.deltas,
                budgets=self.budgets.epsilons,
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
        self.noise, self.calibrated, self.heuristic_steps = client_noise(self, noise_multipliers)
        staged = calibrate_stage(self)  # the stage whose noise is unset (central server, uploads, parameter noise)
        if staged is not None:
            self.algorithm, self.calibrated = staged
        run_checks.refuse_a_run_that_trains_nothing(self)
        # sample-level adaptive clipping: the count's noise must leave every client's update some budget
        refusal = algorithm.local.adaptive_budget_problem(self.noise, self.n_records, self.batch_sizes)
        if refusal is not None:
            raise ValueError(refusal)
        run_checks.note_what_the_noise_means(self)

    @property
    def pooled(self) -> PooledData:
        """Every client's training records in one tensor (what the backend trains the cohort on)."""
        if self._pooled is None:
            raise RuntimeError("this run's training records are on the clients' nodes: its clients train on their "
                               "own machines (remote_clients), never here")
        return self._pooled

    # ---- calibration (run_accounting) ------------------------------------------------------------
    def planned_run(self, mechanism: str) -> PlannedRun:
        """The run as planned, for the calibration of `mechanism`'s noise (dpfl.privacy.run_calibration)."""
        return planned_run(self, mechanism)

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
        on_evaluated: Callable[[dict[str, Any]], None] | None = None,
    ) -> RunResult:
        """Run the remaining rounds from `state` (a fresh start by default).

        All randomness is keyed by (seed, round, client), so resuming from a checkpointed state gives
        exactly the rounds an uninterrupted run would have produced. `on_checkpoint` receives the state
        every `checkpoint_every` rounds and once at the end. A run that stops early (a budget, a stop rule) after a
        round it did not evaluate evaluates the model it ends with into that round's row, marked
        `evaluated_at_stop`, and passes the row to `on_evaluated` (before the last checkpoint).
        """
        tune_malloc()
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
        state = state if state is not None else self.initial_state()
        if self.device.type != "cpu":  # a checkpoint's tensors are on the CPU
            state = _state_on(state, self.device)
        if state.ledger is not None:
            if self.ledger is None:
                raise ValueError("the checkpoint has a privacy ledger but this run is not accounted")
            self.ledger = PrivacyLedger.from_dict(state.ledger)
        elif self.ledger is not None and state.round > 0:  # resuming would forget what the clients spent
            raise ValueError(f"the state after round {state.round} has no privacy ledger but this run is accounted")
        states = self._stage_states(state)
        if self.algorithm.personal is not None:
            self.algorithm.personal.load_state_dict(state.client_state)
        w, retired, history = state.params, set(state.retired), [plain_row(row) for row in state.history]
        self.steps_done = np.array(state.steps_done, dtype=np.int64)
        stop_reason = state.stop_reason
        r = state.round
        del state  # its per-client list (steps_done) is in self.steps_done now
        try:
            w, r, history, stop_reason, states = self._rounds(w, r, retired, history, stop_reason, states, on_round,
                                                              on_checkpoint, checkpoint_every)
        finally:
            self.backend.close()  # workers of a remote backend end with the run (or its failure)
        stop_reason = stop_reason or "rounds"
        if history and "test_accuracy" not in history[-1]:  # stopped early between evaluations: evaluate the model
            history[-1] = self._evaluated_at_stop(history[-1], w, states.server)  # the run ends with
            if on_evaluated is not None:
                on_evaluated(history[-1])
        if on_checkpoint is not None:
            on_checkpoint(self._state(r, w, retired, history, stop_reason, states))
        return RunResult(w, history, self.ledger, self.noise, stop_reason, PrivacyReport.from_dict(
            self.privacy_summary(stop_reason, r, history, retired=retired, server_state=states.server)), states)

    def _stage_states(self, state: RunState) -> StageStates:
        """The server step's, the upload mechanism's and the local program's states at `state`: their `init` for a
        fresh run, the checkpointed ones for a resumed run."""
        alg = self.algorithm
        if state.round == 0:
            return StageStates(alg.aggregator.init(state.params), alg.upload.init(), self._local_init())
        problem = (mechanism_state_problem(alg.upload, state.mechanism_state)
                   or local_state_problem(alg.local, self.n_clients, state.local_state))
        if problem is not None:
            raise ValueError(f"the state after round {state.round} {problem}; it cannot resume this run")
        return StageStates(resumed_server_state(alg.aggregator.init(state.params), state.aggregator_state),
                           state.mechanism_state, state.local_state)

    def _local_init(self) -> Any:
        """The local program's state before round 1 (None: stateless), on the run's device."""
        return P.move(self.algorithm.local.init(self.n_clients), self.device)

    def _rounds(self, w: P.Params, r: int, retired: set[int], history: list[dict[str, Any]], stop_reason: str | None,
                states: StageStates, on_round: Callable[[dict[str, Any]], None] | None,
                on_checkpoint: Callable[[RunState], None] | None,
                checkpoint_every: int) -> tuple[P.Params, int, list[dict[str, Any]], str | None, StageStates]:
        """Rounds r+1 .. until the last, a budget or a stop; a checkpoint every `checkpoint_every` rounds."""
        while stop_reason is None and r < self.rounds:
            try:
                step = self._one_round(r, w, retired, states)
            except StopTraining as stop:
                stop_reason = stop.stop_reason
                break
            if step is None:
                stop_reason = "budget"
                break
            w, row, states = step
            row = plain_row(row)
            history.append(row)
            r += 1
            if on_round is not None:
                on_round(row)
            if row.get("diverged"):  # NaN or inf in the model or its loss: nothing after this round can recover
                stop_reason = "diverged"
                break
            if on_checkpoint is not None and r % checkpoint_every == 0 and r < self.rounds:
                on_checkpoint(self._state(r, w, retired, history, None, states))
        return w, r, history, stop_reason, states

    def _state(self, r: int, w: P.Params, retired: set[int], history: list[dict[str, Any]],
               stop: str | None, states: StageStates) -> RunState:
        ledger = self.ledger.to_dict() if self.ledger is not None else None
        personal = self.algorithm.personal
        client_state = copy.deepcopy(personal.state_dict()) if personal is not None else None
        state = RunState(r, {n: t.clone() for n, t in w.items()}, sorted(retired), ledger, list(history), stop,
                         self.steps_done.tolist(), copy.deepcopy(states.server), client_state,
                         copy.deepcopy(states.mechanism), copy.deepcopy(states.local))
        return state if self.device.type == "cpu" else _state_on(state, torch.device("cpu"))

    def _one_round(self, r: int, w: P.Params, retired: set[int],
                   states: StageStates) -> tuple[P.Params, dict[str, Any], StageStates] | None:
        """Round r (0-based): new global parameters, its metrics row and the stages' new states, or None if budgets
        end the run."""
        alg = self.algorithm
        server = alg.aggregator
        t0, cpu0 = time.perf_counter(), time.process_time()
        dim = P.num_parameters(w)
        active = self._active(retired)
        server_event = self.events.server(len(active))
        eligible = self._eligible(active, server_event, r)
        if len(eligible) != len(active):
            self._retire(retired, np.setdiff1d(active, eligible, assume_unique=True))
        if len(eligible) < alg.selection.min_candidates():
            return None
        if server_event is not None and len(eligible) != len(active):
            server_event = self.events.server(len(eligible))
        selected = self._select(eligible, r)
        expected = alg.selection.expected_count(len(eligible))
        for i in selected:
            self.steps_done[i] += self.events.steps(i, r)
        asks = server.asks_clients  # clients answer a question after aggregation: the round closes after it
        self._record(r, selected, eligible, server_event, close=not asks)  # before aggregation: spent even if it stops
        server_state, mechanism_state, local_state = states
        new_w, bytes_up, bytes_down, diagnostics = w, [], [], {}
        if len(selected):
            ids = [int(i) for i in selected]
            starts, server_state = server.start_points(server_state, w, ids, r)  # personalised starts (FedCEO)
            if alg.personal is not None:  # w + the clients' own local parts (PPSGD)
                starts = alg.personal.start_points(w, ids, r)
            local, server_state, discarded = self._attempts(r, w, selected, expected, starts,
                                                            StageStates(server_state, mechanism_state, local_state))
            uploads, view, channel = local.uploads, local.view, local.channel
            mechanism_state, local_state = local.mechanism_state, local.local_state
            shared = dim if alg.personal is None else P.num_parameters(uploads, leading=1)  # PPSGD: the shared part
            bytes_up = [alg.upload.bytes_per_upload(shared)] * len(selected)
            bytes_down = [sum(t.numel() * t.element_size() for t in w.values())] * len(selected)  # the global model
            payload = server.client_payload(server_state, uploads, view, self.seed)
            if payload is not None:  # clients send what the broadcast asks for (PFA+: k-dim codes)
                uploads = payload
                bytes_up = list(payload.bytes_up)
                bytes_down = [d + extra for d, extra in zip(bytes_down, payload.bytes_down_subspace, strict=True)]
                traffic = payload.traffic(FLOAT_BYTES * dim)
            inputs = RoundInputs(view, self.seed, r, starts=starts if alg.personal is None else None,
                                 channel=channel if server.privileged else None)  # only oracles read the channel
            if alg.personal is not None:  # the server sees and updates the shared tensors only
                step = server.update(server_state, {n: w[n] for n in uploads}, uploads, inputs)
                new_w = alg.personal.global_model({**w, **step.params})
            else:
                step = server.update(server_state, w, uploads, inputs)
                new_w = step.params
            server_state = step.state
            diagnostics = round_diagnostics.aggregation_diagnostics(alg, server, server_state, local, self.seed)
            diagnostics.update(self.noise_passthrough(local, r))
            diagnostics.update(step.metrics)
            diagnostics.update(local.mechanism_metrics)
            diagnostics.update({"bytes_up": bytes_up, "bytes_down": bytes_down})
            if payload is not None:
                diagnostics["traffic"] = traffic
            if discarded:  # attempts the upload protocol discarded, and who had uploaded in each
                diagnostics["discarded_attempts"] = discarded
        elif alg.central:  # nobody drawn: the server still releases a noised (empty) sum
            empty = {n: t.unsqueeze(0)[:0] for n, t in w.items()}
            step = server.update(server_state, w, empty, RoundInputs(self._view(selected, expected), self.seed, r))
            new_w, server_state = step.params, step.state
        if asks:
            choice = server.model_choice(server_state, r, new_w)
            if choice is not None:
                server_state, answered = server.chosen(server_state, r, self._private_choices(choice, r))
                diagnostics.update(answered)
            if self.ledger is not None:
                self.ledger.close_round(r)
        row = self._row(r, new_w, server_state, selected, sum(bytes_up), sum(bytes_down), time.perf_counter() - t0,
                        time.process_time() - cpu0, diagnostics)
        return new_w, {**row, **diagnostics}, StageStates(server_state, mechanism_state, local_state)

    def _attempts(self, r: int, w: P.Params, selected: np.ndarray, expected: float, starts: P.Params | None,
                  states: StageStates) -> tuple[LocalRound, Any, list[list[int]]]:
        """Round r's broadcast, local programs and uploads: again, with a fresh broadcast, while the upload protocol
        discards the round (`RoundAborted`), at most MAX_ATTEMPTS times. Returns the round, the server step's state
        after its broadcast, and the clients that had uploaded in each discarded attempt."""
        ids = [int(i) for i in selected]
        discarded: list[list[int]] = []
        for attempt in range(MAX_ATTEMPTS):
            broadcast, server_state = self.algorithm.aggregator.broadcast(states.server, w, ids, self.seed, r, attempt)
            try:
                local = self.local_round(r, w, selected, expected, starts=starts, mechanism_state=states.mechanism,
                                         broadcast=broadcast, local_state=states.local)
                return local, server_state, discarded
            except RoundAborted as aborted:
                discarded.append(list(aborted.uploaded))
                if attempt == MAX_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

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
            picks[i] = answer(choice, self.model, c.x_train.to(self.device), c.y_train.to(self.device),
                              self.algorithm.local.spec.loss,
                              numpy_generator(self.seed, Purpose.CHOICE, r, i))
            if self.ledger is not None:
                self.ledger.record(i, r, event)
        self.model.train()
        return picks

    # ---- selection and the ledger ----------------------------------------------------------------
    def _active(self, retired: set[int]) -> np.ndarray:
        """The clients not in `retired`, in order, from a mask kept beside the set (`_retire`): numpy's work per
        client each round, Python's only per client that retires."""
        mask = self._retired_mask
        if mask is None or self._retired_of is not retired or int(mask.sum()) != len(retired):
            mask = np.zeros(self.n_clients, dtype=bool)
            if retired:
                mask[np.fromiter(retired, dtype=np.int64, count=len(retired))] = True
            self._retired_mask, self._retired_of = mask, retired
        return np.flatnonzero(~mask)

    def _retire(self, retired: set[int], clients: np.ndarray) -> None:
        """Add `clients` to `retired` and to its mask."""
        if len(clients):
            self._active(retired)  # the mask of `retired` as it is (made once, then kept)
            retired.update(clients.tolist())
            self._retired_mask[clients] = True

    def _select(self, eligible: np.ndarray, r: int) -> np.ndarray:
        """The round's participants; re-drawn (up to REDRAWS times) while the aggregator rejects the sample.

        PFA needs a public participant (spec §4.2). The re-draw depends only on reported epsilons, never
        on data, so it does not change any sample-level guarantee.
        """
        selection, accepts = self.algorithm.selection, self.algorithm.aggregator.accepts_selection
        selected = selection.select(eligible, self.seed, r)
        if not accepts(eligible):
            raise NoPublicClients("no eligible public client remains (stop_reason 'no_public')")
        for attempt in range(1, REDRAWS):
            if accepts(selected):
                return selected
            selected = selection.select(eligible, self.seed, r, attempt)
        if not accepts(selected):
            raise NoPublicClients(f"no public client in {REDRAWS} draws of round {r + 1} (stop_reason 'no_public')")
        return selected

    def first_round_eligible(self, active: np.ndarray) -> np.ndarray:
        """The clients of `active` whose first round fits their budgets (the check of round 1, nothing recorded)."""
        return self._eligible(active, self.events.server(len(active)), 0)

    def _eligible(self, active: np.ndarray, server_event: DpEvent | None, r: int) -> np.ndarray:
        """Clients whose round r (if they take part) keeps them within budget.

        Where the event depends on the number of uploads averaged (Noisy-FedAvg's aggregate view, everyone taking
        part), a retirement makes the cohort smaller and the others' events stronger: re-check until no one else
        retires, so every recorded event was checked against the budget.
        """
        if self.ledger is None or not self.enforce_budgets:
            return active
        candidates = np.asarray(active, dtype=np.int64)
        if self.heuristic_steps is not None:  # PFA semantics: a client may spend its T* steps
            steps = self.events.steps_of(candidates, r)
            return candidates[self.steps_done[candidates] + steps <= self.heuristic_steps[candidates]]
        while True:
            cohort = self._cohort_size(len(candidates))
            if server_event is not None:
                index, events = np.zeros(len(candidates), dtype=np.int64), [server_event]
            else:
                index, events = self.events.client_groups(candidates, r, cohort)
            keep = candidates[~self.ledger.exceeding_mask(candidates, index, events)]
            if len(keep) == len(candidates) or self._cohort_size(len(keep)) == cohort:
                return keep
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
            self.ledger.record_many(np.asarray(eligible, dtype=np.int64), r, server_event)
        for i in selected:
            event = self.events.client(int(i), r, len(selected))
            if event is not None:
                self.ledger.record(int(i), r, event)
        if close:
            self.ledger.close_round(r)

    # ---- local training and what the server sees of it -------------------------------------------
    def first_round(self) -> tuple[P.Params, LocalRound]:
        """The initial model and round 1's local training from it of the clients round 1 selects, as the run's own
        round 1 would train them; nothing is recorded. For diagnostics of round 1 at the run's full calibration
        (the round-1 noise table, R-DPCFL's b^1 analysis)."""
        w = P.model_params(self.model)
        selected = self.algorithm.selection.select(list(range(self.n_clients)), self.seed, 0)
        return w, self.local_round(0, w, selected, self.algorithm.selection.expected_count(self.n_clients))

    def local_round(self, r: int, w: P.Params, selected: np.ndarray, expected: float,
                    starts: P.Params | None = None, mechanism_state: Any = INITIAL,
                    broadcast: Any = None, local_state: Any = INITIAL) -> LocalRound:
        """Round r's local training of `selected` from `w`: their uploads, the server's view, the noise facts.

        `starts` (stacked `[K, ...]`) gives each client its own start model instead of `w`; updates are
        then relative to it. `broadcast`: an encoded model the server step sent instead (MP-DP's). Public so that
        diagnostics (e.g. the round-1 noise statistic of several aggregators on the same uploads) can reuse exactly
        the engine's round; it records nothing in the ledger.
        `mechanism_state`: the upload mechanism's state before the round (its `init()` by default); `local_state`:
        the local program's (its `init(population)` by default).
        """
        alg = self.algorithm
        if mechanism_state is INITIAL:
            mechanism_state = alg.upload.init()
        if local_state is INITIAL:
            local_state = self._local_init()
        ids = [int(i) for i in selected]
        if self.remote_clients is not None:  # the clients train on their own machines (a Flower federation)
            if (starts is not None or alg.personal is not None or self.update_hook is not None
                    or mechanism_state is not None or broadcast is not None or local_state is not None):
                raise ValueError(f"algorithm {alg.name!r}: remote clients run stateless local programs and upload "
                                 "mechanisms from the global model only (no personal starts, client state, mechanism "
                                 "or local-program state, encoded broadcast or audit hook)")
            remote = self.remote_clients.round(self, r, w, ids)
            planned = [self.events.steps(i, r) for i in ids]
            over = [(i, int(s), p) for i, s, p in zip(ids, remote.steps, planned, strict=True) if int(s) > p]
            if over:  # the ledger charged the planned steps: more would spend more than it recorded
                raise ValueError(f"round {r + 1}: clients took more local steps than the ledger charged "
                                 f"((client, reported, planned): {over[:5]}); the accounting would not cover the run")
            uploads = P.to_device(remote.uploads, self.device)  # arrays from the nodes arrive on the CPU
            return LocalRound(uploads, self._view(selected, expected), self._channel(selected, remote.steps),
                              remote.noise_sq_norm, P.num_parameters(w), mechanism_state)
        out = alg.local.run(LocalInputs(
            ids, starts if starts is not None else w, starts is not None, self.seed, r, w, self.pooled,
            model=self.model, backend=self.backend, plans_for=lambda phase: self._plans(phase, selected, r),
            max_elements=self.max_elements, broadcast=broadcast, state=local_state))
        deltas = out.updates
        if alg.personal is not None:  # keep the local part on the client; the rest is the shared update
            deltas = alg.personal.shared_update(deltas, ids)
        if self.update_hook is not None:
            deltas = self.update_hook(ids, deltas, r)
        released = alg.upload.release(mechanism_state, deltas, ids, self.seed, r)
        return LocalRound(released.uploads, self._view(selected, expected), self._channel(selected, out.steps),
                          out.noise_sq_norm, P.num_parameters(w), released.state, {**out.metrics, **released.metrics},
                          out.state)

    def _plans(self, program: Any, selected: Sequence[int], r: int) -> list[ClientPlan]:
        """What each selected client runs in round r under `program` (one phase of the local program)."""
        return [program.plan(int(i), int(self.n_records[i]), int(self.batch_sizes[i]), float(self.noise[i]), r)
                for i in selected]

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

    # ---- the metrics row -------------------------------------------------------------------------
    def _row(self, r: int, w: P.Params, server_state: Any, selected: np.ndarray, up: int, down: int, seconds: float,
             cpu_seconds: float, diagnostics: Mapping[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {"round": r + 1, "selected": [int(i) for i in selected], "uplink_bytes": up,
                               "downlink_bytes": down,
                               # where DP noise accumulates: a random walk in the weights grows this norm (docs)
                               "param_norm": float(P.global_norms(w, leading=0))}
        loss = self.algorithm.local.spec.loss
        finite = all(bool(torch.isfinite(t).all()) for t in w.values())
        if not finite or (r + 1) % self.eval_every == 0 or r + 1 == self.rounds:
            row.update(self._evaluation(w, server_state))
        elif "smoothing" in diagnostics:  # FedCEO's personal models changed: their accuracy, every smoothing
            personal = self.personal_models(w, server_state)
            row.update(run_evaluation.personal_accuracy(self.model, self.data, personal, loss))
        test_loss = row.get("test_loss")
        if not finite or (test_loss is not None and not math.isfinite(test_loss)):
            row["diverged"] = True  # the loop stops after this row (stop_reason "diverged")
        if self.ledger is not None:
            row.update(run_evaluation.epsilon_columns(self.ledger))  # one value per history class
        row["seconds"] = seconds
        if isinstance(self.backend, LocalBackend):
            # This process's CPU time (all threads): unlike wall time, not inflated by other processes sharing the
            # machine or by a pause. Absent with a remote backend, whose actors' CPU time is not in it.
            row["cpu_seconds"] = cpu_seconds
        return row

    def _evaluation(self, w: P.Params, server_state: Any) -> dict[str, Any]:
        """The global model `w` on the test, validation and clients' held-out sets, and the clients' personal
        models (from `server_state` or the client stage) on their own test splits."""
        loss = self.algorithm.local.spec.loss
        found = run_evaluation.global_model_metrics(self.model, self.data, self.val_data, w, loss)
        found.update(run_evaluation.personal_accuracy(self.model, self.data, self.personal_models(w, server_state),
                                                      loss))
        return found

    def _evaluated_at_stop(self, row: dict[str, Any], w: P.Params, server_state: Any) -> dict[str, Any]:
        """`row` (the last round's, not evaluated) with the evaluation of the model the run ends with, and the list of
        the keys that evaluation added (`evaluated_at_stop`: a resumed run's checks compare the rows without them)."""
        added = {k: v for k, v in self._evaluation(w, server_state).items() if k not in row}
        return plain_row({**row, **added, EVALUATED_AT_STOP: sorted(added)})

    # ---- diagnostics of one round (round_diagnostics) --------------------------------------------
    def noise_passthrough(self, local: LocalRound, r: int) -> dict[str, float]:
        """PFA's `pfa_noise_passthrough` of round r's `local` training (round_diagnostics.noise_passthrough); empty
        where the engine cannot replay the clients' noise. Public for diagnostics of one round (`first_round`), like
        `noise_statistics`."""
        return round_diagnostics.noise_passthrough(self, local, r)

    def noise_statistics(self, weights: torch.Tensor, local: LocalRound) -> dict[str, float]:
        """noise_stat = sum_i w_i^2 sigma_i^2 / (p eta^2) of a weighted sum of the round's updates, analytic and
        empirical (round_diagnostics.noise_statistics). Diagnostics only: never shown to a non-privileged
        aggregator. Empty unless the clients run DP-SGD without momentum."""
        return round_diagnostics.noise_statistics(self.algorithm, weights, local)

    # ---- evaluation (run_evaluation) and the privacy report (privacy_report) ---------------------
    def personal_models(self, w: P.Params, server_state: Any = None) -> dict[int, P.Params]:
        """client -> the personal model it uses (its cluster's, PPSGD's w + u_k, FedCEO's, ...) given the global
        model `w` and the server step's state (a run's `RunResult.states.server`, or a checkpoint's
        `aggregator_state`), for the clients that hold one now; {} for methods without personal models."""
        return run_evaluation.personal_models(self.algorithm, w, server_state)

    def privacy_summary(self, stop_reason: str, rounds_run: int | None = None,
                        history: Sequence[Mapping[str, Any]] = (), retired: Collection[int] = (),
                        server_state: Any = None) -> dict[str, Any]:
        """The declared threat model and each client's budget, noise and spent epsilon (`history`: the rounds run,
        whose participants the f-DP report of Noisy-FedAvg/FedProx needs; `retired`: the clients that left the run
        on their budgets, which raised the others' sampling rate under fixed-K selection; `server_state`: the server
        step's state after the last round, whose own releases it reports). privacy.json's content:
        privacy_report.privacy_summary."""
        return privacy_report.privacy_summary(self, stop_reason, rounds_run, history, retired, server_state)


def _pooled_records(clients: Any) -> PooledData:
    """Every client's training records in one tensor: a PooledClients' own train split (no copy, no Python per
    client), else the clients' tensors concatenated."""
    if isinstance(clients, PooledClients):
        x, y, offsets = clients.split("train")
        sizes = np.diff(offsets)
        if len(sizes) and (sizes >= 1).all():
            return PooledData(x, y, torch.from_numpy(offsets[:-1].copy()), torch.from_numpy(sizes))
    return PooledData.from_clients([c.x_train for c in clients], [c.y_train for c in clients])  # (or says who is empty)


def _validation_union(clients: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The union of the clients' validation splits in client order, or None when no client has one."""
    if isinstance(clients, PooledClients):
        x, y, _ = clients.split("val")
        return (x, y) if len(x) else None
    with_val = [c for c in clients if getattr(c, "n_val", 0)]
    return (torch.cat([c.x_val for c in with_val]), torch.cat([c.y_val for c in with_val])) if with_val else None


def _state_on(state: RunState, device: torch.device) -> RunState:
    """`state` with every tensor (parameters, server step, client and upload mechanism states) on `device`: to the
    CPU for a checkpoint, to the run's device on resume. Ledgers and rows hold no tensors."""
    return replace(state, params=P.to_device(state.params, device),
                   aggregator_state=P.move(state.aggregator_state, device),
                   client_state=P.move(state.client_state, device),
                   mechanism_state=P.move(state.mechanism_state, device),
                   local_state=P.move(state.local_state, device))

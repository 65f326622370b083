"""The records a federated run hands around: its checkpointable state, one round's uploads, its result.

Kept apart from the loop (`dpfl.experiment.federated_run`, which re-exports every name here) so that the pieces
of a run that consume these records (diagnostics, evaluation, the privacy report, a Flower federation's remote
clients, the run directory's checkpoints) depend on plain data, not on the class that runs the rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from dpfl.algorithms.server.oracle import NoiseChannel
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import UploadMechanism
from dpfl.engine import params as P
from dpfl.privacy.ledger import PrivacyLedger
from dpfl.results.privacy_report import PrivacyReport


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


EVALUATED_AT_STOP = "evaluated_at_stop"  # a row's key: what the evaluation of the model a run stopped with added


def without_evaluation_at_stop(row: dict[str, Any]) -> dict[str, Any]:
    """`row` as the round recorded it, before a stop evaluated the model into it (`FederatedRun.run`)."""
    added = set(row.get(EVALUATED_AT_STOP) or ())
    return {k: v for k, v in row.items() if k not in added and k != EVALUATED_AT_STOP}


INITIAL = object()  # "the stage's `init()` state", where None is a valid state


class StageStates(NamedTuple):
    """The explicit states the round loop holds between rounds (dpfl.algorithms.stages): the server step's, the
    upload mechanism's and the local program's (client-side: adaptive clipping's per-client clips)."""

    server: Any
    mechanism: Any
    local: Any = None


def mechanism_state_problem(mechanism: UploadMechanism, state: Any) -> str | None:
    """Why `state` cannot be the checkpointed state of `mechanism` (a stateful mechanism needs its state, a
    stateless one has none), or None: the one check of a resumed run's and of a run directory's checkpoint."""
    stateful = mechanism.init() is not None
    if state is None and stateful:
        return f"holds no state for the upload mechanism ({mechanism.describe()})"
    if state is not None and not stateful:
        return "holds upload-mechanism state, and this algorithm's mechanism keeps none"
    return None


def local_state_problem(program: Any, population: int, state: Any) -> str | None:
    """Why `state` cannot be the checkpointed state of the local `program` for `population` clients (a stateful
    program needs its state, with the shapes of its `init`; a stateless one has none), or None."""
    initial = program.init(population)
    if state is None and initial is not None:
        return "holds no state for the local program (its clients' adaptive clips)"
    if state is not None and initial is None:
        return "holds local-program state, and this algorithm's local program keeps none"
    if isinstance(initial, dict):
        if not isinstance(state, dict) or set(state) != set(initial):
            return f"holds local-program state with keys other than {sorted(initial)}"
        for key, t in initial.items():
            got = state[key]
            if isinstance(t, torch.Tensor) and (not isinstance(got, torch.Tensor) or got.shape != t.shape
                                                or got.dtype != t.dtype):
                return f"holds local-program state {key!r} that is not {t.dtype} {tuple(t.shape)}"
    return None


def resumed_server_state(initial: Any, checkpointed: Any) -> Any:
    """The server step's state to resume from: the checkpointed one, with any key the step's `init` has and the
    checkpoint lacks (a checkpoint written before the step kept it) at its initial value."""
    if isinstance(initial, dict) and isinstance(checkpointed, dict):
        return {**initial, **checkpointed}
    return checkpointed


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
    mechanism_state: Any = None  # the upload mechanism's state (None: stateless)
    local_state: Any = None  # the local program's state (adaptive clipping's per-client clips; None: stateless)

    def to_dict(self) -> dict[str, Any]:
        return {"round": self.round, "params": self.params, "retired": self.retired, "ledger": self.ledger,
                "history": self.history, "stop_reason": self.stop_reason, "steps_done": self.steps_done,
                "aggregator_state": self.aggregator_state, "client_state": self.client_state,
                "mechanism_state": self.mechanism_state, "local_state": self.local_state}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunState:
        return cls(d["round"], d["params"], list(d["retired"]), d["ledger"], list(d["history"]), d["stop_reason"],
                   list(d["steps_done"]), d.get("aggregator_state"), d.get("client_state"), d.get("mechanism_state"),
                   d.get("local_state"))


@dataclass
class LocalRound:
    """One round's local training as the server receives it, plus the engine-only noise facts."""

    uploads: P.Params  # [K, ...] in view order
    view: ServerView
    channel: NoiseChannel
    noise_sq_norm: list[float] | None  # per client: ||sum_t xi_t||^2 of the Gaussian noise it drew (None: unknown)
    dim: int  # model parameters p
    mechanism_state: Any = None  # the upload mechanism's state after the round
    mechanism_metrics: dict[str, Any] = field(default_factory=dict)  # what the mechanism reported of the round
    local_state: Any = None  # the local program's state after the round


@dataclass
class RemoteRound:
    """What remote clients return for a round: their uploads (in the order asked) and their local facts."""

    uploads: P.Params  # [K, ...]
    steps: list[int]
    noise_sq_norm: list[float] | None  # None: the clients keep their noise to themselves (secret seeds)


@dataclass
class RunResult:
    """What a run produced: the final global model, one metrics row per round, the ledger, and the stages' states
    after the last round (MP-DP's server step holds the last model its clients received)."""

    params: P.Params
    history: list[dict[str, Any]]
    ledger: PrivacyLedger | None
    noise_multipliers: np.ndarray
    stop_reason: str
    privacy: PrivacyReport = field(default_factory=PrivacyReport)  # privacy.json's content, typed
    states: StageStates | None = None

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

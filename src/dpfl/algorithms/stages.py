"""The round's stage contracts: what each stage of select -> broadcast -> local -> upload -> server step may see
and return, and where its state lives.

Two stages carry explicit state, optax-style (docs/concepts/round.md):

- an upload mechanism (`UploadMechanism`): `init() -> state`, then each round `release(state, deltas, ...)` returns
  the uploads, the new state and the round's metrics. Mechanisms compose in an ordered `MechanismChain` (clip, noise,
  secure sum, ...), from which the run's privacy unit, description and DP events are derived. A mechanism's DP events
  never depend on its state: the ledger checks a round's events against each budget before the round runs;
- the server step (`ServerStep`): `init(params) -> state`, then each round `update(state, params, uploads, inputs)`
  returns a `ServerUpdate` (the new global parameters, the new state, the round's metrics).

The run loop (dpfl.experiment.federated_run) holds both states, checkpoints them after every round and passes them
back in; a resumed run passes the checkpointed states. A server step is configuration only: what it learns lives in
its state (plain dicts of tensors and numbers, as `torch.load(weights_only=True)` reads back), its views
(`personal_models`, `privacy_notes`, `aggregation_weights`, `client_payload`) read a state passed in, and `update`
never changes the state it is given. Diagnostics are returned metrics, never attributes read after the fact.
Optional abilities of a server step (a required public participant, personalised start points, an encoded upload, a
question to the clients after aggregation) are methods of `ServerStep` with neutral defaults, so the loop calls them
unconditionally and never probes for features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from dp_accounting import ComposedDpEvent, DpEvent

from dpfl.engine import params as P

if TYPE_CHECKING:
    import torch

    from dpfl.algorithms.selection import Selection
    from dpfl.algorithms.server.oracle import NoiseChannel
    from dpfl.algorithms.server.view import ServerView
    from dpfl.privacy.adaptive_clipping import AdaptiveClipping

__all__ = ["AggregateFunction", "ClientState", "LocalInputs", "LocalOutput",
           "MechanismChain", "MechanismRelease", "RoundAborted", "RoundInputs", "ServerStep", "ServerUpdate",
           "UploadMechanism", "as_server_step"]


# ---- the local program ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LocalInputs:
    """What the selected clients' local program runs on in one round.

    `start`: the model the clients start from (the global one, or each client's own `[K, ...]` when `stacked`);
    `broadcast`: what the server step's `broadcast` sent instead of the model in the clear (MP-DP's perturbed model),
    else None. `model`, `backend`, `data` (the clients' records, `PooledData`), `plans_for` (phase -> the clients'
    `ClientPlan`s) and `max_elements` are the engine's, for programs it trains; `global_model` is the server's model
    (the anchor of a proximal term). `state`: the local program's client-side state before the round (its
    `init(population)`, then what the previous round returned; None: stateless).
    """

    clients: Sequence[int]
    start: P.Params
    stacked: bool
    seed: int
    round_: int
    global_model: P.Params
    data: Any
    model: Any = None
    backend: Any = None
    plans_for: Any = None
    max_elements: int = 0
    broadcast: Any = None
    state: Any = None


class LocalOutput(NamedTuple):
    """The clients' updates (what the upload mechanism receives: `[K, ...]` model deltas for training programs),
    the local steps each took, the squared norm of each one's DP-SGD noise (diagnostics), the round's metrics and
    the local program's state after the round (None: stateless; the run loop keeps and checkpoints it)."""

    updates: Any
    steps: list[int]
    noise_sq_norm: list[float]
    metrics: dict[str, Any]
    state: Any = None


class RoundAborted(RuntimeError):
    """The upload protocol discarded the round (clients left after agreeing on keys, and their peers' noise cannot
    be removed): the loop runs the round again with a fresh broadcast, as its next attempt. `uploaded`: the clients
    whose uploads the discarded attempt received (their cost is charged all the same)."""

    def __init__(self, message: str, uploaded: Sequence[int]) -> None:
        super().__init__(message)
        self.uploaded = tuple(int(k) for k in uploaded)


# ---- upload mechanisms ----------------------------------------------------------------------------------------
class MechanismRelease(NamedTuple):
    """One round of an upload mechanism: what the server receives, the mechanism's new state, its metrics."""

    uploads: P.Params
    state: Any
    metrics: dict[str, Any]


class UploadMechanism:
    """What leaves a client after local training: maps the cohort's stacked updates `[K, ...]` to its uploads.

    `unit` is what the mechanism's DP guarantee protects ('sample', 'client') or None for a stage that is no
    mechanism; `accounted` is False when it runs without an accountant (the run then reports no epsilon).
    Stateless mechanisms implement `apply`; stateful ones override `init` and `release`.
    """

    unit: str | None = None
    accounted: bool = True
    hidden_sampling: bool = False  # charges every client every round (`round_event`) instead of participations
    secure_sum: bool = False  # the server sees only secure-aggregation sums of the uploads
    # True when `event` depends on the round and the cohort only, not on the client: the run then answers a round's
    # budget check once per group of alike clients instead of once per client (see `events_for_every_client`)
    same_event_for_every_client: bool = False
    calibration_family: str | None = None  # the run_calibration family of a noise that `with_noise` can set
    # what the report says of a mechanism that is not `accounted`
    unaccounted_label: str = " (NOT accounted: no epsilon is computed for it)"

    # -- explicit state ---------------------------------------------------------------------------------------
    def init(self) -> Any:
        """The mechanism's state before round 1 (None: stateless)."""
        return None

    def release(self, state: Any, deltas: P.Params, clients: Sequence[int], seed: int,
                round_: int) -> MechanismRelease:
        """Round `round_`'s uploads of `clients` from their `deltas`, given the mechanism's `state`."""
        return MechanismRelease(self.apply(deltas, clients, seed, round_), state, {})

    def apply(self, deltas: P.Params, clients: Sequence[int], seed: int, round_: int) -> P.Params:
        """The uploads of a stateless mechanism."""
        raise NotImplementedError(f"{type(self).__name__} implements neither apply nor release")

    # -- what the accountant and the report derive from it ------------------------------------------------------
    def event(self, client: int, round_: int, cohort: int) -> DpEvent | None:
        """The DP event of one participation in round `round_` when `cohort` uploads are averaged (None: none)."""
        return None

    def events_for_every_client(self) -> bool:
        """Whether `event` is the same for every client of a round: declared, or `event` not overridden (None)."""
        return self.same_event_for_every_client or type(self).event is UploadMechanism.event

    def round_event(self, selection: Selection, population: int) -> DpEvent | None:
        """With `hidden_sampling`: one round's cost to every client of the population."""
        return None

    def aggregate_event(self, selection: Selection, population: int, rounds: int) -> DpEvent | None:
        """The cost of `rounds` releases against an observer who sees only the aggregate (None: not reported)."""
        return None

    @property
    def fdp_accounting(self) -> Any:
        """The f-DP accounting of the uploads' noise (Noisy-FedAvg/FedProx), or None."""
        return None

    @property
    def noise(self) -> float | None:
        """The noise this stage adds, where `with_noise` sets it (None: not yet calibrated, or no such noise)."""
        return None

    def with_noise(self, noise: float) -> UploadMechanism:
        raise TypeError(f"{type(self).__name__} has no noise to calibrate")

    def bytes_per_upload(self, dim: int) -> int:
        return 4 * dim

    def describe(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class MechanismChain(UploadMechanism):
    """Upload mechanisms applied in order, each to the previous one's output; its state is one state per link.

    The chain's events compose its links' events; its unit is their one unit (mixing units is refused).
    """

    links: tuple[UploadMechanism, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.links:
            raise ValueError("a mechanism chain needs at least one mechanism")
        units = {m.unit for m in self.links if m.unit is not None}
        if len(units) > 1:
            raise ValueError(f"a mechanism chain protects one unit, got {sorted(units)}")

    @property
    def unit(self) -> str | None:  # type: ignore[override]
        return next((m.unit for m in self.links if m.unit is not None), None)

    @property
    def accounted(self) -> bool:  # type: ignore[override]
        return all(m.accounted for m in self.links)

    def init(self) -> tuple[Any, ...]:
        return tuple(m.init() for m in self.links)

    def release(self, state: Any, deltas: P.Params, clients: Sequence[int], seed: int,
                round_: int) -> MechanismRelease:
        states, metrics, out = [], {}, deltas
        for mechanism, own in zip(self.links, state, strict=True):
            out, new, m = mechanism.release(own, out, clients, seed, round_)
            states.append(new)
            metrics.update(m)
        return MechanismRelease(out, tuple(states), metrics)

    def events_for_every_client(self) -> bool:
        return all(m.events_for_every_client() for m in self.links)

    def event(self, client: int, round_: int, cohort: int) -> DpEvent | None:
        events = [e for m in self.links if (e := m.event(client, round_, cohort)) is not None]
        return None if not events else events[0] if len(events) == 1 else ComposedDpEvent(events)

    def bytes_per_upload(self, dim: int) -> int:
        return self.links[-1].bytes_per_upload(dim)

    def describe(self) -> str:
        return ", then ".join(m.describe() for m in self.links)


# ---- client-side state ----------------------------------------------------------------------------------------
@runtime_checkable
class ClientState(Protocol):
    """State that never leaves the clients (PPSGD's u_k, CENTAUR's private heads): the clients' start points, the
    shared part of their updates, and the models they use. Checkpointed with the run (`state_dict`)."""

    def start_points(self, global_params: P.Params, clients: Sequence[int], round_: int) -> P.Params: ...
    def shared_update(self, deltas: P.Params, clients: Sequence[int]) -> P.Params: ...
    def global_model(self, params: P.Params) -> P.Params: ...
    def personal_models(self, global_params: P.Params) -> dict[int, P.Params]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any] | None) -> None: ...


# ---- the server step ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundInputs:
    """What the server step gets besides the state, the global parameters and the uploads.

    `starts`: each client's start model `[K, ...]` where the broadcast personalised it (uploads are relative to it);
    `channel`: the engine's noise facts, given only to a `privileged` step (an oracle, never a real server).
    """

    view: ServerView
    seed: int
    round_: int
    starts: P.Params | None = None
    channel: NoiseChannel | None = None


class ServerUpdate(NamedTuple):
    """One server step: the new global parameters, the step's new state and the round's metrics."""

    params: P.Params
    state: Any
    metrics: dict[str, Any]


class ServerStep:
    """The server's round: from the uploads (what it sees of the clients) to the next global model.

    Subclasses implement `aggregate` (a stateless step) or override `init`/`update`. The methods below `update`
    are the optional abilities the loop calls every round; their defaults do nothing.
    """

    privileged: bool = False  # reads the engine's noise channel: an oracle, not a deployable server
    secure: bool = False  # the server sees only secure-aggregation sums
    linear_in_updates: bool = True  # the new model is a weighted sum of the uploads (the noise statistic applies)
    asks_clients: bool = False  # clients answer `model_choice` after aggregation (its cost goes on their ledgers)
    personalises_starts: bool = False  # `start_points` may give clients other start models than the global one
    encodes_broadcast: bool = False  # `broadcast` sends the clients an encoded model instead of the global one
    encodes_uploads: bool = False  # `client_payload` replaces the uploads (PFA+'s codes)
    replays_noise: bool = False  # `noise_passthrough` measures the clients' noise through the step (PFA)
    central_noise: bool = False  # the step adds the DP noise itself (central DP, or its distributed version)
    calibration_family: str | None = None  # the run_calibration family of a noise that `with_noise` can set
    adaptive_clipping: AdaptiveClipping | None = None  # the client-level adaptive clip the step runs (None: none)
    server_lr: float = 1.0  # the step's own x + server_lr * (its update) (1: moves to its aggregate)

    @property
    def noise(self) -> float | None:
        """The noise multiplier this step adds, where `with_noise` sets it (None: not calibrated, or none)."""
        return None

    def with_noise(self, noise: float) -> ServerStep:
        raise TypeError(f"{type(self).__name__} has no noise to calibrate")

    # -- explicit state ---------------------------------------------------------------------------------------
    def init(self, params: P.Params) -> Any:
        """The step's state before round 1, given the initial global parameters (None: stateless)."""
        return None

    def update(self, state: Any, params: P.Params, uploads: Any, inputs: RoundInputs) -> ServerUpdate:
        """The round's step from `state`: new global parameters, new state, metrics."""
        return ServerUpdate(self.aggregate(params, uploads, inputs.view, inputs.seed, inputs.round_), state, {})

    def aggregate(self, global_params: P.Params, uploads: Any, view: ServerView, seed: int,
                  round_: int) -> P.Params:
        raise NotImplementedError(f"{type(self).__name__} implements neither aggregate nor update")

    # -- before the run and at selection ------------------------------------------------------------------------
    def fit_split(self, clients: Any, eps_reported: Any, seed: int = 0) -> ServerStep:
        """The step fitted to the population's reported epsilons (PFA's public/private split); itself by default."""
        return self

    def accepts_selection(self, selected: Sequence[int]) -> bool:
        """Whether a round may run with `selected` (PFA needs a public participant); re-drawn otherwise."""
        return True

    @property
    def public_clients(self) -> tuple[int, ...] | None:
        """The clients a selection must include one of (None: no constraint)."""
        return None

    def accounted_selection(self, selection: Selection) -> Selection:
        """The client selection the accountant models: the run's own (`selection`); a step that simulates a larger
        cohort (central DP-FedAvg's noise_cohort) models that cohort's."""
        return selection

    # -- broadcast and upload -----------------------------------------------------------------------------------
    def start_points(self, state: Any, global_params: P.Params, clients: Sequence[int],
                     round_: int) -> tuple[P.Params | None, Any]:
        """Each client's start model `[K, ...]` and the step's state after choosing them (None: the global model)."""
        return None, state

    def broadcast(self, state: Any, global_params: P.Params, clients: Sequence[int], seed: int, round_: int,
                  attempt: int = 0) -> tuple[Any, Any]:
        """What the clients receive instead of the model in the clear (MP-DP's perturbed model), and the state after
        drawing it (its secrets stay in the state, never in the broadcast); `attempt` counts the re-runs of a round
        the upload protocol discarded. (None, state): the clients receive the global model (or `start_points`)."""
        return None, state

    def client_payload(self, state: Any, uploads: P.Params, view: ServerView, seed: int = 0) -> Any:
        """What the clients send instead of their uploads where the broadcast (made from `state`) asks for it (PFA+:
        codes of the subspace in its state); None: the uploads themselves."""
        return None

    # -- after aggregation ----------------------------------------------------------------------------------------
    def model_choice(self, state: Any, round_: int, global_params: P.Params) -> Any:
        """A question the clients answer privately after the round (R-DPCFL's model selection), or None."""
        return None

    def chosen(self, state: Any, round_: int, picks: dict[int, int]) -> tuple[Any, dict[str, Any]]:
        """The clients' answers to `model_choice`: the new state and metrics."""
        return state, {}

    def personal_models(self, state: Any, global_params: P.Params) -> dict[int, P.Params]:
        """client -> the personal model it holds in `state` (FedCEO's, its cluster's); {} for a global-model step."""
        return {}

    def privacy_notes(self, state: Any, history: Sequence[dict[str, Any]] = ()) -> dict[str, Any] | None:
        """privacy.json's `stage` block at `state` (the state after the last round): releases of the step's own
        (R-DPCFL's private selections), or a guarantee the step states from the rounds run (`history`, their metrics
        rows: MP-DP's nominal one), or None."""
        return None

    def protocol_description(self) -> dict[str, Any] | None:
        """privacy.json's `secure_aggregation` block, for a secure step."""
        return None

    # -- engine-side diagnostics (never seen by a real server) ------------------------------------------------
    def aggregation_weights(self, state: Any, view: ServerView, channel: NoiseChannel | None,
                            dim: int) -> torch.Tensor | None:
        """The weights of the round's weighted mean of the uploads, given the state its update returned (Robust-HDP's
        weights come from the uploads) (None: not a weighted mean)."""
        return None

    def public_mask(self, view: ServerView, seed: int = 0) -> torch.Tensor | None:
        """Which participants are public (PFA's groups), or None."""
        return None

    def noise_passthrough(self, uploads: P.Params, noise: P.Params, view: ServerView, seed: int,
                          round_: int) -> P.Params | None:
        """The clients' noise pushed through the step (PFA's projection); None unless `replays_noise`."""
        return None


@dataclass(frozen=True)
class AggregateFunction(ServerStep):
    """A stateless server step from any object with `aggregate(global_params, uploads, view, seed, round_)`: how an
    aggregator written without subclassing `ServerStep` (a user's, registered by name) joins the round."""

    aggregator: Any = None

    def aggregate(self, global_params: P.Params, uploads: Any, view: ServerView, seed: int,
                  round_: int) -> P.Params:
        return self.aggregator.aggregate(global_params, uploads, view, seed, round_)


def as_server_step(aggregator: Any) -> ServerStep:
    """`aggregator` as a server step: itself if it is one, else wrapped (`AggregateFunction`); a clear error if it
    cannot aggregate."""
    if isinstance(aggregator, ServerStep):
        return aggregator
    if callable(getattr(aggregator, "aggregate", None)):
        return AggregateFunction(aggregator)
    raise TypeError(f"a server step must subclass dpfl.ServerStep or have aggregate(global_params, uploads, view, "
                    f"seed, round_); got {type(aggregator).__name__}")

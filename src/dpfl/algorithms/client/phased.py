"""A local program in phases, each training its own subset of the parameters (CENTAUR, fedceo.md §6.3).

CENTAUR's client first fits its private head with the representation frozen, then trains the
representation with its head frozen. Each phase is an ordinary `LocalProgram` whose spec names the
tensors it trains; under DP-SGD both phases touch the client's records, so the round's DP event is the
composition of the phases' events (a head fitted on clean gradients would leak into later uploads).
"""

from __future__ import annotations

from dataclasses import dataclass

from dp_accounting import ComposedDpEvent, DpEvent

from dpfl.algorithms.client.engine_round import train_on_engine
from dpfl.algorithms.client.program import LocalProgram
from dpfl.algorithms.stages import LocalInputs, LocalOutput
from dpfl.engine.local_training import LocalSpec


@dataclass(frozen=True)
class PhasedProgram:
    """Phases run in order on the same client; the last phase's spec is the program's (loss, lr, clip)."""

    phases: tuple[LocalProgram, ...]

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError("a phased program needs at least one phase")
        if len({p.private for p in self.phases}) > 1 or len({p.sampling for p in self.phases}) > 1:
            raise ValueError("all phases of a local program must share one privacy mechanism and sampling")
        if any(p.spec.trainable is None for p in self.phases[:-1]):
            raise ValueError("every phase but the last must name the tensors it trains (spec.trainable)")
        if any(p.spec.adaptive_clipping is not None for p in self.phases):
            raise ValueError("privacy.adaptive_clipping: a phased local program's phases clip different tensors, so "
                             "one adaptive clip per client cannot follow both; not supported")

    def init(self, population: int) -> None:  # noqa: ARG002
        """Stateless (adaptive clipping is refused): the loop's neutral client-side state."""
        return None

    def adaptive_budget_problem(self, noise, n_records, batch_sizes) -> None:  # noqa: ARG002
        """None: no phase adapts its clip (refused above)."""
        return None

    @property
    def spec(self) -> LocalSpec:
        return self.phases[-1].spec

    @property
    def private(self) -> bool:
        return self.phases[-1].private

    @property
    def sampling(self) -> str:
        return self.phases[-1].sampling

    def run(self, inputs: LocalInputs) -> LocalOutput:
        """The selected clients' round: the engine trains every phase in turn (`engine_round.train_on_engine`)."""
        return train_on_engine(self, inputs)

    def batch_for(self, n_records: int, batch_size: int, round_: int) -> int:  # noqa: ARG002
        """The client's batch size in every round (phased programs schedule none)."""
        return batch_size

    def steps_for(self, n_records: int, batch_size: int) -> int:
        """All phases' steps (each is a sampled-Gaussian step under DP-SGD)."""
        return sum(p.steps_for(n_records, batch_size) for p in self.phases)

    def event(self, n_records: int, batch_size: int, noise_multiplier: float) -> DpEvent | None:
        events = [e for e in (p.event(n_records, batch_size, noise_multiplier) for p in self.phases) if e is not None]
        if not events:
            return None
        return events[0] if len(events) == 1 else ComposedDpEvent(events)

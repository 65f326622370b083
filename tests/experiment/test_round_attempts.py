"""A round the upload protocol discards (`RoundAborted`) runs again with a fresh broadcast, and a local program
that trains the model it receives refuses an encoded broadcast (dpfl.algorithms.stages)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch

from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.stages import MechanismRelease, RoundAborted
from dpfl.engine import params as P
from stateful_mechanism import federation_run


@dataclass(frozen=True)
class DropsOnce(FullUpdate):
    """Discards the first `aborts` attempts of round `round_to_drop`: client 1 'left after key agreement'."""

    round_to_drop: int = 1
    aborts: int = 1
    calls: list[int] = field(default_factory=list)  # the rounds it was called for (test bookkeeping)

    def release(self, state: Any, deltas: P.Params, clients: Sequence[int], seed: int,
                round_: int) -> MechanismRelease:
        self.calls.append(round_)
        if round_ == self.round_to_drop and self.calls.count(round_) <= self.aborts:
            raise RoundAborted("client 1 left after key agreement", [k for k in clients if k != 1])
        return super().release(state, deltas, clients, seed, round_)


@dataclass(frozen=True)
class CountsAttempts(FedAvg):
    """FedAvg that records the attempt of every broadcast (and sends the model in the clear)."""

    seen: list[tuple[int, int]] = field(default_factory=list)

    def broadcast(self, state: Any, global_params: P.Params, clients: Sequence[int], seed: int, round_: int,
                  attempt: int = 0) -> tuple[Any, Any]:
        self.seen.append((round_, attempt))
        return None, state


def _with(upload: Any, aggregator: Any = None):  # noqa: ANN202
    run = federation_run(rounds=3)
    run.algorithm = replace(run.algorithm, upload=upload, aggregator=aggregator or FedAvg())
    run.ledger = None  # the stages here are not the chain the run was accounted with
    return run


def test_a_discarded_round_runs_again_and_the_row_records_who_had_uploaded():
    plain = _with(FullUpdate()).run()
    counter = CountsAttempts()
    dropped = _with(DropsOnce(aborts=2), counter).run()
    assert dropped.history[1]["discarded_attempts"] == [[0, 2, 3], [0, 2, 3]]
    assert "discarded_attempts" not in dropped.history[0] and "discarded_attempts" not in dropped.history[2]
    assert counter.seen == [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0)]  # a fresh broadcast per attempt
    # FedAvg's clients draw their batches from (seed, round, client): the re-run trains exactly as the first try
    for name in plain.params:
        assert torch.equal(plain.params[name], dropped.params[name])


def test_a_round_discarded_every_time_fails_the_run():
    from dpfl.experiment.federated_run import MAX_ATTEMPTS

    with pytest.raises(RoundAborted, match="left after key agreement"):
        _with(DropsOnce(aborts=MAX_ATTEMPTS)).run()


def test_a_training_program_refuses_an_encoded_broadcast():
    @dataclass(frozen=True)
    class Encodes(FedAvg):
        def broadcast(self, state, global_params, clients, seed, round_, attempt=0):  # noqa: ANN001, ANN202
            return {"perturbed": True}, state

    with pytest.raises(ValueError, match="trains the model it receives"):
        _with(FullUpdate(), Encodes()).run()

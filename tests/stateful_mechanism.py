"""TEST ONLY: an upload mechanism whose parameter changes from round to round, to prove the mechanism-state
contract (dpfl.algorithms.stages): the state is returned by `release`, checkpointed by the loop and passed back in,
so a run killed and resumed releases exactly what an uninterrupted run releases.

`ReleasedNormClip` clips each client's update to C_t and adds N(0, (z C_t)^2) per coordinate: one participation is
the Gaussian mechanism at multiplier z whatever C_t is, so its DP event does not depend on the state. C_t then moves
geometrically towards a quantile of the *released* uploads' norms (C <- C exp(-eta (b - gamma)), b the fraction of
released norms at most C sqrt(1 + z^2 d), the norm a clipped update reaches with its noise): a function of what was
released only, i.e. post-processing. Not a method of any paper; the real adaptive clipping is issue 68's.

As a script, the kill-and-resume half of tests/experiment/test_mechanism_state.py::

    python tests/stateful_mechanism.py CHECKPOINT RESULT [--kill-after N]

runs the test's federation, writing CHECKPOINT after every round; with --kill-after it SIGKILLs itself right after
the checkpoint of round N; without it, it resumes from CHECKPOINT if that exists and writes the final parameters and
history to RESULT.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from dpfl.algorithms.client.upload import upload_noise
from dpfl.algorithms.stages import MechanismRelease, UploadMechanism
from dpfl.engine import params as P
from dpfl.privacy.events import gaussian_event


@dataclass(frozen=True)
class ReleasedNormClip(UploadMechanism):
    """Clip to C_t, add N(0, (z C_t)^2 I); C_t follows the released norms (state: {"clip": C_t})."""

    noise_multiplier: float
    initial_clip: float = 0.05
    eta: float = 0.5
    target: float = 0.6  # gamma; with 4 clients b is a multiple of 1/4, never gamma: C_t moves every round
    unit: str = "client"

    def init(self) -> dict[str, float]:
        return {"clip": self.initial_clip}

    def release(self, state: Any, deltas: P.Params, clients: Sequence[int], seed: int,
                round_: int) -> MechanismRelease:
        clip = float(state["clip"])
        flat = P.flatten(deltas)
        flat = flat * (clip / (flat.norm(dim=1) + 1e-12)).clamp(max=1.0)[:, None]
        flat = flat + self.noise_multiplier * clip * upload_noise(flat.shape[1], clients, seed, round_)
        reach = clip * math.sqrt(1.0 + self.noise_multiplier**2 * flat.shape[1])
        below = float((flat.norm(dim=1) <= reach).to(torch.float64).mean())
        new = clip * math.exp(-self.eta * (below - self.target))
        return MechanismRelease(P.unflatten(flat, deltas), {"clip": new}, {"mechanism_clip": clip})

    def event(self, client: int, round_: int, cohort: int):
        return gaussian_event(self.noise_multiplier)

    def describe(self) -> str:
        return f"TEST ONLY: clip to C_t following the released norms, + Gaussian (multiplier {self.noise_multiplier})"


def federation_run(rounds: int = 6):
    """The test's run: 4 clients, all taking part, plain local SGD, the mechanism chained before a full upload."""
    from dpfl.algorithms.algorithm import Algorithm
    from dpfl.algorithms.client.program import sgd
    from dpfl.algorithms.client.upload import FullUpdate
    from dpfl.algorithms.selection import Selection
    from dpfl.algorithms.server.fedavg import FedAvg
    from dpfl.algorithms.stages import MechanismChain
    from dpfl.experiment.federated_run import FederatedRun
    from dpfl.privacy.budgets import ClientBudget

    g = torch.Generator().manual_seed(0)
    w_true = torch.randn(16, 3, generator=g)
    xs = [torch.randn(60, 16, generator=g) for _ in range(4)]
    xt = torch.randn(200, 16, generator=g)
    data = SimpleNamespace(clients=[SimpleNamespace(x_train=x, y_train=(x @ w_true).argmax(1)) for x in xs],
                           x_test=xt, y_test=(xt @ w_true).argmax(1))
    torch.manual_seed(0)
    chain = MechanismChain((ReleasedNormClip(noise_multiplier=0.5), FullUpdate()))
    alg = Algorithm("released_norm_clip", sgd(0.1, steps=3), Selection(), chain, FedAvg())
    return FederatedRun(data, nn.Linear(16, 3), alg, rounds=rounds, batch_sizes=8,
                        budgets=[ClientBudget(50.0, 1e-5)] * 4, seed=3)


def main(argv: list[str]) -> None:
    from dpfl.experiment.run_records import RunState

    checkpoint, result = Path(argv[0]), Path(argv[1])
    kill_after = int(argv[3]) if len(argv) > 3 and argv[2] == "--kill-after" else None

    def save(state: RunState) -> None:
        tmp = checkpoint.with_suffix(".tmp")
        torch.save(state.to_dict(), tmp)
        os.replace(tmp, checkpoint)
        if kill_after is not None and state.round == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    start = RunState.from_dict(torch.load(checkpoint, weights_only=True)) if checkpoint.exists() else None
    done = federation_run().run(state=start, on_checkpoint=save)
    torch.save({"params": done.params, "history": done.history, "spent": done.spent()}, result)


if __name__ == "__main__":
    main(sys.argv[1:])

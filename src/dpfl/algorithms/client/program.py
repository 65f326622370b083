"""A local program: what a selected client runs on its data, and the DP event that constitutes.

The program is a pure description (hyperparameters); the engine executes it for a whole cohort.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dp_accounting import DpEvent

from dpfl.engine.local_training import ClientPlan, LocalSpec
from dpfl.privacy.events import dpsgd_event


@dataclass(frozen=True)
class LocalProgram:
    """Local steps of SGD or DP-SGD.

    Exactly one of `steps` (per round) and `epochs` is set; an epoch is ceil(n_i / b_i) steps.
    `private` means sample-level DP-SGD: each step is the sampled Gaussian mechanism on the client's
    records, with the client's own noise multiplier.
    """

    spec: LocalSpec
    steps: int | None = None
    epochs: float | None = None
    private: bool = False

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of steps and epochs for the local program")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"local steps must be >= 1, got {self.steps}")
        if self.epochs is not None and not self.epochs > 0:
            raise ValueError(f"local epochs must be > 0, got {self.epochs}")
        if self.private and self.spec.clip is None:
            raise ValueError("a private local program needs a clipping norm")
        if self.private and self.spec.sampling == "shuffle":
            raise ValueError("DP-SGD needs 'poisson' or 'fixed' sampling: shuffled epochs have no sampled-Gaussian analysis")

    def steps_for(self, n_records: int, batch_size: int) -> int:
        """Local steps per round for a client with n_records records and batch size batch_size."""
        if self.steps is not None:
            return self.steps
        assert self.epochs is not None
        return max(1, math.ceil(self.epochs * math.ceil(n_records / batch_size)))

    def plan(self, client: int, n_records: int, batch_size: int, noise_multiplier: float) -> ClientPlan:
        return ClientPlan(client, batch_size, self.steps_for(n_records, batch_size), noise_multiplier if self.private else 0.0)

    def event(self, n_records: int, batch_size: int, noise_multiplier: float) -> DpEvent | None:
        """The sample-level DP event of one round of this program for one client (None if not private)."""
        if not self.private:
            return None
        steps = self.steps_for(n_records, batch_size)
        if self.spec.sampling == "poisson":
            return dpsgd_event(noise_multiplier, steps, sampling="poisson", sample_rate=min(1.0, batch_size / n_records))
        return dpsgd_event(noise_multiplier, steps, sampling="fixed", population=n_records, sample_size=batch_size)

    @property
    def sampling(self) -> str:
        return self.spec.sampling


def sgd(lr: float, *, steps: int | None = None, epochs: float | None = None, loss: str = "cross_entropy",
        momentum: float = 0.0, prox_mu: float = 0.0, trainable: tuple[str, ...] | None = None) -> LocalProgram:
    """Non-private local SGD over shuffled minibatches (mean loss over the actual batch)."""
    spec = LocalSpec(lr=lr, loss=loss, sampling="shuffle", momentum=momentum, prox_mu=prox_mu, trainable=trainable)
    return LocalProgram(spec, steps, epochs)


def dpsgd(lr: float, clip: float, *, steps: int | None = None, epochs: float | None = None, sampling: str = "poisson",
          loss: str = "cross_entropy", momentum: float = 0.0, prox_mu: float = 0.0,
          trainable: tuple[str, ...] | None = None) -> LocalProgram:
    """Sample-level DP-SGD: per-sample clipping to `clip` (one global L2 norm), Gaussian noise on the sum.

    Poisson sampling (default) is accounted as the Poisson sampled Gaussian (add/remove); fixed-size
    sampling as sampling without replacement (replace-one).
    """
    spec = LocalSpec(lr=lr, loss=loss, clip=clip, sampling=sampling, momentum=momentum, prox_mu=prox_mu,
                     trainable=trainable)
    return LocalProgram(spec, steps, epochs, private=True)

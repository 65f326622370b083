"""What an algorithm's factory needs from the run it is built for, beyond its own params: `RunFacts`.

    run = RunFacts(lr=0.5, clients=10, clip=1.0)            # DP-SGD local training, every client each round
    algorithm = dpfl.algorithms.pfa(run, public_fraction=0.2)

A config fills it in from its training, privacy, data and model sections (`dpfl.experiment.algorithm_bundle`);
each factory's docstring says which facts it reads. A fact the run gets wrong is an `AlgorithmError`, which
names the config key it comes from (the config path turns it into a one-line `ConfigError` on that key).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from dpfl.algorithms.client.program import LocalProgram, dpsgd, sgd
from dpfl.algorithms.secure.aggregator import SecureAggregation
from dpfl.algorithms.selection import Selection
from dpfl.data.federated import FederatedDataset
from dpfl.privacy.adaptive_clipping import AdaptiveClipping
from dpfl.privacy.budgets import ClientBudget

__all__ = ["AlgorithmError", "RunFacts", "mechanism_of", "validated"]


class AlgorithmError(ValueError):
    """A run fact an algorithm cannot run with; `key` is the config key it comes from (e.g. "model")."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class RunFacts:
    """The run an algorithm is built for: its training and privacy settings, its model and its data's size.

    The names are the config's: lr, momentum, micro_batch, precision (training.optimizer / training), local_epochs or
    local_steps, rounds, selection (training.selection), clients (data.clients); mechanism (None: the algorithm's
    default), clip (with adaptive_clipping: its initial clip), adaptive_clipping (None: a fixed clip),
    noise_cohort_size (central DP's simulated cohort), sampling, noise_multiplier (None: calibrated from the budgets
    by `FederatedRun`),
    paper_eta_scaling, per_upload_amplification and the f-DP fields observer, release, smoothness_L,
    honest_clients, secure_view (privacy.secure_aggregation) of the privacy section; loss, param_names,
    head_module and model_name of the model; secure: the secure-aggregation protocol run for real (or None).
    aggregator: an aggregator replacing the bundle's (algorithm.aggregator); local: a factory of the user's local
    program (algorithm.local), called with the keywords of `dpfl.register_local_program`. seed (the run seed), data,
    budgets and batch_sizes (one per client): what the clustered algorithms, built with their data, read. model (the
    built network), input_shape (one record's shape, without the batch axis) and run_name: what MP-DP and its
    baselines read (MP-DP perturbs the network; the run name keys its pairwise noise).
    """

    lr: float
    clients: int
    rounds: int = 1
    local_epochs: float | None = 1.0
    local_steps: int | None = None
    momentum: float = 0.0
    micro_batch: int | None = None
    precision: str = "float32"
    selection: Selection = field(default_factory=Selection)
    mechanism: str | None = None
    clip: float | None = None
    adaptive_clipping: AdaptiveClipping | None = None
    noise_cohort_size: int | None = None
    sampling: str = "poisson"
    noise_multiplier: float | None = None
    paper_eta_scaling: bool = False
    per_upload_amplification: bool = False
    observer: str = "server"
    release: str = "transcript"
    smoothness_L: float | None = None
    honest_clients: int | None = None
    secure_view: bool = False
    loss: str = "cross_entropy"
    param_names: tuple[str, ...] = ()
    head_module: str | None = None
    model_name: str = "provided"
    secure: SecureAggregation | None = None
    aggregator: Any = None
    local: Callable[..., LocalProgram] | None = None
    seed: int = 0
    data: FederatedDataset | None = None
    budgets: tuple[ClientBudget, ...] | None = None
    batch_sizes: tuple[int, ...] | None = None
    model: Any = None
    input_shape: tuple[int, ...] | None = None
    run_name: str = "run"

    @property
    def planned_cohort(self) -> int | None:
        """Uploads averaged per round as planned: every client, or k of a fixed cohort (None under Poisson)."""
        return self.clients if self.selection.kind == "all" else self.selection.k

    def local_program(self, *, private: bool, prox_mu: float = 0.0, lr_factor: float = 1.0,
                      trainable: tuple[str, ...] | None = None, epochs: float | None = None) -> LocalProgram:
        """The run's local program (the user's, if given); `epochs` replaces its length (CENTAUR's head phase).

        A private program carries the run's `adaptive_clipping` (sample level: each client's DP-SGD clip adapts; its
        `spec.adaptive_clipping` says so, for a check that the setting was honoured); a user's program must carry
        it itself, else the setting is refused. A non-private program ignores it (mechanism central adapts the
        server's clip, not a local one)."""
        if epochs is not None:
            length: dict[str, Any] = dict(epochs=epochs)
        else:
            length = dict(steps=self.local_steps) if self.local_steps is not None else dict(epochs=self.local_epochs)
        lr = self.lr * lr_factor
        adaptive = self.adaptive_clipping if private else None
        if self.local is not None:
            user = self.local(lr=lr, loss=self.loss, steps=length.get("steps"), epochs=length.get("epochs"),
                              momentum=self.momentum, prox_mu=prox_mu, private=private,
                              clip=self.clip if private else None, sampling=self.sampling if private else None)
            if adaptive is not None and getattr(user.spec, "adaptive_clipping", None) != adaptive:
                raise AlgorithmError("privacy.adaptive_clipping: the user's local program (algorithm.local) does not "
                                     "adapt its clip (its spec.adaptive_clipping differs); remove the setting or build "
                                     "the program with dpsgd(..., adaptive_clipping=...)", "privacy.adaptive_clipping")
            return user
        common = dict(loss=self.loss, momentum=self.momentum, prox_mu=prox_mu, trainable=trainable, **length)
        if private:
            if self.clip is None:
                raise AlgorithmError("privacy.clip: DP-SGD needs a clip norm", "privacy.clip")
            program = dpsgd(lr, self.clip, sampling=self.sampling, adaptive_clipping=adaptive, **common)
        else:
            program = sgd(lr, **common)
        if self.micro_batch is not None:
            program = dataclasses.replace(program, spec=dataclasses.replace(program.spec, micro_batch=self.micro_batch))
        if self.precision != "float32":
            program = dataclasses.replace(program, spec=dataclasses.replace(program.spec, precision=self.precision))
        return program


def mechanism_of(run: RunFacts, name: str, mechanisms: tuple[str, ...]) -> str:
    """The run's mechanism, if the algorithm runs with it (None: the algorithm's default, the first)."""
    if run.mechanism is None:
        return mechanisms[0]
    if run.mechanism not in mechanisms:
        raise AlgorithmError(f"privacy.mechanism: algorithm {name!r} runs with mechanism "
                             f"{' or '.join(map(repr, mechanisms))} (got {run.mechanism!r})", "privacy.mechanism")
    return run.mechanism


def validated(model: type[BaseModel], name: str, arguments: dict[str, Any]) -> Any:
    """A factory's keyword arguments (its `locals()`, less `run`) checked by its params model; a bad value is a
    ValueError naming the argument."""
    values = {k: v for k, v in arguments.items() if k != "run"}
    try:
        return model.model_validate(values)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "params"
        raise ValueError(f"{name}: {where}: {first.get('msg')} (got {first.get('input')!r})") from None

"""The clients' side of MP-DP's FedSGD round and of its baselines (spec bidirectional.md §6, §9): one gradient of the
batch-mean ½‖y(x) - ȳ‖² per round, on a batch drawn without replacement (`batches.py`), in float64.

- `PerturbedGradient` (MP-DP, MP-DP-Naive): the client receives only the perturbed model Ŵ (the server step's
  broadcast) and computes g, Ψ and Φ there by LMT (`lmt.py`), then clips them jointly (`clip_mode`).
- `TrueGradient` (FedSGD, MP-CDP, TP-SMC): the client receives the model in the clear and computes its gradient
  there, clipped to B where the method clips.

They are local programs of the one round loop: `run` replaces the engine's training, since recovery needs exactly one
gradient at the broadcast model. Both are FedSGD: one step per round, whatever the program's `steps` says.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

from dpfl.algorithms.client.program import LocalProgram
from dpfl.algorithms.secure.mpdp.algorithm import client_gradient, client_terms
from dpfl.algorithms.secure.mpdp.batches import fedsgd_batch
from dpfl.algorithms.secure.mpdp.lmt import LMTResult
from dpfl.algorithms.secure.mpdp.perturb import ClientPayload, FactorPlan
from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings
from dpfl.algorithms.stages import LocalInputs, LocalOutput
from dpfl.engine import params as P


class PerturbedTerms(NamedTuple):
    """Each client's clipped LMT terms at the broadcast Ŵ, and which broadcast they answer (round, attempt)."""

    terms: dict[int, LMTResult]
    round_: int
    attempt: int


def _batches(program: LocalProgram, inputs: LocalInputs, n_classes: int):  # type: ignore[no-untyped-def]
    """(client, x, one-hot y) of every selected client's FedSGD batch this round."""
    for k, plan in zip(inputs.clients, inputs.plans_for(program), strict=True):
        x, y = inputs.data.client(k)
        xb, yb = fedsgd_batch(x, y, plan.batch_size, inputs.seed, k, inputs.round_)
        yield k, xb, torch.nn.functional.one_hot(yb.long(), n_classes).to(torch.float64)


def _weights(params: P.Params) -> list[torch.Tensor]:
    return list(params.values())


@dataclass(frozen=True)
class PerturbedGradient(LocalProgram):
    """MP-DP's client (Algorithm 4's client step): LMT at the broadcast Ŵ, then the joint clip to B (`perturbed_joint`;
    `none` does not clip; `oracle_true` scales by the TRUE gradient's norm, which only a simulation can see)."""

    network: FactorPlan | None = None  # the network's FactorPlan (`plan` is a local program's per-client plan)
    settings: RoundSettings | None = None  # the method's (its clip B and clip_mode)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.network is None or self.settings is None:
            raise ValueError("MP-DP's local program needs the network's FactorPlan and the method's settings")

    def run(self, inputs: LocalInputs) -> LocalOutput:
        payload = inputs.broadcast
        if not isinstance(payload, ClientPayload):
            raise ValueError("MP-DP's clients compute at the perturbed model; the server step broadcast none")
        assert self.network is not None and self.settings is not None
        t0 = time.perf_counter()
        weights = _weights(inputs.global_model)  # read by clip_mode oracle_true only: a simulation's clip
        terms: dict[int, LMTResult] = {k: client_terms(payload, weights, x, y, self.settings)
                                       for k, x, y in _batches(self, inputs, self.network.out_dim)}
        count = len(inputs.clients)
        return LocalOutput(PerturbedTerms(terms, payload.round_id, payload.attempt), [1] * count, [0.0] * count,
                           {"lmt_seconds": time.perf_counter() - t0})


@dataclass(frozen=True)
class TrueGradient(LocalProgram):
    """FedSGD's client: the gradient at the model received in the clear, clipped to B where the method clips
    (MP-CDP, TP-SMC)."""

    network: FactorPlan | None = None  # the network's FactorPlan (`plan` is a local program's per-client plan)
    settings: RoundSettings | None = None  # the method's (whether it clips, and to what)

    def run(self, inputs: LocalInputs) -> LocalOutput:
        if inputs.broadcast is not None:
            raise ValueError("FedSGD's clients compute at the model in the clear; the server step broadcast another")
        assert self.network is not None and self.settings is not None
        t0 = time.perf_counter()
        weights = _weights(inputs.global_model)
        grads = {k: client_gradient(weights, x, y, self.settings, self.network)
                 for k, x, y in _batches(self, inputs, self.network.out_dim)}
        count = len(inputs.clients)
        return LocalOutput(grads, [1] * count, [0.0] * count, {"client_seconds": time.perf_counter() - t0})

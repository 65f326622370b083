"""A training local program's round on the engine: its phases, one after another, from the broadcast model.

Shared by the in-process round (`LocalProgram.run`, whichever backend trains) and a Flower ClientApp that holds one
client's records, so both compute the same thing: the same plans, the same phase seeds, the same upload stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from dpfl.algorithms.stages import LocalInputs, LocalOutput
from dpfl.engine import params as P
from dpfl.engine.backends.base import Backend
from dpfl.engine.local_training import ClientPlan
from dpfl.engine.pooled import PooledData
from dpfl.seeding import derive_seed

PHASE_KEY = 0x5048  # seeds of a phased local program's later phases: derive_seed(seed, PHASE_KEY, phase)


@dataclass
class Trained:
    """The clients' end parameters `[K, ...]` and what their local programs did."""

    params: P.Params
    steps: list[int]
    noise_sq_norm: list[float]  # ||sum_t xi_t||^2 of each client's DP-SGD noise (diagnostics only)
    clips: list[float] | None = None  # adaptive clipping: each client's clip after the last phase (None: fixed)


def train_phases(program: Any, model: nn.Module, backend: Backend, data: PooledData,
                 plans_for: Callable[[Any], Sequence[ClientPlan]], start: Mapping[str, torch.Tensor], *,
                 stacked: bool, seed: int, round_: int, max_elements: int, global_model: P.Params) -> Trained:
    """Run every phase of `program` (CENTAUR: head, then body; one phase otherwise) from `start`.

    plans_for(phase) gives the phase's plans; each later phase starts where the previous one ended and draws
    fresh batches and noise. `global_model` is the anchor of a phase whose prox term pulls to the server's model.
    """
    current, is_stacked = start, stacked
    steps: np.ndarray | None = None
    noise_sq: np.ndarray | None = None
    clips: list[float] | None = None
    for index, phase in enumerate(program.phases):
        plans = plans_for(phase)
        phase_seed = seed if index == 0 else derive_seed(seed, PHASE_KEY, index)
        spec = phase.spec_at(round_)
        res = backend.train(model, spec, plans, data, current, seed=phase_seed, round_=round_,
                            stacked_start=is_stacked, max_elements=max_elements,
                            anchor=global_model if spec.prox_to == "anchor" else None)
        current, is_stacked = res.params, True
        steps = np.array(res.steps, dtype=np.int64) + (0 if steps is None else steps)
        noise_sq = np.array(res.noise_sq_norm) + (0.0 if noise_sq is None else noise_sq)
        clips = res.clips
    assert steps is not None and noise_sq is not None
    return Trained(current, steps.tolist(), noise_sq.tolist(), clips)


def train_on_engine(program: Any, inputs: LocalInputs, clips: Sequence[float] | None = None) -> LocalOutput:
    """The round of a training program: the engine trains the clients from `inputs.start`; their updates are the
    end models minus the start models. `clips`: each selected client's adaptive clip at the start of the round (its
    plans' `clip`); the output's `state` is then the list of clips they end with (the program keeps them in its own
    state), else None."""
    if inputs.broadcast is not None:
        raise ValueError("this local program trains the model it receives; the server step broadcast an encoded "
                         "model instead (an algorithm pairs such a step with its own local program)")
    plans_for = inputs.plans_for
    if clips is not None:
        def plans_for(phase: Any) -> list[Any]:
            return [replace(p, clip=c) for p, c in zip(inputs.plans_for(phase), clips, strict=True)]
    trained = train_phases(program, inputs.model, inputs.backend, inputs.data, plans_for, inputs.start,
                           stacked=inputs.stacked, seed=inputs.seed, round_=inputs.round_,
                           max_elements=inputs.max_elements, global_model=inputs.global_model)
    start = inputs.start if inputs.stacked else P.broadcast(inputs.start, len(inputs.clients))
    return LocalOutput(P.sub(trained.params, start), trained.steps, trained.noise_sq_norm, {},
                       trained.clips if clips is not None else None)

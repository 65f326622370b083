"""The clients' side of a round: the local program's phases, then nothing else leaves the client but the upload.

Shared by the in-process round (`FederatedRun.local_round`, whichever backend trains) and a Flower ClientApp
that holds one client's records, so both compute the same thing: the same plans, the same phase seeds, the
same upload stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

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


def train_phases(algorithm: Any, model: nn.Module, backend: Backend, data: PooledData,
                 plans_for: Callable[[Any], Sequence[ClientPlan]], start: Mapping[str, torch.Tensor], *,
                 stacked: bool, seed: int, round_: int, max_elements: int, global_model: P.Params) -> Trained:
    """Run every phase of `algorithm.local` (CENTAUR: head, then body; one phase otherwise) from `start`.

    plans_for(phase) gives the phase's plans; each later phase starts where the previous one ended and draws
    fresh batches and noise. `global_model` is the anchor of a phase whose prox term pulls to the server's model.
    """
    current, is_stacked = start, stacked
    steps: np.ndarray | None = None
    noise_sq: np.ndarray | None = None
    for index, phase in enumerate(algorithm.local.phases):
        plans = plans_for(phase)
        phase_seed = seed if index == 0 else derive_seed(seed, PHASE_KEY, index)
        spec = phase.spec_at(round_)
        res = backend.train(model, spec, plans, data, current, seed=phase_seed, round_=round_,
                            stacked_start=is_stacked, max_elements=max_elements,
                            anchor=global_model if spec.prox_to == "anchor" else None)
        current, is_stacked = res.params, True
        steps = np.array(res.steps, dtype=np.int64) + (0 if steps is None else steps)
        noise_sq = np.array(res.noise_sq_norm) + (0.0 if noise_sq is None else noise_sq)
    assert steps is not None and noise_sq is not None
    return Trained(current, steps.tolist(), noise_sq.tolist())

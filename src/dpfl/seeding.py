"""Reproducible randomness: every draw comes from a generator keyed by (seed, round, client, purpose).

Keying by purpose means that adding a new random draw somewhere never shifts the stream of another,
and keying by client means a client's randomness is the same whether it runs alone or in a cohort.
"""

from __future__ import annotations

import enum

import numpy as np
import torch


class Purpose(enum.IntEnum):
    """What a random stream is used for; the value is part of the key and must never change."""

    INIT = 1  # model initialisation
    PARTITION = 2  # splitting data among clients
    SELECTION = 3  # which clients take part in a round
    BATCH = 4  # minibatch sampling inside a client's local program
    NOISE = 5  # DP noise added by a client
    SERVER_NOISE = 6  # DP noise added by the server
    DROPOUT = 7  # stochastic layers
    DATA = 8  # synthetic data generation
    CLUSTER = 9  # cluster draws and clustering seeds (clustered FL)
    CHOICE = 10  # a client's private choice among models (exponential mechanism noise)
    SECAGG = 11  # simulated dropouts of secure aggregation
    AUDIT = 12  # privacy audits: which canaries are included, their directions
    ATTACK = 13  # attack evaluations: which records an attacker is scored on
    # adaptive clipping's count noise: per DP-SGD step of a client (sample level), or the server's / each client's
    # share under secure aggregation (client level); the two never run together (mechanism dpsgd vs central)
    CLIP_COUNT = 14


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed from the run seed and integer keys, independent across distinct key tuples."""
    if seed < 0 or any(k < 0 for k in keys):
        raise ValueError(f"seed and keys must be non-negative, got seed={seed}, keys={keys}")
    state = np.random.SeedSequence(entropy=seed, spawn_key=tuple(int(k) for k in keys)).generate_state(
        2, dtype=np.uint32
    )
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def torch_generator(seed: int, purpose: Purpose, round_: int = 0, client: int = 0,
                    device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator for one (purpose, round, client) stream, on `device` (the tensors it fills live there).

    The key, not the device, decides the stream's seed: a CUDA generator draws a different sequence from the CPU
    one with the same seed (Philox, not Mersenne Twister), so CPU and CUDA runs agree in distribution, not bitwise.
    """
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(seed, int(purpose), round_, client))
    return g


def numpy_generator(seed: int, purpose: Purpose, round_: int = 0, client: int = 0) -> np.random.Generator:
    """A numpy generator for one (purpose, round, client) stream."""
    return np.random.default_rng(derive_seed(seed, int(purpose), round_, client))

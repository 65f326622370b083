"""The `secure_aggregation` section: run the real secure-aggregation protocol (Bonawitz et al. 2017) each round."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpfl.experiment.config.base import _Section


class SecureAggregationConfig(_Section):
    """The server learns only the sum of each round's uploads (docs/secure.md).

    threshold: Shamir threshold t, > K/2 and <= K (null: floor(K/2) + 1 of the round's K clients); the round aborts
    if fewer than t clients are left. ring_bits / frac_bits: the fixed-point ring Z/2^k (frac_bits null: 32 for a
    64-bit ring, 16 for a 32-bit one). dropout: the share of each round's clients that leave after sharing keys and
    before uploading (simulated, seeded, independent of the data). workers: server processes rebuilding masks.
    With dp_fedavg_central the noise becomes distributed: each client adds its share and the server is not trusted.
    """

    threshold: int | None = Field(None, ge=2)
    ring_bits: Literal[32, 64] = 64
    frac_bits: int | None = Field(None, ge=0, le=62)
    dropout: float = Field(0.0, ge=0, lt=1)
    workers: int = Field(1, ge=1, le=64)

"""The `ray` section: where `backend: ray` runs the cohort's local training (engine/backends/ray.py)."""

from __future__ import annotations

from pydantic import Field

from dpfl.experiment.config.base import _Section


class RayConfig(_Section):
    """address: a running Ray cluster ("ray://host:10001" or "auto"); null starts Ray on this machine.
    actors: how many shards each round's cohort is split into, one Ray actor each (default: 2).
    threads_per_actor: torch threads (and Ray CPUs) each actor uses.
    gpus_per_actor: Ray GPUs each actor asks for (default 0: actors train on their CPUs; a fraction shares a GPU
    between actors); above 0 an actor trains its shards on the GPU Ray gives it.
    On one kind of device the result does not depend on any of these: every client's batches and noise are keyed by
    (seed, round, client). Actors on GPUs draw CUDA's random streams, so their runs agree with CPU actors' in
    distribution, not bitwise.
    """

    address: str | None = Field(None, min_length=1)
    actors: int = Field(2, ge=1, le=4096)
    threads_per_actor: int = Field(1, ge=1, le=256)
    gpus_per_actor: float = Field(0.0, ge=0, le=64)

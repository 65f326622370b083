"""`dpfl bench secagg`: the cost of one secure-aggregation round against summing the same uploads in the clear.

All parties run in this process through the real protocol; the network is not simulated, so times are computation
only. Client time is the slowest client's four stages; server time is everything the server does, and the baseline
is what a plain FedAvg server does with the same float32 uploads (one sum).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dpfl.algorithms.secure import shamir
from dpfl.algorithms.secure.errors import SecAggConfigError
from dpfl.algorithms.secure.protocol import STAGES, SecAggParams, default_threshold
from dpfl.algorithms.secure.ring import FixedPointRing
from dpfl.algorithms.secure.simulate import secure_sum


def run_secagg_benchmark(clients: int = 100, dim: int = 1_000_000, dropout: float = 1 / 3,
                         stage: str = "masked_input", threshold: int | None = None, ring_bits: int = 64,
                         frac_bits: int | None = None, server_workers: int = 1, seed: int = 0) -> dict[str, Any]:
    """Times one round with `round(dropout * clients)` clients leaving before `stage`; returns a JSON-able dict."""
    if not 0 <= dropout < 1:
        raise SecAggConfigError(f"dropout must be in [0, 1), got {dropout}")
    if stage not in STAGES:
        raise SecAggConfigError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    frac_bits = frac_bits if frac_bits is not None else (32 if ring_bits == 64 else 16)
    t = threshold if threshold is not None else default_threshold(clients)
    params = SecAggParams(tuple(range(clients)), t, dim, FixedPointRing(ring_bits, frac_bits, clients),
                          run_id=b"bench", round_index=seed)
    rng = np.random.default_rng(seed)
    base = rng.uniform(-1, 1, dim).astype(np.float32)
    vectors = {c: base * np.float32(1 + c / clients) for c in range(clients)}  # float32 uploads, as models are
    n_drop = int(round(dropout * clients))
    dropped = sorted(rng.choice(clients, n_drop, replace=False).tolist())
    t0 = time.perf_counter()
    result = secure_sum(vectors, params, {stage: dropped}, server_workers=server_workers)
    wall = time.perf_counter() - t0
    t0 = time.perf_counter()
    plain = np.zeros(dim, dtype=np.float32)  # what a plain FedAvg server does: a running float32 sum
    for c in result.included:
        np.add(plain, vectors[c], out=plain)
    plain_seconds = time.perf_counter() - t0
    exact = np.sum([vectors[c].astype(np.float64) for c in result.included], axis=0)
    server = sum(v for k, v in result.seconds.items() if not k.startswith("client"))
    n = len(params.clients)
    upload = dim * ring_bits // 8 + 64 + (n - 1) * (16 + 2 * shamir.SHARE_BYTES + 16) + n * 2 * shamir.SHARE_BYTES
    return {
        "clients": clients, "dim": dim, "dropout": dropout, "dropout_stage": stage, "dropped": n_drop,
        "threshold": t, "ring_bits": ring_bits, "frac_bits": frac_bits, "server_workers": server_workers,
        "included": len(result.included), "dropped_after_sharing": len(result.dropped_after_sharing),
        "server_seconds": server, "server_seconds_by_stage": {k: v for k, v in result.seconds.items()
                                                             if not k.startswith("client")},
        "client_seconds_max": result.seconds["client_max"], "client_seconds_mean": result.seconds["client_mean"],
        "plain_sum_seconds": plain_seconds, "server_overhead_ratio": server / max(plain_seconds, 1e-9),
        "max_abs_error": float(np.abs(result.total - exact).max()),
        "error_bound": len(result.included) * params.ring.resolution / 2,
        "upload_bytes_per_client": upload, "plain_upload_bytes_per_client": dim * 4,
        "wall_seconds": wall,
    }

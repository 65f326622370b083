"""All parties of one secure-aggregation round in one process, with clients dropping out at chosen stages.

Used by the engine's secure upload stage, the tests and `dpfl bench secagg`. Every message still goes through the
real protocol (key agreement, encrypted shares, masks, reconstruction); only the network is simulated.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping

import numpy as np

from dpfl.algorithms.secure.errors import SecAggConfigError
from dpfl.algorithms.secure.protocol import STAGES, SecAggClient, SecAggParams, SecAggResult, SecAggServer


def secure_sum(vectors: Mapping[int, np.ndarray], params: SecAggParams,
               drop: Mapping[str, Collection[int]] | None = None, server_workers: int = 1) -> SecAggResult:
    """The sum of `vectors` over the clients that survive to upload; `drop[stage]` lists who leaves before `stage`.

    A client listed at a stage sends nothing from that stage on. `result.seconds` holds the server's time per
    stage and `client_max` / `client_mean`, the client time (all four stages) of the slowest and of the mean client.
    """
    drop = {k: set(v) for k, v in (drop or {}).items()}
    unknown = set(drop) - set(STAGES)
    if unknown:
        raise SecAggConfigError(f"unknown dropout stage(s) {sorted(unknown)}; stages are {', '.join(STAGES)}")
    if set(vectors) != set(params.clients):
        raise SecAggConfigError("one vector per selected client is required")
    gone: set[int] = set()
    client_time = dict.fromkeys(params.clients, 0.0)

    def alive(stage: str) -> list[int]:
        gone.update(drop.get(stage, ()))
        return [c for c in params.clients if c not in gone]

    def timed(cid, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        client_time[cid] += time.perf_counter() - t0
        return out

    server = SecAggServer(params, server_workers)
    clients = {c: SecAggClient(c, params) for c in params.clients}
    keys = {c: timed(c, clients[c].advertise_keys) for c in alive("advertise_keys")}
    t0 = time.perf_counter()
    roster = server.collect_keys(keys)
    server.seconds["collect_keys"] = time.perf_counter() - t0
    outboxes = {c: timed(c, clients[c].share_keys, roster) for c in alive("share_keys") if c in roster}
    t0 = time.perf_counter()
    inboxes = server.route_shares(outboxes)
    server.seconds["route_shares"] = time.perf_counter() - t0
    for c in alive("masked_input"):
        if c in inboxes:
            server.receive_masked(c, timed(c, clients[c].masked_input, vectors[c], inboxes[c]))
    uploaded = server.uploaded()
    responses = {c: timed(c, clients[c].unmask, uploaded) for c in alive("unmasking") if c in uploaded}
    result = server.unmask(responses)
    active = [client_time[c] for c in params.clients if client_time[c] > 0]
    result.seconds.update(client_max=max(active), client_mean=sum(active) / len(active))
    return result

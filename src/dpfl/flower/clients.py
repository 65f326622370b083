"""The server's remote clients: `FederatedRun.remote_clients`, answered by SuperNodes over a Flower Grid.

`FederatedRun.local_round` calls `round(run, r, w, ids)`; everything else of the round (selection, ledger,
aggregation, evaluation) stays in the server's FederatedRun. Flower node ids are mapped to dpfl client ids once,
by a query each node answers with its `partition-id` (`discover`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from dpfl.engine import params as P
from dpfl.experiment.federated_run import RemoteRound
from dpfl.flower.arrays import to_record
from dpfl.flower.protocol import NODE, PARTITION_ID

QUERY, TRAIN = "query", "train"


class FederationError(RuntimeError):
    """The SuperNodes did not answer as a dpfl federation must (missing, duplicate or failing clients)."""


def discover(grid: Grid, n_clients: int, timeout: float, reply_timeout: float) -> dict[int, int]:
    """{dpfl client id: Flower node id}, once every client 0..n-1 has a connected node (or FederationError).

    `timeout`: seconds for the SuperNodes to connect; `reply_timeout`: for them to answer the query (a node's first
    answer starts its ClientApp, which imports torch and dpfl: slow on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while len(list(grid.get_node_ids())) < n_clients:
        if time.monotonic() > deadline:
            have = len(list(grid.get_node_ids()))
            raise FederationError(f"{have} SuperNodes connected in {timeout:g} s, the run has {n_clients} clients")
        time.sleep(0.5)
    nodes = list(grid.get_node_ids())
    messages = [Message(RecordDict(), dst_node_id=n, message_type=QUERY, group_id="dpfl-discover") for n in nodes]
    replies = list(grid.send_and_receive(messages, timeout=reply_timeout))
    if len(replies) < len(nodes):
        raise FederationError(f"{len(replies)} of {len(nodes)} SuperNodes answered the partition-id query in "
                              f"{reply_timeout:g} s (run config `timeout`)")
    found: dict[int, int] = {}
    for reply in replies:
        node = reply.metadata.src_node_id
        if reply.has_error():
            raise FederationError(f"node {node} could not say its partition-id: {error_text(reply)}")
        pid = int(reply.content[NODE][PARTITION_ID])
        if pid in found:
            raise FederationError(f"nodes {found[pid]} and {node} both hold partition-id {pid}")
        found[pid] = node
    missing = [i for i in range(n_clients) if i not in found]
    if missing:
        raise FederationError(f"no SuperNode holds partition-id {missing[:10]} "
                              f"(the run has clients 0..{n_clients - 1})")
    return {i: found[i] for i in range(n_clients)}


class FlowerClients:
    """Remote clients reached through `strategy` (which writes the train messages and reads the replies) and `grid`."""

    def __init__(self, strategy: Any, grid: Grid, nodes: Mapping[int, int], timeout: float) -> None:
        self.strategy, self.grid, self.nodes, self.timeout = strategy, grid, dict(nodes), timeout
        self.seconds: list[float] = []  # wall-clock time of each round's message exchange (nodes' training included)

    def round(self, run: Any, r: int, w: P.Params, ids: list[int]) -> RemoteRound:
        t0 = time.perf_counter()
        self.strategy.plan_round(run, r, ids, self.nodes)
        messages = list(self.strategy.configure_train(r + 1, to_record(w), ConfigRecord(), self.grid))
        replies = list(self.grid.send_and_receive(messages, timeout=self.timeout))
        self.strategy.aggregate_train(r + 1, replies)
        received = self.strategy.received(w)
        self.seconds.append(time.perf_counter() - t0)
        return received


def error_text(reply: Message) -> str:
    reason = " ".join(str(reply.error.reason).split())
    return reason[-300:] if reason else f"error code {reply.error.code}"

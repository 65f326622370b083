"""The server's remote clients: `FederatedRun.remote_clients`, answered by SuperNodes over a Flower Grid.

`FederatedRun.local_round` calls `round(run, r, w, ids)`; everything else of the round (selection, ledger,
aggregation, evaluation) stays in the server's FederatedRun. Flower node ids are mapped to dpfl client ids once,
by a query each node answers with its `partition-id` and, having loaded its records for the run's config, their
count (`discover`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from dpfl.engine import params as P
from dpfl.experiment.federated_run import RemoteRound
from dpfl.flower.arrays import to_record
from dpfl.flower.protocol import CONFIG, NODE, PARTITION_ID, RECORDS, YAML

QUERY, TRAIN = "query", "train"


class FederationError(RuntimeError):
    """The SuperNodes did not answer as a dpfl federation must (missing, duplicate or failing clients)."""


@dataclass(frozen=True)
class Discovered:
    """The federation's clients: {dpfl client id: Flower node id}, and the training-record count each node reported
    (None from a node that was not sent the config)."""

    nodes: dict[int, int]
    records: dict[int, int | None]


def discover(grid: Grid, n_clients: int, timeout: float, reply_timeout: float,
             say: Callable[[str], None] = lambda line: None, poll: float = 0.5,
             note_every: float = 10.0, config_yaml: str = "") -> Discovered:
    """The node of every client 0..n-1, once each has connected (or FederationError).

    Each node is asked its partition-id as soon as it connects (with `config_yaml`, the run's config: the node loads
    and checks its records for it and says how many it holds), so a node that cannot take part (an error, its data
    refused, a partition-id outside 0..n-1, one another node already holds) stops the run at once, with the reason;
    a client whose node has not connected after `timeout` seconds stops it with the partition-ids still missing.
    `say` gets a progress line every `note_every` seconds while nodes are missing (the ServerApp's log: `flwr run
    --stream`). `reply_timeout`: seconds for a node to answer the query (its first answer starts its ClientApp,
    which imports torch and dpfl and reads its records: slow on a loaded machine)."""
    start = time.monotonic()
    deadline, next_note = start + timeout, start
    found: dict[int, tuple[int, int | None]] = {}  # partition-id -> (node, records)
    asked: set[int] = set()
    while True:
        new = [n for n in grid.get_node_ids() if n not in asked]
        if new:
            asked.update(new)
            for pid, node, records in _ask_partitions(grid, new, n_clients, reply_timeout, config_yaml):
                if pid in found:
                    raise FederationError(f"nodes {found[pid][0]} and {node} both hold partition-id {pid}: start "
                                          "each SuperNode with its own --node-config 'partition-id=K'")
                found[pid] = (node, records)
        missing = [i for i in range(n_clients) if i not in found]
        if not missing:
            return Discovered({i: found[i][0] for i in range(n_clients)}, {i: found[i][1] for i in range(n_clients)})
        now = time.monotonic()
        if now >= deadline:
            raise FederationError(
                f"{len(found)} of {n_clients} SuperNodes connected in {timeout:g} s: no SuperNode holds "
                f"partition-id {_ids(missing)} (the run has clients 0..{n_clients - 1}: start one SuperNode per client "
                "with --node-config 'partition-id=K', or give the run config `nodes` the number started; run config "
                "`node-timeout` is the wait)")
        if now >= next_note:
            say(f"waiting for SuperNodes: {len(found)} of {n_clients} connected, missing partition-id "
                f"{_ids(missing)}; the run fails if they have not connected in {deadline - now:.0f} s")
            next_note = now + note_every
        time.sleep(poll)


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:10])) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")


def _ask_partitions(grid: Grid, nodes: list[int], n_clients: int, reply_timeout: float,
                    config_yaml: str = "") -> list[tuple[int, int, int | None]]:
    """(partition-id, node, records) of each of `nodes`, its partition-id checked to be a client of the run
    (0..n_clients-1); `discover` checks that no two nodes hold the same one."""
    content = {CONFIG: ConfigRecord({YAML: config_yaml})} if config_yaml else {}
    messages = [Message(RecordDict(content), dst_node_id=n, message_type=QUERY, group_id="dpfl-discover")
                for n in nodes]
    replies = list(grid.send_and_receive(messages, timeout=reply_timeout))
    if len(replies) < len(nodes):
        raise FederationError(f"{len(replies)} of {len(nodes)} SuperNodes answered the partition-id query in "
                              f"{reply_timeout:g} s (run config `timeout`)")
    found: list[tuple[int, int, int | None]] = []
    for reply in replies:
        node = reply.metadata.src_node_id
        if reply.has_error():
            raise FederationError(f"node {node} cannot take part: {error_text(reply)}")
        answer = reply.content[NODE]
        pid = int(answer[PARTITION_ID])
        if not 0 <= pid < n_clients:
            raise FederationError(f"node {node} holds partition-id {pid}, but the run has clients 0..{n_clients - 1} "
                                  "(run config `nodes` or the config's data.clients)")
        found.append((pid, node, int(answer[RECORDS]) if RECORDS in answer else None))
    return found


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

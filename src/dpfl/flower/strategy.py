"""DpflStrategy: a Flower Strategy whose rounds are dpfl's FederatedRun, with the clients on SuperNodes.

`start(grid)` builds the run from the config exactly as `dpfl run` does (data split, model, budgets, noise
calibration), maps SuperNodes to clients, and executes it into a run directory with `run_directory.execute`. With
the user's own files (data.silos) the server reads no silo: it first asks every node for its record count (each
node reads and checks its own silo), then builds the run on those counts and the shared test file. The run
directory holds config.yaml, metrics.jsonl, privacy.json (from `FederatedRun.privacy_summary`, plus a `flower`
block), summary.json.
Per round, the FederatedRun selects, checks and records the ledger, then asks `FlowerClients` for the uploads:
`configure_train` writes one train message per selected client, `aggregate_train` reads the replies (the
aggregation itself is the run's dpfl aggregator). No evaluation messages: the server evaluates on the test set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import version
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from dpfl.engine import params as P
from dpfl.experiment.config import RunConfig, config_to_yaml
from dpfl.experiment.federated_run import FederatedRun, RemoteRound
from dpfl.flower.arrays import from_record, to_record
from dpfl.flower.clients import TRAIN, FederationError, FlowerClients, discover, error_text
from dpfl.flower.protocol import (FACTS, GLOBAL, NODE_SILOS_NOTE, PLAN, SECRET_SEED_NOTE, SERVER_DATA_NOTE,
                                  SHARED_SEED_NOTE, UPLOAD, TrainPlan, unsupported)


class DpflStrategy(Strategy):
    """dpfl's aggregator, selection and per-client ledger as a Flower Strategy (see the module docstring).

    shared_seed: send the run seed to the nodes so that they draw the simulation's batches and noise (testing
    equivalence only: the server then knows the clients' noise; privacy.json says so). Default: each node uses its
    own secret seed. timeout: seconds to wait for a round's replies; node_timeout: for the SuperNodes to connect.
    say: where the progress lines go (default: Flower's log, which the ServerApp mirrors to `flwr run --stream`).
    """

    def __init__(self, cfg: RunConfig, out: Path, *, shared_seed: bool = False, timeout: float = 300.0,
                 node_timeout: float = 60.0, say: Callable[[str], None] | None = None) -> None:
        self.cfg, self.out, self.shared_seed = cfg, Path(out), shared_seed
        self.timeout, self.node_timeout = timeout, node_timeout
        self.say = say or (lambda line: log(INFO, "dpfl: %s", line))
        self.claimed = False  # `out` is this run's (it was free when the run started): a failure note may go there
        self.config_yaml = config_to_yaml(cfg)
        self.run: FederatedRun | None = None
        self.clients: FlowerClients | None = None
        self._pending: list[tuple[int, TrainPlan]] = []
        self._received: tuple[list[P.Params], list[int], list[float | None]] | None = None

    # ---- the run ------------------------------------------------------------------------------------
    @property
    def silos_on_nodes(self) -> bool:
        """The run reads the user's own files (data.silos): each node holds its own, the server none."""
        from dpfl.data.silos import FILES

        return self.cfg.data.dataset == FILES

    def build(self, records: Mapping[int, int | None] | None = None) -> FederatedRun:
        """The server's FederatedRun (calibrated); refuses what a Flower federation cannot run (one line).
        `records`: each client's record count as its node reported it (the user's own files: the server has no
        other way to know it)."""
        from dpfl.experiment.build import build_run, build_run_on_nodes

        if self.silos_on_nodes:
            counts = [None if records is None else records.get(i) for i in range(self.cfg.data.clients)]
            if None in counts:
                raise FederationError("the nodes did not report their record counts (a dpfl older than the server's "
                                      "on a node?)")
            run = build_run_on_nodes(self.cfg, [int(n) for n in counts])  # type: ignore[arg-type]
        else:
            run = build_run(self.cfg)
        why = unsupported(run)
        if why is not None:
            raise ValueError(f"algorithm {run.algorithm.name!r} cannot run on Flower: {why}")
        base = run.privacy_summary

        def privacy_summary(*args: Any, **kwargs: Any) -> dict[str, Any]:
            out = base(*args, **kwargs)
            out["flower"] = self.describe()
            return out

        run.privacy_summary = privacy_summary  # type: ignore[method-assign]
        return run

    def describe(self) -> dict[str, Any]:
        """The `flower` block of privacy.json: how this federation ran and what the server knew."""
        return {"runtime": "flower", "flwr_version": version("flwr"),
                "nodes": len(self.clients.nodes) if self.clients is not None else None,
                "shared_seed": self.shared_seed, "seeds": SHARED_SEED_NOTE if self.shared_seed else SECRET_SEED_NOTE,
                "server_data": NODE_SILOS_NOTE if self.silos_on_nodes else SERVER_DATA_NOTE}

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn: Any = None) -> Result:
        """Run the configured dpfl run over `grid` into `self.out`; the Flower arguments are fixed by the config
        (initial model, rounds) and refused if they differ."""
        from dpfl.experiment.run_directory import CHECKPOINT, execute, is_occupied, load_checkpoint
        from dpfl.flower.verdict import clear_failure, only_failed_attempts

        if initial_arrays is not None or evaluate_fn is not None or train_config or evaluate_config:
            raise ValueError("DpflStrategy takes its model, rounds and evaluation from the dpfl config")
        if num_rounds is not None and num_rounds != self.cfg.training.rounds:
            raise ValueError(f"num_rounds {num_rounds} differs from the config's training.rounds "
                             f"{self.cfg.training.rounds}")
        if timeout is not None:
            self.timeout = timeout
        if only_failed_attempts(self.out):
            clear_failure(self.out)  # an earlier attempt here failed before it wrote anything: try again
        if is_occupied(self.out):  # checked before nodes are asked; `execute` checks again under the lock
            raise ValueError(f"{self.out} already exists and is not empty (choose another run config `out`)")
        self.claimed = True
        cfg = self.cfg
        self.say(f"run {cfg.name!r} ({cfg.algorithm.name}): {cfg.data.clients} clients, one SuperNode each "
                 f"(partition-id 0..{cfg.data.clients - 1}), {cfg.training.rounds} rounds; run directory {self.out}")
        if not self.silos_on_nodes:  # a refusal before any node is waited for
            self.run = self.build()
        found = discover(grid, cfg.data.clients, self.node_timeout, self.timeout, say=self.say,
                         config_yaml=self.config_yaml)
        nodes = found.nodes
        self.say(f"all {len(nodes)} SuperNodes connected: " + ", ".join(
            f"client {i} = node {n}" + (f" ({found.records[i]} records)" if found.records[i] is not None else "")
            for i, n in list(nodes.items())[:10]) + (" ..." if len(nodes) > 10 else ""))
        run = self.run = self.run or self.build(found.records)
        self.clients = run.remote_clients = FlowerClients(self, grid, nodes, self.timeout)
        result = Result()
        started = [time.monotonic()]

        def on_round(row: dict[str, Any]) -> None:
            metrics = {k: float(row[k]) for k in ("test_accuracy", "test_loss", "epsilon_max")
                       if row.get(k) is not None}
            if metrics:
                result.evaluate_metrics_serverapp[row["round"]] = MetricRecord(metrics)
            now = time.monotonic()
            parts = [f"round {row['round']}/{cfg.training.rounds}"]
            if row.get("test_accuracy") is not None:
                parts.append(f"test accuracy {row['test_accuracy']:.3f}")
            if row.get("epsilon_max") is not None:
                parts.append(f"epsilon max {row['epsilon_max']:.3g}")
            self.say(", ".join(parts) + f" ({now - started[0]:.1f} s)")
            started[0] = now

        summary = execute(self.cfg, self.out, build=lambda: run, on_round=on_round)
        result.arrays = to_record(load_checkpoint(self.out / CHECKPOINT)["params"])
        final = summary.get("final_accuracy")
        self.say(f"finished: {summary['rounds_done']} rounds (stop: {summary['stop_reason']})"
                 + (f", final accuracy {final:.3f}" if final is not None else "")
                 + (f", epsilon max {summary['epsilon_max']:.3g}" if summary.get("epsilon_max") is not None else "")
                 + f"; run directory {self.out} (privacy report: dpfl flower check {self.out})")
        return result

    # ---- one round's messages -----------------------------------------------------------------------
    def plan_round(self, run: FederatedRun, r: int, ids: list[int], nodes: Mapping[int, int]) -> None:
        """What each selected client runs in round r (0-based); `configure_train` sends it."""
        upload = run.algorithm.upload
        upload_noise = upload.noise
        self._pending = [
            (nodes[i], TrainPlan(round=r, client=i, records=int(run.n_records[i]), batch_size=int(run.batch_sizes[i]),
                                 noise_multiplier=float(run.noise[i]),
                                 upload_noise=-1.0 if upload_noise is None else float(upload_noise),
                                 seed=run.seed if self.shared_seed else -1, max_elements=int(run.max_elements),
                                 config_yaml=self.config_yaml))
            for i in ids]

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return [Message(RecordDict({GLOBAL: arrays, PLAN: ConfigRecord(plan.to_config())}), dst_node_id=node,
                        message_type=TRAIN, group_id=str(server_round))
                for node, plan in self._pending]

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Read the selected clients' uploads (in the order planned); the dpfl aggregator aggregates them in the
        FederatedRun, so no new model is returned here."""
        by_node = {m.metadata.src_node_id: m for m in replies}
        uploads, steps, noise = [], [], []
        for node, plan in self._pending:
            reply = by_node.get(node)
            if reply is None:
                raise FederationError(f"round {server_round}: client {plan.client} (node {node}) did not answer in "
                                      f"{self.timeout:g} s")
            if reply.has_error():
                raise FederationError(f"round {server_round}: client {plan.client} failed: {error_text(reply)}")
            uploads.append(reply.content[UPLOAD])
            facts = reply.content[FACTS]
            steps.append(int(facts["steps"]))
            noise.append(float(facts["noise-sq-norm"]) if "noise-sq-norm" in facts else None)
        self._received = (uploads, steps, noise)
        return None, MetricRecord({"clients": len(uploads), "steps_mean": float(np.mean(steps)) if steps else 0.0})

    def received(self, w: P.Params) -> RemoteRound:
        """The last round's uploads stacked `[K, ...]` (checked against the model's names, shapes, dtypes)."""
        assert self._received is not None
        uploads, steps, noise = self._received
        rows = [from_record(u, w) for u in uploads]
        stacked = {n: torch.stack([row[n] for row in rows]) for n in w}
        return RemoteRound(stacked, steps, None if None in noise else noise)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return []  # the server evaluates the global model on the test set (FederatedRun)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        pass

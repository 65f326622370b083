"""The cohort sharded across Ray actors, each training its shard with the vectorised engine.

Each actor receives the model and every client's records once, when it starts (through Ray's object store);
each round the start model is put in the store once and every actor reads it from there. Shards are dealt by
cost (records a client processes: steps x batch size) so the actors finish together, and the results are put
back in plan order. Every client's batches and noise are keyed by (seed, round, client), so the round's
result does not depend on how the cohort is sharded (tests/engine/test_ray_backend.py checks it bit for bit).

Devices: with `gpus` > 0 every actor asks Ray for that many GPUs (a fraction shares one) and trains its shards on
the GPU Ray gives it; otherwise on its CPUs, whatever the run's device. Everything crosses the object store on the
CPU (the model, the records, the start model and the results), so a driver on a GPU and actors on CPUs, or the
reverse, exchange plain tensors; the merged result is moved to the device of the start model.

An actor that dies mid-round (its process or node lost) is replaced and its shard retried once; a second
failure raises `BackendError` and the round is not applied, so a run directory keeps its last checkpoint and
resumes. An error inside the local program (a bad plan, say) is the program's error, raised as it would be
in process, never retried.

A Ray that this backend starts (no `address`) stays on the machine: its node address is 127.0.0.1, so every
server it starts (GCS, raylet, workers) listens on the loopback interface only, no dashboard, and Ray's usage
statistics are off (unless RAY_USAGE_STATS_ENABLED=1 says otherwise). It is always a new Ray: Ray's own lookup
(RAY_ADDRESS, or the last `ray start` on the machine) would join another cluster while the run said it started
its own; joining is `address`'s job. `describe()` says what a run used.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from dpfl.engine import params as P
from dpfl.engine.backends.errors import BackendError
from dpfl.engine.local_training import ClientPlan, LocalResult, LocalSpec, merge_groups, run_local
from dpfl.engine.pooled import PooledData

INSTALL_HINT = "pip install 'dpfl[ray]'"
START_TIMEOUT_S = 300.0  # an actor that has not started by then will not (no free CPU in the cluster, say)
LOOPBACK = "127.0.0.1"
USAGE_STATS_ENV = "RAY_USAGE_STATS_ENABLED"  # Ray's own switch: "0" off, "1" on
CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray takes the loopback address as the node's (see below)


def import_ray() -> Any:
    """The ray module, or one clear line naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise BackendError(f"backend 'ray' needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def deal(plans: Sequence[ClientPlan], shards: int) -> list[list[int]]:
    """Plan indices per shard, heaviest client first to the least loaded shard (no empty shard is returned)."""
    loads = [0] * shards
    out: list[list[int]] = [[] for _ in range(shards)]
    for i in sorted(range(len(plans)), key=lambda i: -(plans[i].steps * plans[i].batch_size)):
        s = min(range(shards), key=lambda s: (loads[s], s))
        out[s].append(i)
        loads[s] += max(1, plans[i].steps * plans[i].batch_size)
    return [sorted(rows) for rows in out if rows]


@contextmanager
def machine_only() -> Iterator[None]:
    """While a local Ray starts: its node address is 127.0.0.1 and usage statistics are off by default.

    On Linux, Ray turns a node address 127.0.0.1 into the machine's network address (so that other machines may
    join) and binds its gRPC servers there; with clusters switched off (Ray's CLUSTER_ENV, which it reads once
    into `ray_constants.ENABLE_RAY_CLUSTER`) it keeps the loopback address. Both are set only while `ray.init`
    starts the processes (they inherit the environment) and restored after, so that a later `ray.init(address=...)`
    in this process still finds the machine's address."""
    try:  # Ray's own module: where a Ray release moved it, the environment alone (read when Ray is imported) says it
        from ray._private import ray_constants as constants
    except ImportError:
        constants = None
    saved_flag = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    saved_env = os.environ.get(CLUSTER_ENV)
    if os.environ.get(USAGE_STATS_ENV) != "1":  # an explicit opt-in is the user's; otherwise off
        os.environ[USAGE_STATS_ENV] = "0"
    os.environ[CLUSTER_ENV] = "0"
    if saved_flag is not None:
        constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved_flag is not None:
            constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(CLUSTER_ENV, None)
        else:
            os.environ[CLUSTER_ENV] = saved_env


class ShardWorker:
    """One actor: the model and the records, kept for the whole run on its device (its GPU when it has one);
    trains whatever shard it is given and returns the result on the CPU."""

    def __init__(self, model: nn.Module, data: PooledData, threads: int, gpu: bool = False) -> None:
        torch.set_num_threads(threads)
        self.device = torch.device("cuda" if gpu else "cpu")  # Ray shows an actor only the GPUs it was given
        self.model, self.data = model.to(self.device), data.to(self.device)

    def ready(self) -> int:
        return os.getpid()

    def train(self, spec: LocalSpec, plans: Sequence[ClientPlan], start: Mapping[str, torch.Tensor], seed: int,
              round_: int, stacked_start: bool, max_elements: int,
              anchor: Mapping[str, torch.Tensor] | None) -> LocalResult:
        res = run_local(self.model, spec, plans, self.data, start, seed=seed, round_=round_,
                        stacked_start=stacked_start, max_elements=max_elements, anchor=anchor)
        return res if self.device.type == "cpu" else replace(res, params=P.to_device(res.params, "cpu"))


def _usage_stats() -> bool:
    """Whether this Ray reports usage statistics (Ray's own answer; the environment's where Ray moved it)."""
    try:
        from ray._common.usage.usage_lib import usage_stats_enabled
    except ImportError:
        return os.environ.get(USAGE_STATS_ENV) == "1"
    return bool(usage_stats_enabled())


def _on_cpu(model: nn.Module) -> bool:
    return all(t.device.type == "cpu" for t in [*model.parameters(), *model.buffers()])


def has_dropout(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())


class RayBackend:
    """`actors` Ray actors with `threads` torch threads and `gpus` GPUs each, on `address` (None: a Ray instance on
    this machine).

    Ray is started on first use (or the running instance is used) and stopped by `close` only if this backend
    started it.
    """

    name = "ray"

    def __init__(self, *, actors: int = 2, threads: int = 1, address: str | None = None, gpus: float = 0.0) -> None:
        if actors < 1 or threads < 1:
            raise ValueError(f"actors and threads must be >= 1, got {actors} and {threads}")
        if not gpus >= 0:
            raise ValueError(f"gpus must be >= 0, got {gpus}")
        self.n_actors, self.threads, self.address, self.gpus = actors, threads, address, float(gpus)
        self.actors: list[Any] = []
        self.retries = 0  # shards retried after an actor died (reported by benchmarks and tests)
        self._owned_ray = False
        self._bound: tuple[int, int] | None = None  # ids of the model and data the actors hold
        self._refs: tuple[Any, Any] | None = None
        self.started: dict[str, Any] | None = None  # where the Ray this backend used ran (describe)

    # ---- lifecycle ---------------------------------------------------------------------------
    def _start_ray(self) -> Any:
        ray = import_ray()
        if not ray.is_initialized():
            need = self.n_actors * self.threads
            with warnings.catch_warnings():  # Ray's notices about GPUs and future defaults
                warnings.simplefilter("ignore", FutureWarning)
                if self.address:
                    ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
                else:
                    with machine_only():
                        ray.init(address="local", num_cpus=max(need, os.cpu_count() or 1), include_dashboard=False,
                                 _node_ip_address=LOOPBACK, logging_level="ERROR", log_to_driver=False)
            self._owned_ray = True
            self.started = {"ray": "started" if not self.address else "joined", "address": self.address,
                            "node_address": ray.util.get_node_ip_address(), "usage_stats": _usage_stats()}
        elif self.started is None:
            self.started = {"ray": "running", "address": None, "node_address": ray.util.get_node_ip_address(),
                            "usage_stats": _usage_stats()}
        available = ray.cluster_resources().get("CPU", 0)
        if available < self.n_actors * self.threads:
            raise BackendError(f"backend 'ray': {self.n_actors} actors x {self.threads} threads need "
                               f"{self.n_actors * self.threads} CPUs; the Ray cluster has {available:g}")
        gpus = ray.cluster_resources().get("GPU", 0)
        if self.gpus and gpus < self.n_actors * self.gpus:
            raise BackendError(f"backend 'ray': {self.n_actors} actors x {self.gpus:g} GPUs (ray.gpus_per_actor) need "
                               f"{self.n_actors * self.gpus:g} GPUs; the Ray cluster has {gpus:g}")
        return ray

    def describe(self) -> dict[str, Any]:
        """What the run used (summary.json `backend`): actors, threads, and the Ray it ran on (None before the
        first round started Ray): `ray` "started" (by this backend, on this machine), "joined" (`address`) or
        "running" (a Ray this process had started), its `node_address`, whether usage statistics were on."""
        gpus = {"gpus_per_actor": self.gpus} if self.gpus else {}  # absent on CPUs: summaries as before
        return {"name": self.name, "actors": self.n_actors, "threads_per_actor": self.threads, **gpus,
                "actor_restarts": self.retries, **(self.started or {"ray": None})}

    def _spawn(self) -> Any:
        ray = import_ray()
        assert self._refs is not None
        return (ray.remote(num_cpus=self.threads, num_gpus=self.gpus)(ShardWorker)
                .remote(*self._refs, self.threads, self.gpus > 0))

    def _bind(self, model: nn.Module, data: PooledData) -> None:
        """Start the actors with this model and these records (again, if the run gave others)."""
        if self._bound == (id(model), id(data)) and self.actors:
            return
        if has_dropout(model):
            raise BackendError("backend 'ray' cannot shard a model with dropout: its masks are drawn for the whole "
                               "cohort at once, so a shard would draw others; use backend 'local'")
        ray = self._start_ray()
        self._kill_actors()
        # through the object store on the CPU: an actor unpickles CPU tensors and moves them to its own device
        on_cpu = model if _on_cpu(model) else copy.deepcopy(model).to("cpu")
        self._refs = (ray.put(on_cpu), ray.put(data.to("cpu")))
        self.actors = [self._spawn() for _ in range(self.n_actors)]
        try:
            ray.get([a.ready.remote() for a in self.actors], timeout=START_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 -- any start failure is the backend's, said in one line
            self.close()
            raise BackendError(f"backend 'ray': the actors did not start within {START_TIMEOUT_S:g} s "
                               f"({err})") from None
        self._bound = (id(model), id(data))

    def _kill_actors(self) -> None:
        if not self.actors:
            return
        ray = import_ray()
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001, S110 -- already gone
                pass
        self.actors = []

    def close(self) -> None:
        """Stop the actors (and Ray, if this backend started it); a later `train` starts them again."""
        self._kill_actors()
        self._bound, self._refs = None, None
        if self._owned_ray:
            import_ray().shutdown()
            self._owned_ray = False

    # ---- one round ---------------------------------------------------------------------------
    def train(self, model: nn.Module, spec: LocalSpec, plans: Sequence[ClientPlan], data: PooledData,
              start: Mapping[str, torch.Tensor], *, seed: int, round_: int, stacked_start: bool,
              max_elements: int, anchor: Mapping[str, torch.Tensor] | None) -> LocalResult:
        if not plans:
            raise ValueError("no clients to train")
        self._bind(model, data)
        ray = import_ray()
        shards = deal(plans, len(self.actors))
        device = next(iter(start.values())).device  # where the run keeps its models, and gets the result
        start = P.to_device(start, "cpu")
        shared = None if stacked_start else ray.put(dict(start))  # one broadcast per round, read by every actor
        anchor_ref = ray.put(P.to_device(anchor, "cpu")) if anchor is not None else None

        def submit(j: int) -> Any:
            rows = shards[j]
            begin = ray.put(P.select(start, torch.tensor(rows))) if stacked_start else shared
            return self.actors[j].train.remote(spec, [plans[i] for i in rows], begin, seed, round_, stacked_start,
                                               max_elements, anchor_ref)

        pending = [submit(j) for j in range(len(shards))]
        results = [self._collect(j, ref, submit, round_) for j, ref in enumerate(pending)]
        merged = merge_groups(len(plans), shards, results)
        return merged if device.type == "cpu" else replace(merged, params=P.to_device(merged.params, device))

    def _collect(self, j: int, ref: Any, submit: Any, round_: int) -> LocalResult:
        """Shard j's result; if its actor died, a new actor retries it once."""
        ray = import_ray()
        for attempt in (0, 1):
            try:
                return ray.get(ref)
            except ray.exceptions.RayTaskError as err:  # the local program raised: its own error, not retried
                raise err.as_instanceof_cause() from None
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                    ray.exceptions.ObjectLostError) as err:
                if attempt == 1:
                    raise BackendError(f"round {round_ + 1}: shard {j} failed twice (its actor died: "
                                       f"{type(err).__name__}); the round was not applied") from None
                self.retries += 1
                self.actors[j] = self._spawn()
                ref = submit(j)
        raise AssertionError("unreachable")  # pragma: no cover


"""The ClientApp: one SuperNode = one dpfl client, which trains on its own records and returns its upload.

`client_upload` is the whole computation (testable without Flower's runtime); it repeats the clients' side of
`FederatedRun.local_round` for one client: the local program's `run` with the client's plan keyed by its run-wide
id (its update `end - w`), then the upload stage (`alg.upload.apply`). With the run seed (shared-seed, testing
only) the node draws exactly the batches and noise the simulation draws for that client; by default it draws them
from its own secret seed (node config `seed`, else `secrets.randbits`), which the server never learns.

A node's records: with a config that reads the user's own files (data.silos), the node reads only its own silo,
the file or folder its node config names (`silo=PATH`), and checks it against the config's declared schema (no one
else can: no one sees two silos); the config's own list of silo paths is never read on a node. With one of dpfl's
datasets (a demo), the node derives its partition from the public dataset (`build_data`, then client
`partition-id` of the split).

A node trains on its own device: its node config `device` (cpu, cuda, cuda:N), else the run config's `device`,
checked on the node (a node without that GPU says so in one line). The global model arrives and the upload leaves
as CPU arrays; the model and the node's records stay on its device for the run.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, replace
from typing import Any

import torch
import yaml
from torch import nn

from dpfl.flower import require_flwr

require_flwr()

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402

from dpfl.engine import params as P  # noqa: E402
from dpfl.engine.backends.local import LocalBackend  # noqa: E402
from dpfl.engine.pooled import PooledData  # noqa: E402
from dpfl.algorithms.stages import LocalInputs  # noqa: E402
from dpfl.flower.arrays import from_record, to_record  # noqa: E402
from dpfl.flower.protocol import (CONFIG, DEVICE, FACTS, GLOBAL, NODE, PARTITION_ID, PLAN, RECORDS,  # noqa: E402
                                  SILO, UPLOAD, YAML, TrainPlan)


@dataclass
class ClientSide:
    """What a node builds once per config: the local program and upload stage, the model, its own records (the
    model and the records on the node's device)."""

    algorithm: Any
    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    device: torch.device = torch.device("cpu")


_BUILT: dict[tuple[str, int, str | None, str | None], ClientSide] = {}
_SECRET_SEED: list[int] = []


def client_side(config_yaml: str, partition: int, silo: str | None = None, device: str | None = None) -> ClientSide:
    """The node's algorithm, model and records for `config_yaml` (cached per config, partition, silo and device).

    `silo`: the node's own file or folder (node config `silo`), required when the config reads the user's own
    files and refused otherwise. `device`: where this node trains (node config `device`; None: the config's).
    Raises one line naming the problem (a `DataError` names the file and the row or column)."""
    key = (hashlib.sha256(config_yaml.encode()).hexdigest(), partition, silo, device)
    if key not in _BUILT:
        from dpfl.data.silos import FILES
        from dpfl.experiment.build import build_algorithm, build_data, build_silo_client
        from dpfl.experiment.config import validate_config
        from dpfl.models import build_model

        raw = yaml.safe_load(config_yaml)
        if device is not None and isinstance(raw, dict):  # the node's own device, checked on this node
            raw = {**raw, "device": device}
        cfg = validate_config(raw)
        if not 0 <= partition < cfg.data.clients:
            raise ValueError(f"partition-id {partition} is not a client of this config (0..{cfg.data.clients - 1})")
        if cfg.data.dataset == FILES:
            if not silo:
                raise ValueError("this run reads each client's own files: start the SuperNode with --node-config "
                                 f"'{PARTITION_ID}={partition} {SILO}=\"PATH\"' (PATH: this node's file or folder, "
                                 "in the config's data.schema)")
            own = build_silo_client(cfg, partition, silo)
            shape, n_classes = tuple(own.x_train.shape[1:]), cfg.data.schema_.n_classes
        else:
            if silo:
                raise ValueError(f"node config {SILO}={silo!r}, but the run's data is dataset "
                                 f"{cfg.data.dataset!r}, split by dpfl (data.silos names the user's own files)")
            data = build_data(cfg)  # demo: the split of a public dataset
            own, shape, n_classes = data.clients[partition], tuple(data.input_shape), data.n_classes
        model = build_model(cfg.model.name, shape, n_classes, seed=cfg.seed, **cfg.model.options)
        algorithm = build_algorithm(cfg, model)  # from the model as built (on the CPU)
        at = torch.device(cfg.device)
        _BUILT.clear()  # one run at a time per node process
        _BUILT[key] = ClientSide(algorithm, model.to(at), own.x_train.to(at), own.y_train.to(at), at)
    return _BUILT[key]


def node_silo(node_config: Any) -> str | None:
    """The node's own silo path (node config `silo`), or None."""
    value = node_config.get(SILO) if hasattr(node_config, "get") else None
    return str(value) if value not in (None, "") else None


def node_device(node_config: Any) -> str | None:
    """The node's own device (node config `device`), or None (the run config's)."""
    value = node_config.get(DEVICE) if hasattr(node_config, "get") else None
    return str(value) if value not in (None, "") else None


def node_seed(node_config: Any) -> int:
    """The node's secret seed: node config `seed`, else one random draw per process (never sent to the server)."""
    if "seed" in node_config:
        return int(node_config["seed"])
    if not _SECRET_SEED:
        _SECRET_SEED.append(secrets.randbits(62))
    return _SECRET_SEED[0]


def client_upload(side: ClientSide, plan: TrainPlan, w: P.Params, seed: int) -> tuple[P.Params, int, float]:
    """Client `plan.client`'s upload `[1, ...]` for round `plan.round` from the global model `w`, its local steps
    and its DP-SGD noise norm; exactly `FederatedRun.local_round`'s row for that client when `seed` is the run's
    (on the same device). `w` may be on the CPU: it is moved to the node's device; the upload is on that device."""
    if len(side.x) != plan.records:
        raise ValueError(f"client {plan.client} holds {len(side.x)} records, the server calibrated for {plan.records}")
    alg, cid, r = side.algorithm, plan.client, plan.round
    upload_stage = alg.upload.with_noise(plan.upload_noise) if plan.upload_noise >= 0 else alg.upload
    own = PooledData.from_clients([side.x], [side.y])  # on the node's device, as its records are
    w = P.to_device(w, side.device)
    out = alg.local.run(LocalInputs(
        [cid], w, False, seed, r, w, own, model=side.model, backend=LocalBackend(), max_elements=plan.max_elements,
        plans_for=lambda phase: [replace(phase.plan(cid, plan.records, plan.batch_size, plan.noise_multiplier, r),
                                         client=0, key=cid)]))
    upload = upload_stage.apply(out.updates, [cid], seed, r)
    return upload, int(out.steps[0]), float(out.noise_sq_norm[0])


def client_app(shared_seed: bool | None = None) -> ClientApp:
    """A ClientApp; `shared_seed` (default: the run config's `shared-seed`, false) lets the node accept the run seed
    from the server (testing equivalence only)."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        if PARTITION_ID not in context.node_config:
            raise ValueError("start the SuperNode with --node-config 'partition-id=<its dpfl client id>'")
        pid = int(context.node_config[PARTITION_ID])
        answer: dict[str, Any] = {PARTITION_ID: pid}
        if CONFIG in msg.content:  # load (and check) this node's records now: a problem stops the run before round 1
            side = client_side(str(msg.content[CONFIG][YAML]), pid, node_silo(context.node_config),
                               node_device(context.node_config))
            answer[RECORDS] = len(side.x)
        return Message(RecordDict({NODE: ConfigRecord(answer)}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        plan = TrainPlan.from_config(msg.content[PLAN])
        pid = int(context.node_config[PARTITION_ID])
        if plan.client != pid:
            raise ValueError(f"this node holds client {pid}'s records, the server asked for client {plan.client}")
        allowed = shared_seed if shared_seed is not None else bool(context.run_config.get("shared-seed", False))
        if plan.seed >= 0 and not allowed:
            raise ValueError("the server sent a seed but this run does not share seeds (run config shared-seed)")
        seed = plan.seed if plan.seed >= 0 else node_seed(context.node_config)
        side = client_side(plan.config_yaml, pid, node_silo(context.node_config), node_device(context.node_config))
        w = from_record(msg.content[GLOBAL], P.model_params(side.model))
        upload, steps, noise_sq = client_upload(side, plan, w, seed)
        # the norm of a secret noise stays on the node: only with the run's seed, which the server knows anyway, does
        # it go back (for the noise_stat_empirical diagnostic)
        facts: dict[str, Any] = {"steps": steps}
        if plan.seed >= 0:
            facts["noise-sq-norm"] = noise_sq
        content = RecordDict({UPLOAD: to_record(P.unstack(upload, 0)), FACTS: MetricRecord(facts)})
        return Message(content, reply_to=msg)

    return app


app = client_app()

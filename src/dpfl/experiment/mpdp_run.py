"""MP-DP and its baselines (spec bidirectional.md §6, §8, §9, §11) as runs of the one round loop, in float64.

Every method runs on the same IID shards, the same initial model, the same per-round batches and the same number
of FedSGD rounds: `mpdp_run` builds the `FederatedRun` (the stages are dpfl.algorithms.catalog.mpdp's), `run_mpdp`
runs it and restates its result in the comparison's terms. The model (an MLP, a CNN or a norm-free tied-residual
ResNet) is trained with MSE on one-hot targets (the loss MP-DP's recovery is exact for). Privacy: MP-DP and
MP-DP-Naive report NOMINAL per-round guarantees and their per-client composition (never entered in dpfl's
accountant: spec §8.6); MP-CDP's Gaussian rounds are composed by dpfl's RDP accountant.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import nn

from dpfl.algorithms.catalog.context import RunFacts
from dpfl.algorithms.catalog.mpdp import PARAMS, fedsgd, mp_cdp, mpdp, mpdp_naive, tp_smc
from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings
from dpfl.algorithms.secure.mpdp.perturb import ClientPayload, FactorPlan
from dpfl.algorithms.secure.mpdp.server_steps import client_view
from dpfl.algorithms.secure.mpdp.settings import method_settings
from dpfl.algorithms.secure.mpdp.views import ClientView
from dpfl.data import load_dataset
from dpfl.data.catalog import FILE_BACKED
from dpfl.data.federated import ClientData, FederatedDataset
from dpfl.experiment.federated_run import FederatedRun, RunState
from dpfl.experiment.config.legacy_mpdp import MPDPConfig
from dpfl.models import build_model
from dpfl.models.mpdp_networks import LAST_LAYER_SCALE
from dpfl.seeding import Purpose, numpy_generator, torch_generator


class ClientAttacks(Protocol):
    """What a curious client learns at the end of a run: privacy.json blocks from the last model it received (an
    MP-DP `view`, or the plaintext `weights` for the other methods)."""

    def __call__(self, arrays: FederatedArrays, seed: int, *, view: ClientView | None = None,
                 weights: list[torch.Tensor] | None = None, plan: FactorPlan | None = None) -> dict[str, Any]: ...


@dataclass
class MPDPResult:
    method: str
    history: list[dict[str, Any]]
    privacy: dict[str, Any]
    summary: dict[str, Any]
    weights: list[torch.Tensor] = field(repr=False, default_factory=list)
    plan: FactorPlan | None = field(repr=False, default=None)  # the model the weights belong to


@dataclass
class FederatedArrays:
    shards: list[tuple[torch.Tensor, torch.Tensor]]  # per client (x [n, d] float64, one-hot y)
    x_test: torch.Tensor
    y_test: torch.Tensor  # labels
    n_classes: int
    image_shape: tuple[int, ...] = ()  # one record as an image (C, H, W); the MLP's inputs are it flattened


def federated_arrays(cfg: MPDPConfig) -> FederatedArrays:
    """IID equal shards of the training set (seeded; flattened for the MLP); `train_per_client` caps each shard.
    File-backed datasets are read from local files only (spec §11: loaders never download)."""
    data = load_dataset(cfg.dataset, **({"download": False} if cfg.dataset in FILE_BACKED else {}))
    keep = ((lambda t: t.reshape(t.shape[0], -1).to(torch.float64)) if cfg.model == "mlp"  # noqa: E731
            else (lambda t: t.to(torch.float64)))
    x = keep(data.x_train)
    y = torch.nn.functional.one_hot(data.y_train.long(), data.n_classes).to(torch.float64)
    order = numpy_generator(cfg.seed, Purpose.PARTITION).permutation(len(x))
    per = len(x) // cfg.clients if cfg.train_per_client is None else cfg.train_per_client
    if per * cfg.clients > len(x):
        raise ValueError(f"{cfg.clients} clients x {per} records exceed the {len(x)} training records of {cfg.dataset}")
    shards = [(x[order[k * per:(k + 1) * per]], y[order[k * per:(k + 1) * per]]) for k in range(cfg.clients)]
    return FederatedArrays(shards, keep(data.x_test), data.y_test.long(), data.n_classes, tuple(data.x_train.shape[1:]))


def initial_weights(plan: FactorPlan, seed: int) -> list[torch.Tensor]:
    """He-normal weights and zero biases, the last layer's weight scaled by LAST_LAYER_SCALE; the same for every
    method of a seed. Without normalisation a residual network needs Fixup's initialisation (Zhang et al., arXiv
    1901.09321, with two layers per branch): each block's last layer starts at zero and its other layers are scaled
    by (number of blocks)^(-1/2), so the network starts as its chain of shortcuts. The registry's `mpdp` init
    (`dpfl.models.mpdp_networks.init_mpdp`) draws the same weights from the module; this is its plan's reference."""
    g = torch_generator(seed, Purpose.INIT)
    ends = {sk.target for sk in plan.skips}
    inside = {layer for sk in plan.skips for layer in range(sk.source + 1, sk.target)}
    out = []
    for (layer, kind), shape in zip(plan.params(), plan.shapes(), strict=True):
        if kind == "bias":
            out.append(torch.zeros(shape, dtype=torch.float64))
            continue
        w = torch.randn(shape, generator=g, dtype=torch.float64) * math.sqrt(2.0 / math.prod(shape[1:]))
        if layer == plan.layers - 1:
            w = w * LAST_LAYER_SCALE
        elif layer in ends:
            w = torch.zeros_like(w)
        elif layer in inside:
            w = w / math.sqrt(len(plan.skips))
        out.append(w)
    return out


def model_plan(cfg: MPDPConfig, input_shape: tuple[int, ...], n_classes: int) -> FactorPlan:
    """The config's network (`mpdp_network`) as a FactorPlan."""
    net = mpdp_network(cfg, input_shape, n_classes)
    # the config's choice of model is the opt-in to the experimental tied residuals
    return FactorPlan.from_module(net, input_shape, allow_residual=cfg.model == "resnet")


def mpdp_network(cfg: MPDPConfig, input_shape: tuple[int, ...], n_classes: int) -> nn.Sequential:
    """The config's network from the model registry (mpdp_mlp of `hidden`, spec §11's digits CNN mpdp_cnn, or the
    norm-free ResNet mpdp_resnet): float64, with MP-DP's initial weights for cfg.seed (`initial_weights` of its plan).
    """
    if cfg.model == "mlp":
        name, options = "mpdp_mlp", {"hidden": list(cfg.hidden), "bias": cfg.bias}
    elif cfg.model == "cnn":
        name, options = "mpdp_cnn", {"bias": cfg.bias}
    else:
        name, options = "mpdp_resnet", {"widths": list(cfg.widths), "blocks": cfg.blocks, "bias": cfg.bias}
    return build_model(name, input_shape, n_classes, seed=cfg.seed, **options)


def federated_data(arrays: FederatedArrays) -> FederatedDataset:
    """`arrays` as a FederatedDataset: each shard one client's training records (labels, not one-hot)."""
    empty = arrays.x_test[:0]
    clients = [ClientData(x, y.argmax(1), empty, arrays.y_test[:0]) for x, y in arrays.shards]
    return FederatedDataset(clients, arrays.x_test, arrays.y_test, arrays.n_classes,
                            tuple(arrays.shards[0][0].shape[1:]), {"partition": "iid_equal"})


FACTORIES = {"mpdp": mpdp, "mpdp_naive": mpdp_naive, "mp_cdp": mp_cdp, "tp_smc": tp_smc, "fedavg": fedsgd}


def noise_settings(cfg: MPDPConfig, method: str) -> tuple[RoundSettings, dict[str, Any]]:
    """The round settings of `method` and its per-round privacy block (`settings.method_settings`)."""
    params = cfg.model_copy()
    return method_settings(method, params, clients=cfg.clients, lr=cfg.lr, clip=cfg.clip, rounds=cfg.rounds,
                           run_id=f"dpfl/mpdp/{cfg.name}/{cfg.seed}".encode())


def mpdp_run(cfg: MPDPConfig, method: str, arrays: FederatedArrays,
             drop: Callable[[int, int], set[int]] | None = None,
             on_broadcast: Callable[[ClientPayload, list[torch.Tensor]], Any] | None = None) -> FederatedRun:
    """`method` on cfg's data as a run of the one round loop (`drop`, `on_broadcast`: as `run_mpdp`'s)."""
    data = federated_data(arrays)
    model = mpdp_network(cfg, data.input_shape, data.n_classes)
    facts = RunFacts(lr=cfg.lr, clients=cfg.clients, rounds=cfg.rounds, local_steps=1, clip=cfg.clip, loss="mse_onehot",
                     seed=cfg.seed, model=model, input_shape=data.input_shape, run_name=cfg.name)
    algorithm = FACTORIES[method](facts, **{k: getattr(cfg, k) for k in PARAMS})
    if drop is not None:
        algorithm = replace(algorithm, upload=replace(algorithm.upload, drop=drop))
    if on_broadcast is not None:
        algorithm = replace(algorithm, aggregator=replace(algorithm.aggregator, on_broadcast=on_broadcast))
    return FederatedRun(data, model, algorithm, rounds=cfg.rounds, batch_sizes=cfg.batch_size, seed=cfg.seed,
                        eval_every=cfg.eval_every)


def run_mpdp(cfg: MPDPConfig, method: str, *, arrays: FederatedArrays | None = None,
             on_broadcast: Callable[[ClientPayload, list[torch.Tensor]], Any] | None = None,
             drop: Callable[[int, int], set[int]] | None = None,
             progress: Callable[[str], None] | None = None,
             client_attacks: ClientAttacks | None = None) -> MPDPResult:
    """One run of `method` on cfg's data. `drop(round, attempt)`: clients that leave after key agreement (tests).
    `on_broadcast(payload, true weights)`: what the clients receive each round, next to the true model (tests).
    `client_attacks` measures what a curious client learns from the last model it received (the spec's §10 attacks;
    `dpfl.evaluate.mpdp_attacks.client_attacks`, supplied by the caller so that this layer imports no attack); its
    result goes into the run's privacy record."""
    arrays = arrays if arrays is not None else federated_arrays(cfg)
    run = mpdp_run(cfg, method, arrays, drop, on_broadcast)
    final: list[RunState] = []

    def on_round(row: dict[str, Any]) -> None:
        if progress is not None and "test_accuracy" in row:
            progress(f"{cfg.name} {method} round {row['round']}/{cfg.rounds}: accuracy {row['test_accuracy']:.3f}")

    t_start = time.perf_counter()
    result = run.run(on_round, on_checkpoint=final.append, checkpoint_every=cfg.rounds)
    weights = list(result.params.values())
    plan = model_plan(cfg, tuple(arrays.shards[0][0].shape[1:]), arrays.n_classes)
    history = [mpdp_row(row) for row in result.history]
    privacy = dict(result.privacy.to_dict()["stage"])
    view = client_view(final[-1].aggregator_state, plan) if method in ("mpdp", "mpdp_naive") else None
    if client_attacks is not None:
        privacy.update(client_attacks(arrays, cfg.seed, view=ClientView(view)) if view is not None
                       else client_attacks(arrays, cfg.seed, weights=weights, plan=plan))
    summary = summarize(cfg, method, history, privacy, time.perf_counter() - t_start)
    return MPDPResult(method, history, privacy, summary, weights, plan)


def mpdp_row(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row of the one loop in the comparison's terms: the upload's size per client."""
    out = dict(row)
    out["upload_bytes"] = row["uplink_bytes"] // max(len(row["selected"]), 1)
    return out


def summarize(cfg: MPDPConfig, method: str, history: list[dict[str, Any]], privacy: dict[str, Any],
              seconds: float) -> dict[str, Any]:
    rounds = len(history)
    client_keys = ("lmt_seconds", "ddp_seconds") if method in ("mpdp", "mpdp_naive") else ("client_seconds",)
    server_keys = (("server_seconds", "recover_update_seconds") if method in ("mpdp", "mpdp_naive")
                   else ("decrypt_seconds",) if method == "tp_smc" else ())
    membership = privacy.get("membership", {})
    per_round = lambda keys: sum(row.get(k, 0.0) for row in history for k in keys) / rounds  # noqa: E731
    final = history[-1]
    return {"setting": cfg.name, "method": method, "seed": cfg.seed,
            "epsilon": None if method == "fedavg" else cfg.epsilon,
            "accuracy": final.get("test_accuracy"), "round_seconds": sum(r["seconds"] for r in history) / rounds,
            "server_seconds": per_round(server_keys), "client_seconds": per_round(client_keys) / cfg.clients,
            "upload_bytes": final["upload_bytes"], "violation_rate": privacy.get("violation_rate"),
            "epsilon_composed": privacy.get("composed_epsilon_max", privacy.get("epsilon_total")),
            "demasked_accuracy": privacy.get("model_hiding", {}).get("demasked_accuracy"),
            "perturbed_accuracy": privacy.get("model_hiding", {}).get("perturbed_accuracy"),
            "mia_asr": membership.get("plain", {}).get("asr"), "mia_auc": membership.get("plain", {}).get("auc"),
            "mia_asr_adaptive": membership.get("adaptive", {}).get("asr"),
            "epsilon_label": privacy.get("label", privacy.get("guarantee")), "rounds": rounds, "seconds": seconds}

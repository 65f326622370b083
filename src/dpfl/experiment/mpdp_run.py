"""The round loop of MP-DP and its baselines (spec bidirectional.md §6, §8, §9, §11), in float64.

Every method runs on the same IID shards, the same initial model, the same per-round batches and the same number
of FedSGD rounds. The model (an MLP, a CNN or a norm-free tied-residual ResNet) is trained with MSE on one-hot
targets (the loss MP-DP's recovery is exact for). Privacy: MP-DP and MP-DP-Naive report NOMINAL per-round
guarantees and their per-client composition (never entered in dpfl's accountant: spec §8.6); MP-CDP's Gaussian
rounds go through dpfl's RDP accountant.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from dp_accounting import GaussianDpEvent, SelfComposedDpEvent

from dpfl.algorithms.secure.mpdp.algorithm import RoundSettings, perturbed_round, plain_round
from dpfl.algorithms.secure.mpdp.ddp import MissingPeersError
from dpfl.algorithms.secure.mpdp.perturb import ClientPayload, FactorPlan, forward, round_generator
from dpfl.algorithms.secure.mpdp.privacy import NOMINAL_LABEL, composed, min_sigma_delta, solve_sigma_eta
from dpfl.algorithms.secure.mpdp.residual import norm_free_resnet
from dpfl.algorithms.secure.mpdp.views import ClientView
from dpfl.algorithms.secure.threshold_paillier import keygen
from dpfl.algorithms.secure.tpsmc import tpsmc_round
from dpfl.data import load_dataset
from dpfl.data.catalog import FILE_BACKED
from dpfl.experiment.mpdp_config import MPDPConfig
from dpfl.privacy.accountant import epsilon as accountant_epsilon
from dpfl.privacy.analytic_gaussian import analytic_gaussian_sigma
from dpfl.seeding import Purpose, derive_seed, numpy_generator, torch_generator

MAX_RETRIES = 5  # re-runs of a round discarded for missing peers (dropout_policy abort)


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


LAST_LAYER_SCALE = 0.1  # outputs start near 0 under MSE: FedSGD on digits reaches 0.76 in 30 rounds, not 0.38


def initial_weights(plan: FactorPlan, seed: int) -> list[torch.Tensor]:
    """He-normal weights and zero biases, the last layer's weight scaled by LAST_LAYER_SCALE; the same for every
    method of a seed. Without normalisation a residual network needs Fixup's initialisation (Zhang et al., arXiv
    1901.09321, with two layers per branch): each block's last layer starts at zero and its other layers are scaled
    by (number of blocks)^(-1/2), so the network starts as its chain of shortcuts."""
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
    """The config's network as a FactorPlan: the MLP of `hidden`, spec §11's digits CNN, or a norm-free ResNet."""
    if cfg.model == "mlp":
        return FactorPlan((math.prod(input_shape), *cfg.hidden, n_classes), bias=cfg.bias)
    c, h, w = input_shape
    if cfg.model == "resnet":  # the config's choice of model is the opt-in to the experimental tied residuals
        net = norm_free_resnet(c, h, n_classes, tuple(cfg.widths), cfg.blocks, cfg.bias)
        return FactorPlan.from_module(net, input_shape, allow_residual=True)
    net = nn.Sequential(nn.Conv2d(c, 8, 3, padding=1, bias=cfg.bias), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 16, 3, padding=1, bias=cfg.bias), nn.ReLU(), nn.Flatten(),
                        nn.Linear(16 * (h // 2) * (w // 2), n_classes, bias=cfg.bias))
    return FactorPlan.from_module(net, input_shape)


class BatchStream:
    """Per-client batches drawn without replacement from the shard; an epoch is ceil(|D_k| / b) rounds."""

    def __init__(self, shards: list[tuple[torch.Tensor, torch.Tensor]], batch: int, seed: int) -> None:
        self.shards, self.batch, self.seed = shards, batch, seed
        self._orders: dict[tuple[int, int], np.ndarray] = {}

    def get(self, k: int, round_: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.shards[k]
        per_epoch = math.ceil(len(x) / self.batch)
        epoch, pos = divmod(round_, per_epoch)
        if (k, epoch) not in self._orders:
            self._orders = {key: v for key, v in self._orders.items() if key[0] != k}
            self._orders[(k, epoch)] = numpy_generator(self.seed, Purpose.BATCH, epoch, k).permutation(len(x))
        idx = self._orders[(k, epoch)][pos * self.batch:(pos + 1) * self.batch]
        return x[idx], y[idx]


def simulated_dropouts(cfg: MPDPConfig, round_: int, attempt: int) -> set[int]:
    """floor(dropout x K) clients, drawn from the run seed (independently of the data), leave after key agreement."""
    n = int(cfg.dropout * cfg.clients)
    if n == 0:
        return set()
    rng = numpy_generator(cfg.seed, Purpose.SECAGG, round_, attempt)
    return {int(c) for c in rng.choice(cfg.clients, n, replace=False)}


def _central_gaussian(cfg: MPDPConfig) -> tuple[float, dict[str, Any]]:
    """MP-CDP's and TP-SMC's one Gaussian per round: σ from the analytic calibration at the per-round (ε, δ), and
    the privacy fields of its RDP-accounted composition over the run."""
    sigma = analytic_gaussian_sigma(cfg.epsilon, cfg.delta)
    total = accountant_epsilon(SelfComposedDpEvent(GaussianDpEvent(sigma), cfg.rounds), cfg.delta, "rdp")
    return sigma, {"per_round_epsilon": cfg.epsilon, "delta": cfg.delta, "sigma_cdp": sigma, "accountant": "rdp",
                   "in_ledger": True, "event": f"SelfComposed(Gaussian({sigma:.6g}), {cfg.rounds})",
                   "epsilon_total": total}


def noise_settings(cfg: MPDPConfig, method: str) -> tuple[RoundSettings, dict[str, Any]]:
    """The round settings of `method` and its privacy block (per-round calibration)."""
    K, eps, delta = cfg.clients, cfg.epsilon, cfg.delta
    common = dict(method=method, lr=cfg.lr, S=cfg.sensitivity, clip=cfg.clip, clip_mode=cfg.clip_mode,
                  graph=cfg.graph, n=cfg.n, mask_scale=cfg.mask_scale,
                  run_id=f"dpfl/mpdp/{cfg.name}/{cfg.seed}".encode(), mask_corrections=cfg.mask_corrections,
                  noise_family=cfg.noise_family, delta=cfg.delta, dropout_policy=cfg.dropout_policy)
    if method == "mpdp":
        sigma_delta = cfg.sigma_delta_factor * min_sigma_delta(eps, delta, K, cfg.graph, cfg.n, cfg.mode)
        plan = solve_sigma_eta(eps, delta, K, sigma_delta, cfg.graph, cfg.n, cfg.mode)
        info = {"guarantee": "nominal", "label": plan.label, "theorem": plan.theorem, "per_round_epsilon": eps,
                "delta": delta, "sigma_eta": plan.sigma_eta, "sigma_delta": sigma_delta,
                "aggregate_std": plan.sigma_eta / math.sqrt(K), "stamps": list(plan.stamps),
                "accountant": None, "in_ledger": False}
        return RoundSettings(sigma_eta=plan.sigma_eta, sigma_delta=sigma_delta, **common), info
    if method == "mpdp_naive":
        sigma = analytic_gaussian_sigma(eps, delta)
        info = {"guarantee": "nominal", "label": f"{NOMINAL_LABEL}; each upload calibrated as an (ε, δ)-LDP Gaussian "
                "mechanism, but the server's recovered noise R∘η is not Gaussian (variance 1.5 S² σ²)",
                "per_round_epsilon": eps, "delta": delta, "sigma": sigma, "accountant": None, "in_ledger": False}
        return RoundSettings(sigma_naive=sigma, **common), info
    if method == "tp_smc":
        sigma, accounted = _central_gaussian(cfg)
        h = cfg.tpsmc_honest or K
        threshold = cfg.tpsmc_threshold or K // 2 + 1
        info = {"guarantee": f"accounted, ASSUMING at least h = {h} of the {K} clients are honest (add their noise) "
                f"and fewer than {threshold} collude to decrypt; observer = the aggregator, which sees only the noisy "
                "sum (the models are broadcast in plaintext)",
                **accounted, "honest": h, "threshold": threshold,
                "client_noise_std": cfg.sensitivity * sigma / math.sqrt(h),
                "not_simulated": "zero-knowledge proofs of correct partial decryption; distributed key generation "
                                 "(a dealer makes the keys)",
                "key_bits": cfg.tpsmc_key_bits, "fraction_bits": cfg.tpsmc_fraction_bits, "packing": cfg.tpsmc_packing}
        return RoundSettings(sigma_cdp=sigma, **common), info
    if method == "mp_cdp":
        sigma, accounted = _central_gaussian(cfg)
        info = {"guarantee": "accounted (trusted server: observer = anyone who sees the global models)", **accounted}
        return RoundSettings(sigma_cdp=sigma, **common), info
    return RoundSettings(**common), {"guarantee": "none (non-private reference)", "in_ledger": False}


def evaluate(weights: list[torch.Tensor], arrays: FederatedArrays,
             plan: FactorPlan | None = None) -> tuple[float, float]:
    out, _ = forward(weights, None, arrays.x_test, plan)
    target = torch.nn.functional.one_hot(arrays.y_test, arrays.n_classes).to(torch.float64)
    return float((out.argmax(1) == arrays.y_test).double().mean()), float(0.5 * ((out - target) ** 2).sum(1).mean())


def run_mpdp(cfg: MPDPConfig, method: str, *, arrays: FederatedArrays | None = None,
             on_broadcast: Callable[[ClientPayload, list[torch.Tensor]], Any] | None = None,
             drop: Callable[[int, int], set[int]] | None = None,
             progress: Callable[[str], None] | None = None,
             client_attacks: ClientAttacks | None = None) -> MPDPResult:
    """One run of `method` on cfg's data. `drop(round, attempt)`: clients that leave after key agreement (tests).
    `client_attacks` measures what a curious client learns from the last model it received (the spec's §10 attacks;
    `dpfl.evaluate.mpdp_attacks.client_attacks`, supplied by the caller so that this layer imports no attack); its
    result goes into the run's privacy record."""
    arrays = arrays if arrays is not None else federated_arrays(cfg)
    plan = model_plan(cfg, tuple(arrays.shards[0][0].shape[1:]), arrays.n_classes)
    weights = initial_weights(plan, cfg.seed)
    settings, privacy = noise_settings(cfg, method)
    batches = BatchStream(arrays.shards, cfg.batch_size, cfg.seed)
    history: list[dict[str, Any]] = []
    noise_gen = torch_generator(cfg.seed, Purpose.SERVER_NOISE)
    participations = [0] * cfg.clients
    keys = None
    if method == "tp_smc":  # a dealer's threshold keys, once per run; the shares go to the clients
        keys = keygen(cfg.tpsmc_key_bits, cfg.clients, privacy["threshold"])
    violations = uploads = 0
    discarded = 0
    audits: list[dict[str, Any]] = []
    reduced: list[int] = []
    last: list[ClientPayload] = []

    def broadcast(payload: ClientPayload, true_weights: list[torch.Tensor]) -> None:
        last[:] = [payload]
        if on_broadcast is not None:
            on_broadcast(payload, true_weights)

    t_start = time.perf_counter()
    for r in range(cfg.rounds):
        batch = {k: batches.get(k, r) for k in range(cfg.clients)}
        t0 = time.perf_counter()
        for attempt in range(MAX_RETRIES + 1):
            try:
                if method in ("mpdp", "mpdp_naive"):
                    secret_gen = round_generator(derive_seed(cfg.seed, Purpose.SERVER_NOISE, r, attempt)
                                                 if cfg.reproducible_secrets else None)
                    seeds = {k: derive_seed(cfg.seed, Purpose.NOISE, r, k, attempt) for k in batch}
                    gone = drop(r, attempt) if drop is not None else simulated_dropouts(cfg, r, attempt)
                    out = perturbed_round(weights, plan, batch, settings, r, secret_gen, seeds, gone, broadcast)
                elif method == "tp_smc":
                    noise = {k: torch_generator(cfg.seed, Purpose.NOISE, r, k) for k in batch}
                    out = tpsmc_round(weights, batch, settings, keys, cfg.tpsmc_fraction_bits, privacy["honest"],
                                      noise, plan, packing=cfg.tpsmc_packing)
                else:
                    out = plain_round(weights, batch, settings, noise_gen, plan)
                break
            except MissingPeersError as e:  # discarded; the clients that uploaded are still charged
                discarded += 1
                for k in set(batch) - set(e.missing):
                    participations[k] += 1
                if attempt == MAX_RETRIES:
                    raise
        seconds = time.perf_counter() - t0
        weights = out.weights
        for k in batch:
            participations[k] += 1
        violations += out.violations
        uploads += out.uploads
        row: dict[str, Any] = {"round": r + 1, "seconds": seconds,
                               **{f"{k}_seconds": v for k, v in out.seconds.items()},
                               "upload_bytes": out.upload_bytes, "violations": out.violations}
        if out.recovery_ratio is not None:
            row["recovery_ratio"] = out.recovery_ratio
        if out.reduced_protection:
            row["reduced_protection"] = out.reduced_protection
            reduced.append(r + 1)
        if out.audit is not None:
            row["epsilon_conditional"] = out.audit["epsilon_conditional"]
            row["min_R"] = out.audit["R_quantiles"]["min"]
            audits.append(out.audit)
        if (r + 1) % cfg.eval_every == 0 or r + 1 == cfg.rounds:
            row["test_accuracy"], row["test_loss"] = evaluate(weights, arrays, plan)
            if progress is not None:
                progress(f"{cfg.name} {method} round {r + 1}/{cfg.rounds}: accuracy {row['test_accuracy']:.3f}")
        history.append(row)
    privacy["violation_rate"] = violations / max(uploads, 1) if method != "fedavg" else None
    privacy["discarded_rounds"] = discarded
    if reduced:
        privacy["reduced_protection_rounds"] = reduced
        privacy["reduced_protection"] = ("in these rounds clients dropped after key agreement and the server rebuilt "
                                         "their pairwise noise from the survivors' key shares: their neighbours' "
                                         "uploads had less pairwise noise than the calculator assumed")
    if method in ("mpdp", "mpdp_naive") and cfg.clip_mode != "perturbed_joint":
        privacy["label"] += (f"; clip_mode {cfg.clip_mode}: the upload (the perturbed gradient at Ŵ) is not bounded "
                             "by S, so this ε does NOT hold towards the server (the raw upload can be inverted; "
                             "docs/secure.md)")
    if method in ("mpdp", "mpdp_naive") and not (method == "mpdp" and cfg.mask_corrections):
        privacy["label"] += ("; Ψ and Φ are uploaded without noise (W2): the server can reconstruct a client's "
                             "records from Φ (measured, docs/secure.md); mask_corrections hides them")
    if method == "mpdp":
        privacy["hardening"] = {"mask_corrections": cfg.mask_corrections, "noise_family": cfg.noise_family,
                                "clip_mode": cfg.clip_mode}
    if audits:
        privacy["conditional_audit"] = {"epsilon_conditional_max": max(a["epsilon_conditional"] for a in audits),
                                        "min_R_min": min(a["R_quantiles"]["min"] for a in audits),
                                        "label": audits[0]["label"]}
    if method in ("mpdp", "mpdp_naive"):
        per_client = [composed(cfg.epsilon, cfg.delta, p) for p in participations]
        privacy["per_client"] = [{"client": k, **c} for k, c in enumerate(per_client)]
        privacy["composed_epsilon_max"] = max(c["composed"]["epsilon"] for c in per_client)
    if client_attacks is not None:
        privacy.update(client_attacks(arrays, cfg.seed, view=ClientView(last[0])) if last
                       else client_attacks(arrays, cfg.seed, weights=weights, plan=plan))
    summary = summarize(cfg, method, history, privacy, time.perf_counter() - t_start)
    return MPDPResult(method, history, privacy, summary, weights, plan)


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

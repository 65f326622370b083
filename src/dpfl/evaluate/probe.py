"""A probe round: what the server receives from one client, for gradient inversion (the adapter between dpfl's
algorithms and `dpfl.attacks.inversion`).

The probe runs the config's own algorithm for one local step: client 0 holds exactly `batch` records (drawn from the
private half of the classes, as in the spec's protocol: the other half trains the feature extractor), its local
program takes one step of size lr on them (so every record is in the batch, whatever the sampling), and its upload
stage (clipping, noise) acts as in a run. The server's view of that upload is turned into the gradient it implies,
-upload / lr, at the round's global model. Everything else of the config (model, privacy, noise calibration from the
budgets for the probe's schedule) is the run's. Secure aggregation is refused: there the server sees only the sum.

FedCEO (spec fedceo.md §8): `smoothing=j` attacks client 0's smoothed model ŵ_0 instead of its upload. The round's
K clients (0..K-1, K the config's round size) take the same one step on their own records, the server's T-tSVD at
the j-th smoothing's threshold smooths their models, and the gradient is -(ŵ_0 - w) / lr: what an observer of the
models FedCEO hands back learns (the server itself also holds the raw upload, which smoothing cannot protect).

A config that normalises its images (`normalize`) is attacked in image space: the probe's model normalises its
input as the data pipeline did, and the records are de-normalised, so the dummies, Inverting Gradients' [0, 1] box
and PSNR all work on [0, 1] pixels.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from dpfl.attacks.image_metrics import feature_mse, image_mse, psnr, train_feature_extractor
from dpfl.attacks.inversion import dlg, gradient_from_update, inverting_gradients
from dpfl.data.arrays import channel_stats
from dpfl.data.federated import ClientData
from dpfl.data.registry import PROVIDED
from dpfl.engine import params as P
from dpfl.experiment.build import build_data, build_run
from dpfl.experiment.config import RunConfig, config_to_dict, validate_config

EXTRACTOR_EPOCHS = 8
EXTRACTOR_RECORDS = 2000


@dataclass
class Probe:
    model: nn.Module  # at the round's global weights
    gradient: list[torch.Tensor]  # -upload / lr, in model.parameters() order
    x: torch.Tensor  # the client's records (the truth)
    y: torch.Tensor
    loss: str
    unit: str | None
    observer: str
    public: tuple[torch.Tensor, torch.Tensor]  # records of the public classes (never the client's)
    n_classes: int


def private_classes(n_classes: int) -> int:
    """Classes 0 .. private-1 are the clients' secrets (the larger half); the rest train the feature extractor."""
    return n_classes // 2 + n_classes % 2


class NormalizedInput(nn.Module):
    """`model` on raw images: (x - mean) / std first, as the config's data pipeline did (no parameters of its own)."""

    def __init__(self, model: nn.Module, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x - self.mean) / self.std)


def normalization(cfg: RunConfig, n_channels: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(mean, std) as [1, C, 1, 1] tensors if the config's data pipeline normalises its images, else None."""
    given = cfg.data.options.get("normalize")
    if given is None and cfg.data.partition == "clustered" and cfg.data.clustered is not None:
        given = cfg.data.clustered.normalize
    return None if given is None else channel_stats(tuple(given), n_channels)


def probe_round(cfg: RunConfig, batch: int, smoothing: int | None = None) -> Probe:
    """Client 0's upload after one local step on `batch` records of the private classes, as the server sees it
    (FedCEO with `smoothing=j`: its smoothed model ŵ_0 after the j-th smoothing, as it is handed back)."""
    if cfg.secure_aggregation is not None:
        raise ValueError("with secure aggregation the server sees only the sum of the uploads, never one client's: "
                         "there is no single upload to invert")
    if batch < 1:
        raise ValueError(f"--batch must be >= 1, got {batch}")
    data = build_data(cfg)
    if len(data.input_shape) != 3 or data.n_classes < 2:
        raise ValueError(f"gradient inversion needs an image classification dataset, {cfg.data.dataset!r} has "
                         f"samples of shape {tuple(data.input_shape)}")
    private = private_classes(data.n_classes)
    c0 = data.clients[0]
    rows = torch.nonzero(c0.y_train < private).flatten()
    if len(rows) < batch:
        raise ValueError(f"--batch {batch} is larger than client 0's {len(rows)} records of the private classes")
    order = np.lexsort((np.arange(len(rows)), _first_of_each_label(c0.y_train[rows].numpy())))
    pick = rows[torch.as_tensor(order[:batch])]
    x, y = c0.x_train[pick], c0.y_train[pick]
    probe_client = ClientData(x, y, c0.x_test, c0.y_test)
    probe_data = replace(data, clients=[probe_client, *data.clients[1:]])
    d = config_to_dict(cfg)
    d["data"] = {"dataset": PROVIDED, "clients": cfg.data.clients}
    d["training"].pop("local_epochs", None)
    d["training"].update(local_steps=1, batch_size=batch)
    run = build_run(validate_config(d), data=probe_data)
    start = run.initial_state().params
    expected = run.algorithm.selection.expected_count(run.n_clients)
    alg = run.algorithm
    if smoothing is None:
        upload = P.unstack(run.local_round(0, start, np.array([0]), expected).uploads, 0)
        observer = ("the server (trusted by the mechanism: central DP protects the released models, not this upload)"
                    if alg.central else alg.observer)
    else:
        upload = _smoothed_update(run, start, smoothing, expected)
        observer = (f"whoever receives client 0's smoothed model after smoothing {smoothing} (the server also holds "
                    "the raw upload, which smoothing does not protect)")
    names = [n for n, p in run.model.named_parameters() if p.requires_grad]
    gradient = gradient_from_update([upload[n] for n in names], cfg.training.optimizer.lr)
    public = data.y_test >= private
    px, public_x, model = x, data.x_test[public], run.model
    stats = normalization(cfg, x.shape[1])
    if stats is not None:  # attack and score in image space
        mean, std = stats
        px, public_x = x * std + mean, data.x_test[public] * std + mean
        model = NormalizedInput(run.model, mean, std)
    return Probe(model, gradient, px, y, getattr(run.model, "loss_kind", "cross_entropy"), alg.unit, observer,
                 (public_x, data.y_test[public]), data.n_classes)


def _smoothed_update(run: Any, start: P.Params, smoothing: int, expected: float) -> P.Params:
    """ŵ_0 - w: clients 0..K-1 train round 1, and FedCEO's server smooths their models at threshold j."""
    from dpfl.algorithms.server.fedceo import FedCEO
    from dpfl.algorithms.stages import RoundInputs

    aggregator = run.algorithm.aggregator
    if not isinstance(aggregator, FedCEO):
        raise ValueError(f"--after-smoothing attacks FedCEO's smoothed models; algorithm {run.algorithm.name!r} has "
                         "no smoothing")
    if smoothing < 1:
        raise ValueError(f"--after-smoothing is the index j >= 1 of a smoothing, got {smoothing}")
    k = len(run.algorithm.selection.select(list(range(run.n_clients)), run.seed, 0))
    local = run.local_round(0, start, np.arange(k), expected)
    # the round that ends with smoothing j, from the state before round 1: every client starts from w
    step = aggregator.update(aggregator.init(start), start, local.uploads,
                             RoundInputs(local.view, run.seed, smoothing * aggregator.interval - 1))
    return P.sub(aggregator.personal_models(step.state, start)[0], start)


def _first_of_each_label(labels: np.ndarray) -> np.ndarray:
    """A sort key that puts one record of each label first, then the second of each, ...: distinct labels in the
    batch whenever there are enough classes, so reconstructions pair with records by label."""
    seen: dict[int, int] = {}
    key = np.empty(len(labels), dtype=np.int64)
    for i, label in enumerate(labels.tolist()):
        key[i] = seen.get(label, 0)
        seen[label] = key[i] + 1
    return key


def matched(reconstruction: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """The reconstructions reordered to the records they are closest to (image MSE, optimal assignment): the
    attacker does not know which dummy became which record, and a swap is not a failure to reconstruct."""
    cost = ((reconstruction[:, None] - truth[None]) ** 2).flatten(2).mean(2).numpy()
    rows, cols = linear_sum_assignment(cost)
    out = torch.empty_like(reconstruction)
    out[torch.as_tensor(cols)] = reconstruction[torch.as_tensor(rows)]
    return out


def public_extractor(probe: Probe, seed: int = 0) -> nn.Module:
    """The feature extractor of the metrics: a small CNN trained (fixed seed) on at most EXTRACTOR_RECORDS test
    records of the public classes, which the probed records never come from. It depends only on the data split
    and the seed, so a study trains it once for all its settings."""
    x, y = probe.public[0][:EXTRACTOR_RECORDS], probe.public[1][:EXTRACTOR_RECORDS]
    return train_feature_extractor(x.to(torch.float64), y, probe.n_classes, seed, epochs=EXTRACTOR_EPOCHS)


def shared_extractor(probe: Probe, seed: int, cache: dict[Any, nn.Module]) -> nn.Module:
    """`public_extractor(probe, seed)`, trained once per (public records, classes, seed) in `cache`. The key hashes
    the public records themselves, so runs on other data or splits never share an extractor; training is
    deterministic and leaves the global RNG alone, so a cached extractor is the one a fresh training gives."""
    x, y = probe.public
    digest = hashlib.sha256()
    for t in (x, y):
        digest.update(str((tuple(t.shape), t.dtype)).encode())
        digest.update(t.detach().contiguous().cpu().numpy().tobytes())
    key = (digest.hexdigest(), probe.n_classes, seed)
    if key not in cache:
        cache[key] = public_extractor(probe, seed)
    return cache[key]


INVERSION_METRICS = ("psnr", "image_mse", "feature_mse")


def inversion_metrics(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """`invert_probe`'s result without the reconstructions: per attack its psnr, image_mse and feature_mse."""
    return {name: {m: r[m] for m in INVERSION_METRICS} for name, r in result.items()}


def invert_probe(probe: Probe, steps: int = 200, seed: int = 0, extractor: nn.Module | None = None) -> dict[str, Any]:
    """DLG and Inverting Gradients on the probe's gradient: per method psnr, image_mse, feature_mse (the
    `public_extractor`, trained here unless given), and the reconstructions (clipped to [0, 1], matched to the
    records)."""
    x = probe.x.to(torch.float64)
    # eval(): dropout off. The attacker cannot know the mask the client's step drew (mlp2, cnn_mnist_splitting), and
    # in train() mode every forward of the attack would draw a new one from the global RNG: irreproducible results.
    model = probe.model.to(torch.float64).eval()
    grads = [g.to(torch.float64) for g in probe.gradient]
    extractor = extractor if extractor is not None else public_extractor(probe, seed)
    methods = {
        "dlg": lambda: dlg(model, grads, probe.y, tuple(x.shape), steps=steps, seed=seed, loss=probe.loss),
        "inverting_gradients": lambda: inverting_gradients(model, grads, probe.y, tuple(x.shape), steps=steps, lr=0.1,
                                                           tv_weight=1e-5, seed=seed, loss=probe.loss),
    }
    out: dict[str, Any] = {}
    for name, attack in methods.items():
        rec = matched(attack().reconstruction.detach().clamp(0.0, 1.0), x)
        out[name] = {"psnr": psnr(rec, x), "image_mse": image_mse(rec, x),
                     "feature_mse": feature_mse(extractor, rec, x), "reconstruction": rec}
    return out


def write_inversion(out: Path, name: str, probe: Probe, result: dict[str, Any], *, batch: int, steps: int,
                    after_smoothing: int | None) -> dict[str, Any]:
    """`dpfl attack invert`'s files: OUT/inversion.json (the settings, who observed what, and `inversion_metrics`)
    and OUT/inversion.png (the records against each attack's reconstruction); `name` is the config's. Returns what
    inversion.json holds."""
    from dpfl.attacks.figures import reconstruction_grid
    from dpfl.results.run_files import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    report = {"config": name, "batch": batch, "steps": steps, "after_smoothing": after_smoothing,
              "unit": probe.unit, "observer": probe.observer,
              "attacks": inversion_metrics(result)}
    write_json_atomic(out / "inversion.json", report)
    reconstruction_grid(probe.x, {k: v["reconstruction"] for k, v in result.items()}, out / "inversion.png",
                        f"{name}: batch {batch}, " + (f"{probe.unit}-level DP" if probe.unit else "not private"))
    return report

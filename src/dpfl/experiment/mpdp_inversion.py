"""Gradient inversion by the server in MP-DP's comparison (spec bidirectional.md §10, "Gradient inversion by the
server"), through the same attacks as every other algorithm (`attacks.probe.invert_probe`: DLG and Inverting
Gradients, PSNR, image MSE and feature MSE).

A probe round at the run's final TRUE model W: client 0 holds `batch` records of the private classes (distinct
labels), the other clients their usual first batch, and the round runs as in training. What the server inverts:
- mpdp, mpdp_naive: client 0's Eq. (18) recovered noisy gradient R∘(∇F̂(Ŵ) − rᵀΨ + υΦ) = ∇F(W) + R∘(noise), which
  the server forms from the upload and its own secrets, matched against gradients of dummy data at W;
- mp_cdp: the clipped true gradient (the server is trusted: it sees it in the clear, the noise is added to the mean);
- fedavg: the true gradient.
With `mask_corrections` the server cannot form Eq. (18); the spec's fallback (matching ∇F̂ at Ŵ) is not
implemented, so those runs record why they have no inversion.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from dpfl.algorithms.secure.mpdp.algorithm import perturbed_round, true_gradient
from dpfl.algorithms.secure.mpdp.perturb import FactorPlan, forward, recover, round_generator
from dpfl.attacks.probe import Probe, invert_probe, public_extractor
from dpfl.experiment.mpdp_config import MPDPConfig
from dpfl.experiment.mpdp_run import FederatedArrays, noise_settings
from dpfl.seeding import Purpose, derive_seed

__all__ = ["BATCHES", "TARGETS", "PlanNetwork", "inversion_report", "probe_gradient"]

BATCHES = (1, 8)  # the spec's probe batch sizes
PROBE_ROUND = 10**6  # the probe round's index in the seeds: never one of the run's rounds
TARGETS = {"mpdp": "client 0's Eq. (18) recovered noisy gradient, the true gradient plus R∘(its noise)",
           "mpdp_naive": "client 0's recovered noisy gradient, the true gradient plus R∘(its Gaussian noise)",
           "mp_cdp": "client 0's clipped true gradient (the trusted server sees it in the clear)",
           "fedavg": "client 0's true gradient"}


class PlanNetwork(nn.Module):
    """The true network of a FactorPlan as a module reading images (the attacks differentiate through model(x))."""

    def __init__(self, weights: list[torch.Tensor], plan: FactorPlan, flatten: bool) -> None:
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(w.detach().clone()) for w in weights])
        self.plan, self.flatten = plan, flatten

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return forward(list(self.weights), None, x.reshape(len(x), -1) if self.flatten else x, self.plan)[0]


def _probe_records(arrays: FederatedArrays, batch: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`batch` records of client 0 from the private classes (the lower half), one label after another; None when
    client 0 holds fewer."""
    x, onehot = arrays.shards[0]
    labels = onehot.argmax(1)
    private = arrays.n_classes // 2 + arrays.n_classes % 2
    by_label = [torch.nonzero(labels == c).flatten().tolist() for c in range(private)]
    order = [rows[i] for i in range(max(map(len, by_label))) for rows in by_label if i < len(rows)]
    if len(order) < batch:
        return None
    pick = torch.as_tensor(order[:batch])
    return x[pick], onehot[pick]


def probe_gradient(cfg: MPDPConfig, method: str, weights: list[torch.Tensor], plan: FactorPlan,
                   arrays: FederatedArrays, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """The gradient the server recovers from client 0's upload in a probe round at `weights` (module docstring)."""
    settings, _ = noise_settings(cfg, method)
    if method == "fedavg":
        return true_gradient(weights, x, y, plan)
    if method == "mp_cdp":
        g = true_gradient(weights, x, y, plan)
        norm = math.sqrt(sum(float((t**2).sum()) for t in g))
        return [t * min(1.0, settings.clip / norm) if norm > 0 else t for t in g]
    seen: list[list[torch.Tensor]] = []

    def server_view(k: int, upload: list[torch.Tensor], psi: list[torch.Tensor], phi: list[torch.Tensor],
                    sec: Any) -> None:
        if k == 0:
            seen.append(recover(upload, psi, phi, sec))

    batches = {0: (x, y)}
    for k in range(1, cfg.clients):
        bx, by = arrays.shards[k]
        batches[k] = (bx[:cfg.batch_size], by[:cfg.batch_size])
    secret_gen = round_generator(derive_seed(cfg.seed, Purpose.SERVER_NOISE, PROBE_ROUND))
    seeds = {k: derive_seed(cfg.seed, Purpose.NOISE, PROBE_ROUND, k) for k in batches}
    perturbed_round(weights, plan, batches, settings, PROBE_ROUND, secret_gen, seeds, on_upload=server_view)
    return seen[0]


def inversion_report(cfg: MPDPConfig, method: str, weights: list[torch.Tensor], plan: FactorPlan,
                     arrays: FederatedArrays, *, steps: int = 200, extractor: nn.Module | None = None,
                     batches: tuple[int, ...] = BATCHES) -> dict[str, Any]:
    """DLG and Inverting Gradients on the probe gradient, per probe batch size: PSNR (dB, higher = more leakage),
    image MSE, feature MSE, and the strongest attack's PSNR. `extractor`: the public feature extractor (trained
    here from the test set's public classes when None; it depends only on the dataset, so callers share it)."""
    if method in ("mpdp", "mpdp_naive") and cfg.mask_corrections:
        return {"skipped": "mask_corrections: the server cannot form the Eq. (18) recovered gradient, and the spec's "
                           "fallback (matching the perturbed gradient at Ŵ) is not implemented"}
    if len(arrays.image_shape) != 3:
        return {"skipped": f"records of shape {arrays.image_shape} are not images"}
    model = PlanNetwork(weights, plan, flatten=cfg.model == "mlp")
    out: dict[str, Any] = {"target": TARGETS[method], "steps": steps, "batches": {}}
    for b in batches:
        records = _probe_records(arrays, b)
        if records is None:
            out["batches"][str(b)] = {"skipped": f"client 0 holds fewer than {b} records of the private classes"}
            continue
        x, y = records
        gradient = probe_gradient(cfg, method, weights, plan, arrays, x, y)
        if all(float(g.abs().max()) == 0.0 for g in gradient):
            out["batches"][str(b)] = {"skipped": "the probe gradient is exactly zero (no unit of the model is "
                                                 "active on these records): there is nothing to invert"}
            continue
        images = x.reshape(b, *arrays.image_shape)
        public = arrays.y_test >= arrays.n_classes // 2 + arrays.n_classes % 2
        probe = Probe(model, gradient, images, y.argmax(1), "mse_onehot", None, "the server",
                      (arrays.x_test[public].reshape(-1, *arrays.image_shape), arrays.y_test[public]),
                      arrays.n_classes)
        extractor = extractor if extractor is not None else public_extractor(probe, cfg.seed)
        attacks = invert_probe(probe, steps=steps, seed=cfg.seed, extractor=extractor)
        kept = {name: {k: v for k, v in r.items() if k != "reconstruction"} for name, r in attacks.items()}
        best = max(kept, key=lambda name: kept[name]["psnr"])
        out["batches"][str(b)] = {"attacks": kept, "strongest": best, "psnr": kept[best]["psnr"]}
    return out

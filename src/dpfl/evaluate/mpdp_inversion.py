"""Gradient inversion by the server in MP-DP's comparison (spec bidirectional.md §10, "Gradient inversion by the
server"), through the same attacks as every other algorithm (`evaluate.probe.invert_probe`: DLG and Inverting
Gradients, PSNR, image MSE and feature MSE).

A probe round at the run's final TRUE model W: client 0 holds `batch` records of the private classes (distinct
labels), the other clients their usual first batch, and the round runs as in training. The server's views of
client 0's upload (every one is attacked; the strongest counts, since a server uses whichever works):
- `recovered` (mpdp, mpdp_naive): the Eq. (18) recovered noisy gradient R∘(∇F̂(Ŵ) − rᵀΨ + υΦ) = ∇F(W) + R∘(noise),
  formed from the upload and the server's own secrets, matched against gradients of dummy data at W. With
  `mask_corrections` (mpdp) Ψ, Φ are masked and this view does not exist.
- `upload_at_w_hat` (mpdp, mpdp_naive): the upload as received, ∇F̂(Ŵ) plus noise, matched against gradients of dummy
  data at Ŵ, which the server built. The spec names it as the fallback for `mask_corrections`, but the upload is in
  the server's hands in every run. The noise is calibrated to the sensitivity S of the RECOVERED gradient; ∇F̂(Ŵ) is
  bounded by S only under the spec's joint clip, not under the oracle clip of the true gradient.
- `clear`: mp_cdp's clipped true gradient (the trusted server sees it before the noise is added to the mean), or
  fedavg's true gradient.
- `phi` (mpdp* without `mask_corrections`): the W2 probe. Φ_k = ∂ mean ½α² at Ŵ is uploaded without noise (only Σ_k
  Φ_k is needed, but each client sends its own); the attacks match it through `AlphaNetwork`. It depends on the
  inputs only, so this view needs no labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from dpfl.algorithms.secure.mpdp.algorithm import clipped, perturbed_round, true_gradient
from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings
from dpfl.algorithms.secure.mpdp.perturb import ClientPayload, FactorPlan, forward, recover, round_generator
from dpfl.evaluate.probe import Probe, invert_probe, private_classes, shared_extractor
from dpfl.seeding import Purpose, derive_seed

if TYPE_CHECKING:
    from dpfl.evaluate.mpdp_attacks import FederatedArrays

__all__ = ["BATCHES", "TARGETS", "AlphaNetwork", "PerturbedNetwork", "PlanNetwork", "ProbeSetting", "inversion_report",
           "masked", "probe_targets"]

BATCHES = (1, 8)  # the spec's probe batch sizes
PROBE_ROUND = 10**6  # the probe round's index in the seeds: never one of the run's rounds
TARGETS = {"clear": "client 0's gradient at the true model as the server receives it (fedavg: the true gradient; "
                    "mp_cdp: clipped, the trusted server sees it before the noise)",
           "recovered": "client 0's Eq. (18) recovered noisy gradient, the true gradient plus R∘(its noise), matched "
                        "at the true model W",
           "upload_at_w_hat": "client 0's upload as received, the perturbed gradient at Ŵ plus its noise, matched at Ŵ "
                              "(the spec's fallback for mask_corrections; open to the server in every MP-DP run)",
           "phi": "client 0's correction term Φ = ∂ mean ½α² at Ŵ, uploaded WITHOUT noise (W2: correction-term "
                  "leakage; needs no labels)"}


class PerturbedNetwork(nn.Module):
    """The expanded network a round's payload describes (Ŵ with its transitional layers and shortcut diagonals),
    its perturbed tensors the parameters: its gradient of ½‖ŷ - ȳ‖² is what a client's LMT computes."""

    def __init__(self, payload: ClientPayload, flatten: bool) -> None:
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(w.detach().clone()) for w in payload.odd])
        self.payload, self.flatten = payload, flatten

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.payload
        return forward(list(self.weights), p.transitional, x.reshape(len(x), -1) if self.flatten else x, p.plan,
                       p.shortcuts)[0]


class AlphaNetwork(PerturbedNetwork):
    """The same network read through α(x): outputs [α + 1, 0], so that with label 0 the MSE-on-one-hot loss is
    ½α², whose batch-mean gradient at Ŵ is Φ (spec §4). It lets the inversion attacks match Φ unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.payload
        y_hat, alpha = forward(list(self.weights), p.transitional, x.reshape(len(x), -1) if self.flatten else x,
                               p.plan, p.shortcuts)
        # α does not read the last layer, whose Φ is zero; 0·ŷ keeps that layer in the graph with a zero gradient
        return torch.stack([alpha + 1.0 + 0.0 * y_hat.sum(1), torch.zeros_like(alpha)], 1)


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
    private = private_classes(arrays.n_classes)
    by_label = [torch.nonzero(labels == c).flatten().tolist() for c in range(private)]
    order = [rows[i] for i in range(max(map(len, by_label))) for rows in by_label if i < len(rows)]
    if len(order) < batch:
        return None
    pick = torch.as_tensor(order[:batch])
    return x[pick], onehot[pick]


@dataclass(frozen=True)
class ProbeSetting:
    """What the probe round needs of the run: its method's round settings (`settings.method`: mpdp, mpdp_naive,
    mp_cdp, fedavg or tp_smc), its seed, and each client's batch size."""

    settings: RoundSettings
    seed: int
    batch_size: int

    @classmethod
    def of(cls, run: Any) -> ProbeSetting:
        """A FederatedRun of MP-DP's family."""
        return cls(run.algorithm.aggregator.settings, run.seed, int(run.batch_sizes[0]))


def _reads_vectors(plan: FactorPlan) -> bool:
    """Whether the network's first layer is linear: the attacks' images are then flattened for it."""
    return plan.layer_specs[0].kind == "linear"


def probe_targets(probe: ProbeSetting, weights: list[torch.Tensor], plan: FactorPlan,
                  arrays: FederatedArrays, x: torch.Tensor, y: torch.Tensor
                  ) -> dict[str, tuple[nn.Module, list[torch.Tensor], torch.Tensor]]:
    """What the server can invert from client 0's upload in a probe round at `weights`, by view (TARGETS): the
    network the dummy gradients are taken on, the target gradient, and the labels its loss uses."""
    labels = y.argmax(1)
    settings, method = probe.settings, probe.settings.method
    flatten = _reads_vectors(plan)
    if method in ("fedavg", "mp_cdp"):
        g = true_gradient(weights, x, y, plan)
        if method == "mp_cdp":
            g = clipped(g, settings.clip)
        return {"clear": (PlanNetwork(weights, plan, flatten), g, labels)}
    seen: dict[str, Any] = {}

    def server_view(k: int, upload: list[torch.Tensor], psi: list[torch.Tensor], phi: list[torch.Tensor],
                    sec: Any) -> None:
        if k == 0:
            seen["upload"], seen["phi"] = upload, phi
            seen["recovered"] = recover(upload, psi, phi, sec)

    batches = {0: (x, y)}
    for k in range(1, len(arrays.shards)):
        bx, by = arrays.shards[k]
        batches[k] = (bx[:probe.batch_size], by[:probe.batch_size])
    secret_gen = round_generator(derive_seed(probe.seed, Purpose.SERVER_NOISE, PROBE_ROUND))
    seeds = {k: derive_seed(probe.seed, Purpose.NOISE, PROBE_ROUND, k) for k in batches}
    perturbed_round(weights, plan, batches, settings, PROBE_ROUND, secret_gen, seeds, on_upload=server_view,
                    on_broadcast=lambda payload, _: seen.setdefault("payload", payload))
    views = {"upload_at_w_hat": (PerturbedNetwork(seen["payload"], flatten), seen["upload"], labels)}
    if not masked(settings):  # with Ψ, Φ masked neither the recovered gradient nor Φ_k can be read
        views["recovered"] = (PlanNetwork(weights, plan, flatten), seen["recovered"], labels)
        views["phi"] = (AlphaNetwork(seen["payload"], flatten), seen["phi"], torch.zeros_like(labels))  # W2
    return views


def masked(settings: RoundSettings) -> bool:
    """Whether MP-DP's clients mask Ψ and Φ (mask_corrections): the server then reads only their sums."""
    return settings.method == "mpdp" and settings.mask_corrections


def inversion_report(probe: ProbeSetting, weights: list[torch.Tensor], plan: FactorPlan,
                     arrays: FederatedArrays, *, steps: int = 200, extractors: dict[Any, nn.Module] | None = None,
                     batches: tuple[int, ...] = BATCHES) -> dict[str, Any]:
    """DLG and Inverting Gradients on every view the server has of the probe upload, per probe batch size: PSNR
    (dB, higher = more leakage), image MSE, feature MSE, and the strongest (view, attack)'s PSNR: the server
    uses whichever works. `extractors`: a cache of the public feature extractors (`shared_extractor`), which depend
    only on the public records and the seed: a study passes one dict to all its runs and trains each once."""
    if probe.settings.method == "tp_smc":
        return {"skipped": "TP-SMC: the server never sees a client's upload in the clear, only the threshold-decrypted "
                           "noisy sum of all K (spec §10 names no inversion target for it)"}
    if len(arrays.image_shape) != 3:
        return {"skipped": f"records of shape {arrays.image_shape} are not images"}
    out: dict[str, Any] = {"steps": steps, "batches": {}}
    extractors = {} if extractors is None else extractors
    public = arrays.y_test >= private_classes(arrays.n_classes)
    public_records = (arrays.x_test[public].reshape(-1, *arrays.image_shape), arrays.y_test[public])
    extractor: nn.Module | None = None  # looked up once, at the first view there is to attack
    for b in batches:
        records = _probe_records(arrays, b)
        if records is None:
            out["batches"][str(b)] = {"skipped": f"client 0 holds fewer than {b} records of the private classes"}
            continue
        x, y = records
        images = x.reshape(b, *arrays.image_shape)
        views: dict[str, Any] = {}
        for view, (model, gradient, labels) in probe_targets(probe, weights, plan, arrays, x, y).items():
            if all(float(g.abs().max()) == 0.0 for g in gradient):
                views[view] = {"target": TARGETS[view], "skipped": "the probe gradient is exactly zero (no unit of "
                               "the model is active on these records): there is nothing to invert"}
                continue
            target = Probe(model, gradient, images, labels, "mse_onehot", None, "the server", public_records,
                           arrays.n_classes)
            if extractor is None:
                extractor = shared_extractor(target, probe.seed, extractors)
            attacks = invert_probe(target, steps=steps, seed=probe.seed, extractor=extractor)
            views[view] = {"target": TARGETS[view],
                           "attacks": {name: {k: v for k, v in r.items() if k != "reconstruction"}
                                       for name, r in attacks.items()}}
        scored = [(v, a, r["psnr"]) for v, rv in views.items() for a, r in rv.get("attacks", {}).items()]
        entry: dict[str, Any] = {"views": views}
        if scored:
            view, attack, best = max(scored, key=lambda t: t[2])
            entry.update(strongest=f"{attack} on {view}", psnr=best)
        out["batches"][str(b)] = entry
    return out

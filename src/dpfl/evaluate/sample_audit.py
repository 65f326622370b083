"""Empirical privacy audit of a run's SAMPLE-level mechanism: canary records, one training run, a lower bound on ε.

Steinke, Nasr and Jagielski (2023, "Privacy Auditing with One (1) Training Run", arXiv 2305.08846): m canary records
are each included in the training data with probability 1/2 (seeded), the run is trained once, and the auditor
guesses which canaries were included from the released model; Theorem 5.2 (`one_run.lower_bound`) turns the guesses
into an empirical LOWER bound on ε at the stated confidence. This is the record-level counterpart of
`audit.audit_client_level` (canary clients) for DP-SGD (algorithm dp_fedavg_local and the other dpsgd bundles) and
Noisy-FedAvg/FedProx (mechanism param_noise).

How the canaries enter the run. They are ordinary training records: canary i belongs to client i mod n (round-robin,
fixed before the inclusion bits are drawn) and is appended to that client's training data BEFORE the run is built,
so the engine's own record sampling (Poisson or fixed-size), clipping and noise act on them like on any record, and
the noise calibration and the accountant see the client's actual record count (sample rate b / n_i). The
neighbouring relation of the claim decides what an excluded canary leaves behind:

- add/remove (DP-SGD with Poisson sampling): an excluded canary is simply absent (the client then holds one record
  fewer; the run calibrates and accounts for the data it is given);
- replace-one (DP-SGD with fixed-size sampling, Noisy-FedAvg/FedProx's f-DP analysis): an excluded canary's slot
  holds a filler record (a seeded copy of one of the client's own records, drawn for every canary so that flipping
  one bit changes one slot), so record counts do not depend on the inclusion bits and the two worlds are
  replace-one neighbours, as the theorem needs.

Canary design (chosen by measurement, below): a real training image RELABELLED to a different class, with one
feature in eight (8 of digits' 64 pixels, at seeded positions) set to an extreme value, lo + 3 (hi - lo) of the
data's range. Excluded, such a record is predicted as its true class (the image is in distribution), so its loss
under its wrong label is high and an excluded canary rarely looks memorised by chance; included, the extreme pixels
are a distinctive feature the model can memorise without fighting what it learns from the real data, and they
make the canary's gradient norm exceed the clipping norm, so clipping binds on it (a run that forgets to clip lets
it through at full strength). Statistic: minus the loss of the final global model on the canary (black-box,
Steinke et al. §6); higher = guessed "in".

Measured on digits (10 classes, 1,437 training records) split over 2 clients, mlp2 (hidden 128, no dropout), 100
rounds of 1 local epoch, batch 16, lr 0.5, 200 canaries, seed 0; the bound at 95% confidence (AUC of the score), in
the design exploration (one draw of each design's canaries):

    design (score: minus the final loss)            non-private fedavg   DP-SGD eps 1, no noise   eps 1, no clipping
    uniform random pixels, random label             3.09 (AUC 1.00)      1.73 (0.84)              0.09 (0.57)
    random 0/1 pixels, random label                 2.45 (0.98)
    random -1.5/2.5 pixels, random label            1.87 (0.95)          1.77 (0.93)              2.14 (0.95)
    real image, 8 pixels at 3, random label         2.10 (0.97)
    real image relabelled, no extreme pixels        2.71 (0.99)          0.39 (0.69)
    real image relabelled, 8 pixels at 3 (CHOSEN)   2.45 (0.98)          2.45 (0.94)              2.14 (0.95)

Uniform-pixel canaries separate best in a non-private run, but their gradients are barely larger than the clip, so
a run that does not clip audits like an honest one; random-label canaries are predicted as their own label by
chance about one time in ten when excluded, which caps the precision of the "in" guesses (the -1.5/2.5 design
catches both bugs, but more weakly). Over seeds 0 and 1 without noise, 8 pixels at 3 gave 2.45 and 2.45; 6 or 12
pixels gave 1.46-2.26, 8 pixels at 2 or 4 gave 1.96-2.45. A white-box score, the canary's loss decrease (initial
minus final loss), gave the same or lower bounds with this design (2.26 non-private, 1.73 without clipping): the
initial losses are all near log 10, so there is little per-canary difficulty to remove. Projections of the model
change on the canary's loss gradient (at the initial or final model) were weaker still (0.62 and 2.26 without
noise), and logistic regression instead of the MLP weaker too (1.46 without noise, 0.67 without clipping).
With this module's own draws (seeds 0-4): non-private 2.26-3.11, without noise 1.84-2.45, without clipping
1.73-2.26, honest DP-SGD at eps 1 0.0 (tests/attacks/test_sample_audit.py).

What the audit proves, and what it does not. A bound above the reported ε refutes the claim at the stated
confidence: the run leaks more about a record than its ledger says. A bound at or below the reported ε says only
that this attack did not refute the claim; it is NOT evidence that the reported ε is tight, and black-box
record-level audits are far from tight: honest DP-SGD in the setting above audits to 0.0-0.26 whether it reports
ε = 1 or 8, and a run whose noise is ten times too small (multiplier 0.59, true ε 41) or whose clipping norm is ten
times too large audits to 0.35 or 0.39. Only gross failures are caught at this scale: no noise, no clipping, or
noise ~30 times too small (multiplier 0.2, ε ~1,700: 1.55). The bound is per canary record: each canary lives in
one client and is covered by that client's ε, so the reported ε compared is the largest ε of the clients that hold
an included canary, at their δ: `epsilon_guarantee` (for DP-SGD the ledger's `epsilon_spent`; for
Noisy-FedAvg/FedProx the f-DP headline, which is smaller than the ledger's composition). Under add/remove a client's
record count, and with it the sample rate, the local steps and the calibrated noise, depends very slightly on its
canaries' inclusion; dpfl's accountant treats the count as public, and so does this audit. Scope: classification
data (canaries are relabelled); the canaries' effect on personalised parts (PPSGD, CENTAUR) is not scored, only the
released global model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from dpfl.evaluate.audit import reported_claim
from dpfl.attacks.one_run import lower_bound
from dpfl.data.federated import ClientData, FederatedDataset
from dpfl.data.registry import PROVIDED
from dpfl.engine.evaluation import outputs
from dpfl.engine.losses import per_sample_loss
from dpfl.experiment.build import build_data, build_run, refuse_mismatched_objects
from dpfl.experiment.config import RunConfig, config_to_dict
from dpfl.experiment.config.loading import validate_config
from dpfl.privacy.events import ADD_REMOVE, REPLACE_ONE, neighboring_relation
from dpfl.seeding import Purpose, numpy_generator

# Streams of Purpose.AUDIT (round key 0); the client-level audit uses client keys 0 and 1.
INCLUSION_STREAM, RECORDS_STREAM, FILLER_STREAM = 2, 3, 4
EXTREME_FRACTION = 1 / 8  # share of a canary's features set to the extreme value
EXTREME_RANGES = 3.0  # the extreme value: lo + EXTREME_RANGES * (hi - lo) of the training data
DESIGN = ("a training image relabelled to another class, 1/8 of its features set to lo + 3 (hi - lo); each canary in "
          "client (index mod clients)")
SCORE_BATCH = 1024  # canaries scored per forward pass


@dataclass(frozen=True)
class CanaryRecords:
    """The canaries of one audit: records x [m, *input shape] and labels y [m], the inclusion bits, and each
    canary's client (index mod clients, fixed before the bits are drawn)."""

    x: torch.Tensor
    y: torch.Tensor
    included: np.ndarray
    owners: np.ndarray

    def holders(self) -> set[int]:
        """The clients that hold at least one included canary."""
        return {int(c) for c in self.owners[self.included]}


def canary_records(data: FederatedDataset, m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """m canary records (x, y) for `data`: seeded training images, relabelled to a different class, with a seeded
    EXTREME_FRACTION of their features set to lo + EXTREME_RANGES (hi - lo) of the training data's range."""
    if data.n_classes < 2:
        raise ValueError("the sample-level audit relabels canaries, so it needs a classification dataset with at "
                         f"least 2 classes, got n_classes={data.n_classes}")
    rng = numpy_generator(seed, Purpose.AUDIT, 0, RECORDS_STREAM)
    xs = torch.cat([c.x_train for c in data.clients])
    ys = torch.cat([c.y_train for c in data.clients])
    d = int(np.prod(tuple(data.input_shape)))
    lo, hi = float(xs.min()), float(xs.max())
    value = lo + EXTREME_RANGES * (hi - lo if hi > lo else 1.0)
    pick = torch.from_numpy(rng.integers(0, len(xs), m))
    x = xs[pick].reshape(m, d).clone()
    shift = rng.integers(1, data.n_classes, m)  # a label other than the image's own
    y = torch.from_numpy((ys[pick].numpy().astype(np.int64) + shift) % data.n_classes).to(ys.dtype)
    k = max(1, int(round(EXTREME_FRACTION * d)))
    for i in range(m):
        x[i, torch.from_numpy(rng.choice(d, k, replace=False))] = value
    return x.reshape(m, *tuple(data.input_shape)), y


def with_canaries(data: FederatedDataset, canaries: CanaryRecords, relation: str, seed: int) -> FederatedDataset:
    """`data` with each client's canaries appended to its training records: included ones, and under replace-one a
    filler (a seeded copy of one of the client's own records) for each excluded one. Test and validation splits,
    the global test set and everything else are unchanged."""
    # one filler draw per canary whatever the bits, so flipping one canary's bit changes its slot and nothing else
    fill = numpy_generator(seed, Purpose.AUDIT, 0, FILLER_STREAM).random(len(canaries.included))
    clients = []
    for k, c in enumerate(data.clients):
        xs, ys = [c.x_train], [c.y_train]
        for i in np.flatnonzero(canaries.owners == k):
            if canaries.included[i]:
                xs.append(canaries.x[i: i + 1].to(c.x_train.dtype))
                ys.append(canaries.y[i: i + 1].to(c.y_train.dtype))
            elif relation == REPLACE_ONE:
                j = min(int(fill[i] * c.n_train), c.n_train - 1)
                xs.append(c.x_train[j: j + 1])
                ys.append(c.y_train[j: j + 1])
        clients.append(ClientData(torch.cat(xs), torch.cat(ys), c.x_test, c.y_test, c.x_val, c.y_val))
    info = {**data.info, "audit_canaries": int(len(canaries.included)), "audit_relation": relation}
    return FederatedDataset(clients, data.x_test, data.y_test, data.n_classes, tuple(data.input_shape), info)


@torch.no_grad()
def canary_scores(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                  loss: str) -> np.ndarray:
    """Minus the per-record loss of `model` with `params` on the canaries (eval mode): higher = guessed included."""
    return -per_sample_loss(loss)(outputs(model, params, x, SCORE_BATCH), y).double().numpy()


def claimed_relation(cfg: RunConfig) -> str:
    """The neighbouring relation of the run's record-level claim: replace-one for fixed-size DP-SGD batches and for
    Noisy-FedAvg/FedProx (its f-DP analysis replaces one record), add/remove otherwise (Poisson DP-SGD)."""
    p = cfg.privacy
    if p.mechanism == "param_noise" or (p.mechanism == "dpsgd" and p.sampling == "fixed"):
        return REPLACE_ONE
    return ADD_REMOVE


def _refuse(cfg: RunConfig, unit: str | None) -> None:
    if unit not in ("sample", "none", None):
        raise ValueError(f"algorithm {cfg.algorithm.name!r} protects {unit}-level privacy; the sample-level audit "
                         "needs a sample-level mechanism (dpsgd, param_noise) or a non-private run "
                         "(audit_client_level audits client-level ones)")


def audit_sample_level(cfg: RunConfig, canaries: int = 200, confidence: float = 0.95, *,
                       data: FederatedDataset | None = None, model: nn.Module | None = None) -> dict[str, Any]:
    """Run `cfg` with `canaries` canary records (each included with probability 1/2) and return the audit:
    epsilon_lower_bound, epsilon_reported (the largest ε the run reports for a client holding an included canary;
    None for a non-private run), unit "sample", canaries, confidence and the facts behind the bound.

    `data` / `model`: the objects a config with ``data.dataset: provided`` / ``model.name: provided`` runs on.
    """
    if isinstance(canaries, bool) or not isinstance(canaries, (int, np.integer)) or canaries < 2:
        raise ValueError(f"an audit needs at least 2 canaries, got {canaries!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    _refuse(cfg, cfg.privacy.unit)
    refuse_mismatched_objects(cfg, data, model, "audit_sample_level(cfg")
    base = data if data is not None else build_data(cfg)
    n, m = base.n_clients, int(canaries)
    included = numpy_generator(cfg.seed, Purpose.AUDIT, 0, INCLUSION_STREAM).random(m) < 0.5
    x, y = canary_records(base, m, cfg.seed)
    canary = CanaryRecords(x, y, included, np.arange(m) % n)
    relation = claimed_relation(cfg)
    audited = config_to_dict(cfg)
    audited["data"] = {"dataset": PROVIDED, "clients": n}  # the same split, plus the canaries
    run = build_run(validate_config(audited), data=with_canaries(base, canary, relation, cfg.seed), model=model)
    unit = run.algorithm.unit
    _refuse(cfg, unit)
    local = run.algorithm.local
    if local.private:  # the relation the ledger accounts under must be the one the canaries were inserted for
        event = local.event(int(run.n_records[0]), int(run.batch_sizes[0]), float(run.noise[0]))
        if event is not None and neighboring_relation(event) != relation:
            raise RuntimeError(f"the run is accounted under {neighboring_relation(event)} adjacency, the canaries were "
                               f"inserted for {relation}")
    loss = local.spec.loss
    result = run.run()
    scores = canary_scores(run.model, result.params, canary.x, canary.y, loss)
    rows = [c.to_dict() for c in result.privacy.clients]
    holders = canary.holders()
    rows = [c for c in rows if c["client"] in holders] or rows  # no canary included: the run's largest
    reported, delta = reported_claim(rows if unit is not None else [])
    bound = lower_bound(scores, included, delta, confidence)
    return {**bound.to_dict(), "epsilon_reported": reported, "unit": "sample",
            "statistic": f"-({loss} loss of the final global model on the canary)", "canary_design": DESIGN,
            "relation": relation, "included": int(included.sum()), "records": [int(v) for v in run.n_records],
            "algorithm": cfg.algorithm.name, "mechanism": cfg.privacy.mechanism, "rounds_run": len(result.history),
            "stop_reason": result.stop_reason, "refuted": reported is not None and bound.epsilon_lower_bound > reported}

"""Empirical privacy audit of a run's client-level mechanism: canary clients, one training run, a lower bound on ε.

Andrew et al. (2024, "One-shot Empirical Privacy Estimation for Federated Learning", arXiv 2302.03098): m canary
clients whose updates are random directions c_i in parameter space are each added to the population with
probability 1/2 (seeded). They are ordinary clients of the run (selected, accounted and charged like the others);
only their local update is replaced, before the upload stage, by CANARY_SCALE · clip · c_i, so every clipping and
every noise of the mechanism under audit acts on it. After the run each canary is scored by the cosine between c_i
and the final model's change (the released model; random directions in high dimension are nearly orthogonal to
everything else), and Steinke et al.'s one-run bound (`one_run.py`) turns guesses on the canaries into an
empirical LOWER bound on ε at 95% confidence. A correct mechanism gives a bound at most its reported ε (except
with probability 1 − confidence); a run that forgot to clip or to add noise shows a larger one.

What it does not prove: a bound below the reported ε says only that this attack did not refute the claim; it is
not evidence that the reported ε is tight. Scope: client-level mechanisms (udp, central DP-FedAvg, and their
secure-aggregation forms) and non-private runs; sample-level mechanisms are audited with canary records
(`sample_audit.py`; `audit_config` picks the audit of the run's unit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dpfl.attacks.one_run import lower_bound
from dpfl.engine import params as P
from dpfl.experiment.build import build_run
from dpfl.experiment.config import ConfigError, RunConfig, config_to_dict, validate_config
from dpfl.seeding import Purpose, numpy_generator, torch_generator

CANARY_SCALE = 10.0  # canary update norm / clip: clipping must act on it, so a run that does not clip is caught
STATISTIC = "cosine(canary direction, final model - initial model)"


@dataclass
class ClientCanaries:
    """The canaries of one audit: unit directions [m, D], inclusion bits, and the client ids of the included ones
    (appended after the run's own clients, in canary order)."""

    directions: torch.Tensor
    included: np.ndarray
    first_client: int
    norm: float

    def __post_init__(self) -> None:
        self._canary_of = np.flatnonzero(self.included)

    def replace_updates(self, ids: list[int], deltas: P.Params, round_: int) -> P.Params:
        """FederatedRun.update_hook: a canary client's update becomes its direction times `norm`."""
        rows = [k for k, i in enumerate(ids) if i >= self.first_client]
        if not rows:
            return deltas
        flat = P.flatten(deltas).clone()
        for k in rows:
            flat[k] = self.norm * self.directions[int(self._canary_of[ids[k] - self.first_client])].to(flat.dtype)
        return P.unflatten(flat, deltas)


def reported_claim(rows: list[dict[str, Any]]) -> tuple[float | None, float]:
    """(ε, δ) the audited canaries are claimed to have: the largest of the run's one guarantee per client
    (`epsilon_guarantee`: the ledger's ε, or Noisy-FedAvg's f-DP headline) over the rows given, at their largest δ;
    (None, 0) when there is no row (a non-private run)."""
    if not rows:
        return None, 0.0
    return (max(float(c.get("epsilon_guarantee", c["epsilon_spent"])) for c in rows),
            max(float(c["delta"]) for c in rows))


def _with_clients(cfg: RunConfig, clients: int) -> RunConfig:
    data = config_to_dict(cfg)
    if isinstance(data["privacy"].get("budgets"), list):
        raise ConfigError("privacy.budgets: an audit adds canary clients, so it needs one budget for every client "
                          "or a distribution, not a list per client", "privacy.budgets")
    data["data"]["clients"] = clients
    return validate_config(data)


def audit_client_level(cfg: RunConfig, canaries: int = 200, confidence: float = 0.95) -> dict[str, Any]:
    """Run `cfg` with `canaries` canary clients (each included with probability 1/2) and return the audit:
    epsilon_lower_bound, epsilon_reported (the largest ε the run's ledger reports for a canary client; None for a
    non-private run), unit, canaries, confidence and the facts behind the bound."""
    if canaries < 2:
        raise ValueError(f"an audit needs at least 2 canaries, got {canaries}")
    if cfg.privacy.unit == "sample":
        raise ValueError(f"algorithm {cfg.algorithm.name!r} protects sample-level privacy: audit it with canary "
                         "records (sample_audit.audit_sample_level, or audit_config)")
    n = cfg.data.clients
    included = numpy_generator(cfg.seed, Purpose.AUDIT).random(canaries) < 0.5
    audited = _with_clients(cfg, n + int(included.sum()))
    run = build_run(audited)
    start = run.initial_state().params
    dim = P.num_parameters(start)
    g = torch_generator(cfg.seed, Purpose.AUDIT, 0, 1)
    directions = torch.randn(canaries, dim, generator=g, dtype=torch.float64)
    directions /= directions.norm(dim=1, keepdim=True)
    clip = cfg.privacy.clip if cfg.privacy.clip is not None else 1.0
    canary = ClientCanaries(directions, included, n, CANARY_SCALE * clip)
    run.update_hook = canary.replace_updates
    result = run.run()
    change = (P.flatten(result.params, leading=0) - P.flatten(start, leading=0)).to(torch.float64)
    scores = (directions @ change / max(float(change.norm()), 1e-300)).numpy()
    rows = [c.to_dict() for c in result.privacy.clients if c.client >= n]
    reported, delta = reported_claim(rows if run.algorithm.unit is not None else [])
    bound = lower_bound(scores, included, delta, confidence)
    return {**bound.to_dict(), "epsilon_reported": reported, "unit": "client", "statistic": STATISTIC,
            "included": int(included.sum()), "canary_norm": canary.norm, "algorithm": cfg.algorithm.name,
            "mechanism": cfg.privacy.mechanism, "rounds_run": len(result.history), "stop_reason": result.stop_reason,
            "refuted": reported is not None and bound.epsilon_lower_bound > reported}


def audit_config(cfg: RunConfig, canaries: int = 200, confidence: float = 0.95) -> dict[str, Any]:
    """The audit of the run's own unit: canary records for a sample-level mechanism (`sample_audit`), canary
    clients for a client-level one or a non-private run."""
    if cfg.privacy.unit == "sample":
        from dpfl.evaluate.sample_audit import audit_sample_level

        return audit_sample_level(cfg, canaries, confidence)
    return audit_client_level(cfg, canaries, confidence)

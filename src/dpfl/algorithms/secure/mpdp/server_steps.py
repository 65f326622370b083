"""The server's side of MP-DP's FedSGD round and of its baselines (spec bidirectional.md §3, §6, §9).

- `PerturbedModelServer` (MP-DP, MP-DP-Naive): MP_Server draws the round's secret factors and broadcasts the
  perturbed model (`broadcast`); MU_Server recovers the mean gradient at the true model from the uploads' sums with
  those secrets and updates every layer (`update`). The secrets live in the step's state from the broadcast to the
  update of their round only; the state checkpointed between rounds holds the last broadcast (what a curious client
  saw), never a secret.
- `GradientMeanServer` (FedSGD, MP-CDP): the mean of the gradients (MP-CDP: plus N(0, (S σ / K)^2) from the run's
  one noise generator, whose state is the step's state).
- `ThresholdPaillierServer` (TP-SMC): the product of the ciphertexts, decrypted by `threshold` key holders.

Models are float64 tensors in the FactorPlan's order (the network's parameters in registration order).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.secure.mpdp.algorithm import mean_gradient, round_audit
from dpfl.algorithms.secure.mpdp.perturb import ClientPayload, FactorPlan, mp_server, round_generator
from dpfl.algorithms.secure.mpdp.privacy_statement import stated_privacy
from dpfl.algorithms.secure.mpdp.round_settings import RoundSettings
from dpfl.algorithms.secure.mpdp.update import apply_update
from dpfl.algorithms.secure.mpdp.upload_round import upload_check
from dpfl.algorithms.secure.mpdp.uploads import PerturbedUploads
from dpfl.algorithms.secure.threshold_paillier import ThresholdKeys
from dpfl.algorithms.secure.tpsmc import Ciphertexts, decrypted_mean
from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
from dpfl.engine import params as P
from dpfl.seeding import Purpose, derive_seed, torch_generator


def _updated(params: P.Params, grads: list[torch.Tensor], lr: float) -> P.Params:
    """params - lr * grads, the tensors in params' order."""
    return dict(zip(params, apply_update(list(params.values()), grads, lr), strict=True))


@dataclass(frozen=True)
class _StatedPrivacy(ServerStep):
    """A step of the family: its method's settings, per-round privacy statement and per-round ε."""

    settings: RoundSettings = None  # type: ignore[assignment]
    info: dict[str, Any] = field(default_factory=dict)
    epsilon: float = 0.0
    clients: int = 1

    def privacy_notes(self, state: Any, history: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        return stated_privacy(self.info, self.settings, self.epsilon, self.clients, history)


def client_view(state: dict[str, Any], plan: FactorPlan) -> ClientPayload | None:
    """The last perturbed model the clients received (None before round 1), from a `PerturbedModelServer`'s state."""
    view = state.get("view") if state else None
    if view is None:
        return None
    return ClientPayload(tuple(view["odd"]), tuple(view["transitional"]), plan.sizes, int(view["round_id"]), plan,
                         tuple(view["shortcuts"]), int(view["attempt"]))


@dataclass(frozen=True)
class PerturbedModelServer(_StatedPrivacy):
    """MP_Server and MU_Server. `reproducible_secrets`: the factors come from the run seed, round and attempt (a
    simulation; a deployment draws them from the OS)."""

    plan: FactorPlan = None  # type: ignore[assignment]
    reproducible_secrets: bool = True
    on_broadcast: Callable[[ClientPayload, list[torch.Tensor]], Any] | None = None  # observer (tests of G2)

    encodes_broadcast = True

    def init(self, params: P.Params) -> dict[str, Any]:
        if [tuple(t.shape) for t in params.values()] != self.plan.shapes():
            raise ValueError(f"the model's tensors {[tuple(t.shape) for t in params.values()]} do not match MP-DP's "
                             f"plan {self.plan.shapes()}")
        return {"secrets": None, "view": None}

    def broadcast(self, state: Any, global_params: P.Params, clients: Sequence[int], seed: int, round_: int,
                  attempt: int = 0) -> tuple[ClientPayload, dict[str, Any]]:
        t0 = time.perf_counter()
        gen = round_generator(derive_seed(seed, Purpose.SERVER_NOISE, round_, attempt)
                              if self.reproducible_secrets else None)
        payload, secrets = mp_server(list(global_params.values()), self.plan, gen, round_, self.settings.mask_scale)
        payload = replace(payload, attempt=attempt)
        if self.on_broadcast is not None:  # what the clients receive, next to the true model
            self.on_broadcast(payload, list(global_params.values()))
        view = {"odd": list(payload.odd), "transitional": list(payload.transitional),
                "shortcuts": list(payload.shortcuts), "round_id": round_, "attempt": attempt}
        return payload, {"secrets": secrets, "view": view, "cohort": len(clients),
                         "broadcast_seconds": time.perf_counter() - t0}

    def update(self, state: Any, params: P.Params, uploads: PerturbedUploads, inputs: RoundInputs) -> ServerUpdate:
        sec, st = state.get("secrets"), self.settings
        if sec is None:
            raise ValueError("MP-DP's server recovers a round only after broadcasting its perturbed model")
        t0 = time.perf_counter()
        new = _updated(params, uploads.sums.recovered_mean(sec), st.lr)
        metrics: dict[str, Any] = {"server_seconds": state["broadcast_seconds"],
                                   "recover_update_seconds": time.perf_counter() - t0}
        checks = [upload_check(res, sec, st.S) for res in uploads.clean.values()]  # simulation diagnostics
        violations, ratio = sum(over for over, _ in checks), [r for _, r in checks]
        metrics.update(violations=int(violations), uploads=uploads.sums.count, recovery_ratio=float(np.median(ratio)))
        if uploads.reduced:
            metrics["reduced_protection"] = uploads.reduced
        audit = round_audit(sec, st, state["cohort"])
        if audit is not None:
            metrics.update(epsilon_conditional=audit["epsilon_conditional"], min_R=audit["R_quantiles"]["min"],
                           conditional_audit_label=audit["label"])
        return ServerUpdate(new, {"secrets": None, "view": state["view"]}, metrics)


@dataclass(frozen=True)
class GradientMeanServer(_StatedPrivacy):
    """FedSGD's server; MP-CDP's (`settings.sigma_cdp` > 0) adds N(0, (S σ_cdp / K)^2) to the mean, drawn from one
    generator seeded by the run (its state is the step's state, so a resumed run draws the same noise)."""

    seed: int = 0

    @property
    def central_noise(self) -> bool:  # type: ignore[override]
        return self.settings.method == "mp_cdp"

    def init(self, params: P.Params) -> dict[str, Any]:
        return {"noise": torch_generator(self.seed, Purpose.SERVER_NOISE).get_state()}

    def update(self, state: Any, params: P.Params, uploads: dict[int, list[torch.Tensor]],
               inputs: RoundInputs) -> ServerUpdate:
        gen = torch.Generator()
        gen.set_state(state["noise"])
        mean, violations = mean_gradient(list(uploads.values()), list(params.values()), self.settings, gen)
        return ServerUpdate(_updated(params, mean, self.settings.lr), {"noise": gen.get_state()},
                            {"violations": violations, "uploads": len(uploads)})


@dataclass(frozen=True)
class ThresholdPaillierServer(_StatedPrivacy):
    """TP-SMC's aggregator: multiplies the clients' ciphertexts position by position; `threshold` clients partially
    decrypt the sums (their key shares, from the simulation's dealer) and the combination gives the exact sum."""

    keys: ThresholdKeys = None  # type: ignore[assignment]

    secure = True  # the aggregator decrypts only the sum
    central_noise = True  # ... of the clients' noise shares: MP-CDP's Gaussian if h clients are honest

    def update(self, state: Any, params: P.Params, uploads: Ciphertexts, inputs: RoundInputs) -> ServerUpdate:
        t0 = time.perf_counter()
        mean = decrypted_mean(uploads, self.keys, list(params.values()))
        return ServerUpdate(_updated(params, mean, self.settings.lr), state,
                            {"decrypt_seconds": time.perf_counter() - t0, "uploads": len(uploads.ciphertexts)})

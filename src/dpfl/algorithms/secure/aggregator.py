"""Aggregators whose server sees only the secure sum of the uploads (Bonawitz et al. 2017, `protocol.py`).

`SecureFedAvg`: FedAvg where the server learns only sum_i w_i Δ_i (uniform, or by record count with the counts
summed alongside). `DistributedDPFedAvg`: central DP-FedAvg (McMahan et al. 2018) without a trusted server: each
client clips its update to S and adds its share N(0, z^2 S^2 / t) of the noise; any sum the protocol can reveal has
at least t contributors, so it carries at least the central noise N(0, z^2 S^2) and the central accounting applies
against the server itself (the observer 'aggregate'). The engine hands the cohort's uploads over in one process;
the server side below touches only masked vectors and the unmasked total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.client.udp import ClippedNoisyUpdate
from dpfl.algorithms.secure.errors import SecAggConfigError
from dpfl.algorithms.secure.protocol import SecAggParams, SecAggResult, default_threshold
from dpfl.algorithms.secure.ring import FixedPointRing
from dpfl.algorithms.secure.simulate import secure_sum
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
from dpfl.engine import params as P
from dpfl.seeding import Purpose, numpy_generator

@dataclass(frozen=True)
class SecureAggregation:
    """The protocol's settings for a run. threshold None: floor(K/2) + 1 of the K selected clients. dropout: the
    share of each round's clients that (in simulation) leave after sharing keys and before uploading, the costliest
    stage for the server; drawn from the run seed, independently of any data."""

    threshold: int | None = None
    ring_bits: int = 64
    frac_bits: int | None = None
    dropout: float = 0.0
    workers: int = 1
    run_id: bytes = b"dpfl"

    def __post_init__(self) -> None:
        if not 0 <= self.dropout < 1:
            raise SecAggConfigError(f"secure aggregation dropout must be in [0, 1), got {self.dropout}")
        FixedPointRing(self.ring_bits, self.frac_bits_resolved)  # checks the ring

    @property
    def frac_bits_resolved(self) -> int:
        return self.frac_bits if self.frac_bits is not None else (32 if self.ring_bits == 64 else 16)

    def threshold_for(self, cohort: int) -> int:
        return self.threshold if self.threshold is not None else default_threshold(cohort)

    def params(self, clients: list[int], dim: int, round_: int) -> SecAggParams:
        ring = FixedPointRing(self.ring_bits, self.frac_bits_resolved, len(clients))
        return SecAggParams(tuple(clients), self.threshold_for(len(clients)), dim, ring, self.run_id, round_)

    def dropped(self, clients: list[int], seed: int, round_: int) -> list[int]:
        n = int(math.floor(self.dropout * len(clients)))
        if n == 0:
            return []
        rng = numpy_generator(seed, Purpose.SECAGG, round_)
        return sorted(int(c) for c in rng.choice(clients, n, replace=False))

    def describe(self) -> dict[str, Any]:
        """The protocol block of privacy.json: what ran and what its accounting does not cover."""
        return {
            "protocol": "secure aggregation with dropouts (Bonawitz et al. 2017): X25519 + HKDF-SHA256 key agreement, "
                        "AES-GCM encrypted Shamir shares, ChaCha20 masks in Z/2^k",
            "threat_model": "honest-but-curious server; it learns the sum of the uploads of >= t clients and nothing "
                            "else about any one of them unless it colludes with t or more clients; dropouts are "
                            "honest (a client that leaves is not controlled by the server)",
            "threshold": self.threshold if self.threshold is not None else "floor(K/2) + 1",
            "ring_bits": self.ring_bits, "frac_bits": self.frac_bits_resolved, "dropout": self.dropout,
            "discretisation": "UNACCOUNTED: uploads are rounded to multiples of 2^-frac_bits before summing (error <= "
                              "2^-(frac_bits+1) per client and coordinate); the accounting treats the revealed sum as "
                              "real-valued",
        }

    def run(self, rows: dict[int, np.ndarray], seed: int, round_: int) -> SecAggResult:
        clients = sorted(rows)
        params = self.params(clients, len(next(iter(rows.values()))), round_)
        drop = {"masked_input": self.dropped(clients, seed, round_)}
        return secure_sum(rows, params, drop, server_workers=self.workers)


def _reveal(protocol: SecureAggregation, rows: dict[int, np.ndarray], seed: int,
            round_: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The protocol's revealed sum of `rows`, and the round's metrics."""
    result = protocol.run(rows, seed, round_)
    server = sum(v for k, v in result.seconds.items() if not k.startswith("client"))
    return result.total, {"secagg_included": len(result.included), "secagg_dropped": len(result.dropped_after_sharing),
                          "secagg_server_seconds": server,
                          "secagg_client_seconds_max": result.seconds.get("client_max", 0.0)}


class SecureSumStep(ServerStep):
    """A server step that sees only the protocol's revealed sums (`protocol`, a `SecureAggregation`): what the secure
    steps share. `update` is theirs; `aggregate` is its stateless form."""

    protocol: SecureAggregation
    secure = True

    def aggregate(self, global_params: P.Params, uploads: P.Params, view: ServerView, seed: int,
                  round_: int) -> P.Params:
        return self.update(None, global_params, uploads, RoundInputs(view, seed, round_)).params

    def protocol_description(self) -> dict[str, Any]:
        return self.protocol.describe()


@dataclass(frozen=True)
class SecureFedAvg(SecureSumStep):
    """w <- w + server_lr * (secure sum of p_i Δ_i) / (sum of p_i over the clients in the sum).

    p_i = 1 (`uniform`) or the record count (`samples`, summed in one extra secure coordinate). Clients that drop
    out are simply absent from both sums.
    """

    protocol: SecureAggregation = field(default_factory=SecureAggregation)
    weighting: str = "uniform"
    server_lr: float = 1.0

    def __post_init__(self) -> None:
        if self.weighting not in ("uniform", "samples"):
            raise SecAggConfigError(f"secure FedAvg weights uniformly or by record count, not {self.weighting!r}")

    def update(self, state: Any, params: P.Params, uploads: P.Params, inputs: RoundInputs) -> ServerUpdate:
        view = inputs.view
        flat = P.flatten(uploads).to(torch.float64).numpy()
        ids = [int(c) for c in view.clients]
        weights = view.n_records.to(torch.float64).numpy() if self.weighting == "samples" else np.ones(len(ids))
        rows = {c: np.append(weights[k] * flat[k], weights[k]) for k, c in enumerate(ids)}
        total, metrics = _reveal(self.protocol, rows, inputs.seed, inputs.round_)
        mean = torch.from_numpy(total[:-1] / total[-1]).to(torch.float32)
        return ServerUpdate(P.axpy(self.server_lr, P.unflatten(mean, params, leading=0), params), state, metrics)


@dataclass(frozen=True)
class DistributedDPFedAvg(SecureSumStep, CentralDPFedAvg):
    """Central DP-FedAvg's mechanism with the noise made by the clients and the sum made by secure aggregation.

    Client i uploads clip_S(Δ_i) + N(0, z^2 S^2 / t) through the protocol; the server divides the revealed sum by
    the expected cohort. A revealed sum has s >= t contributors and noise variance s z^2 S^2 / t >= z^2 S^2.

    With `adaptive_clipping` the count is summed securely too: client i appends its centred indicator
    1[||Δ_i|| <= C_t] - 1/2 plus N(0, σ_b^2 / t) (its share of the count noise, from its own stream
    `Purpose.CLIP_COUNT`) to its upload clip_{C_t}(Δ_i) + N(0, z_Δ^2 C_t^2 / t), and the protocol reveals both sums
    at once. A revealed sum of s >= t contributors carries s/t >= 1 times the central variances of both, so it is at
    least as private as the central release of Theorem 1.
    """

    protocol: SecureAggregation = field(default_factory=SecureAggregation)

    def clients_stage(self, cohort: int, clip: float | None = None) -> ClippedNoisyUpdate:
        """What each client does: clip to S (`clip`: the round's adaptive clip C_t) and add its share
        N(0, z_Δ^2 S^2 / t), the udp upload stage split over t (z_Δ = z for a fixed clip)."""
        return ClippedNoisyUpdate(self.clip if clip is None else clip, self.update_noise_multiplier,
                                  cohort=self.protocol.threshold_for(cohort), secure_sum=True)

    def share_std(self, cohort: int, clip: float | None = None) -> float:
        """The standard deviation of one client's noise share (in parameter units)."""
        stage = self.clients_stage(cohort, clip)
        return stage.upload_multiplier * stage.clip

    def count_share_std(self, cohort: int) -> float:
        """σ_b / sqrt(t): the std of one client's share of the adaptive clip's count noise."""
        return self.count_noise / math.sqrt(self.protocol.threshold_for(cohort))

    def update(self, state: Any, params: P.Params, uploads: P.Params, inputs: RoundInputs) -> ServerUpdate:
        if self.noise_multiplier is None:
            raise ValueError("the clients' noise multiplier is not calibrated yet (run it through FederatedRun)")
        view, seed, round_ = inputs.view, inputs.seed, inputs.round_
        ids = [int(c) for c in view.clients]
        adaptive = self.adaptive_clipping is not None
        clip = self.clip_of(state) if adaptive else None
        shares = P.flatten(self.clients_stage(len(ids), clip).apply(uploads, ids, seed, round_)).to(torch.float64)
        rows = {c: shares[k].numpy() for k, c in enumerate(ids)}
        if adaptive:  # each client appends its centred indicator plus its share of the count noise
            norms = P.flatten(uploads).norm(dim=1)
            std = self.count_share_std(len(ids))
            rows = {c: np.append(rows[c], float(norms[k] <= clip) - 0.5
                                 + std * numpy_generator(seed, Purpose.CLIP_COUNT, round_, c).standard_normal())
                    for k, c in enumerate(ids)}
        total, metrics = _reveal(self.protocol, rows, seed, round_)
        metrics["secagg_noise_share_std"] = self.share_std(len(ids), clip)
        if adaptive:
            total, noised_centred = total[:-1], float(total[-1])
        update = torch.from_numpy(total / view.expected_clients).to(torch.float32)
        new = P.axpy(self.server_lr, P.unflatten(update, params, leading=0), params)
        if not adaptive:
            return ServerUpdate(new, state, metrics)
        step = self._adapted(new, clip, noised_centred, view.expected_clients)
        return ServerUpdate(step.params, step.state, {**metrics, **step.metrics})

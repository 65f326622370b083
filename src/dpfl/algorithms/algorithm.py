"""An algorithm is a named bundle of round stages: select -> broadcast -> local -> upload -> aggregate.

The bundle also declares its privacy semantics (unit, observer, mechanism), which the runner and the
privacy report restate. New algorithms add stages, never branches in the round loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from dp_accounting import DpEvent

from dpfl.algorithms.client.program import LocalProgram
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.engine import params as P


class UploadStage(Protocol):
    """What leaves a client. `event(client, round_, cohort)` is the DP event of one participation in round
    `round_` (0-based) when `cohort` uploads are averaged (None for a stage that is no mechanism)."""

    unit: str | None
    accounted: bool

    def apply(self, deltas: P.Params, clients: Any, seed: int, round_: int) -> P.Params: ...
    def event(self, client: int, round_: int, cohort: int) -> DpEvent | None: ...
    def bytes_per_upload(self, dim: int) -> int: ...
    def describe(self) -> str: ...


class Aggregator(Protocol):
    def aggregate(self, global_params: P.Params, uploads: P.Params, n_records: torch.Tensor, expected_clients: float,
                  seed: int, round_: int) -> P.Params: ...


@dataclass(frozen=True)
class Algorithm:
    name: str
    local: LocalProgram
    selection: Selection = field(default_factory=Selection)
    upload: Any = field(default_factory=FullUpdate)
    aggregator: Any = field(default_factory=FedAvg)
    personal: Any = None  # client-side state that never leaves the client (PPSGD's u_k), or None

    def __post_init__(self) -> None:
        if len(self.units) > 1:
            raise ValueError(f"algorithm {self.name!r} mixes privacy units {sorted(self.units)}; "
                             "a run protects one unit")

    @property
    def central(self) -> bool:
        return isinstance(self.aggregator, CentralDPFedAvg)

    @property
    def units(self) -> set[str]:
        """The units the stages protect: each stage that is a DP mechanism declares one."""
        found = {"sample" if self.local.private else None, self.upload.unit, "client" if self.central else None}
        return {u for u in found if u}

    @property
    def unit(self) -> str | None:
        """What one DP guarantee protects: 'sample' (a record of a client), 'client', or None (not private)."""
        return next(iter(self.units), None)

    @property
    def observer(self) -> str:
        """Who the guarantee holds against."""
        secure = getattr(self.aggregator, "secure", False)
        if self.central and secure:
            return ("anyone who sees the global models, the server included: it sees only the secure-aggregation sum "
                    "of the clients' clipped, noised updates (honest-but-curious server; colluding clients can remove "
                    "their own noise shares, see docs/secure.md)")
        if self.central:
            return "anyone who sees the global models (the server is trusted: it sees individual updates)"
        if secure and getattr(self.upload, "secure_sum", False):
            return ("the server and anyone who sees the global models: the server sees only secure-aggregation sums "
                    "of at least t noised uploads, and knows who took part (no amplification by client sampling is "
                    "claimed; colluding clients can remove their own noise shares, see docs/secure.md)")
        if secure and self.unit is not None:
            return ("the server, as if it saw every individual upload (it sees only their secure-aggregation sum, so "
                    "this guarantee is conservative)")
        if getattr(getattr(self.upload, "accounting", None), "view", None) == "aggregate":
            return ("anyone who sees only the averaged models (individual uploads hidden by secure aggregation or a "
                    "trusted aggregator)")
        return "the server, which sees every individual upload"

    @property
    def mechanism(self) -> str:
        parts = []
        if self.local.private:
            parts.append(f"DP-SGD ({self.local.sampling} sampling, per-sample clip {self.local.spec.clip})")
        if self.upload.unit:
            label = "" if self.upload.accounted else " (NOT accounted: no epsilon is computed for it)"
            parts.append(f"{self.upload.describe()}{label}")
        if self.central and getattr(self.aggregator, "secure", False):
            parts.append(f"distributed Gaussian: each client clips its update to {self.aggregator.clip} and adds its "
                         "share N(0, z^2 S^2 / t); secure aggregation reveals only sums of >= t clients, which carry "
                         "at least N(0, z^2 S^2)")
        elif self.central:
            parts.append(f"server-side Gaussian on the clipped sum (clip {self.aggregator.clip})")
        return "; ".join(parts) or "none (not private)"

    def uncalibrated_stage(self) -> str | None:
        """The stage ('upload' or 'aggregator') whose noise is unset, to be calibrated from the budgets."""
        for name in ("upload", "aggregator"):
            stage = getattr(self, name)
            if hasattr(stage, "with_noise") and stage.noise is None:
                return name
        return None

    @property
    def accounted(self) -> bool:
        """False when some privacy mechanism runs for which no accountant is attached."""
        return bool(self.upload.accounted)


def fedavg(local: LocalProgram, selection: Selection | None = None, weighting: str = "uniform") -> Algorithm:
    """FedAvg; sample-level DP-FedAvg when `local` is DP-SGD (each client with its own noise)."""
    name = "dp_fedavg_local" if local.private else "fedavg"
    return Algorithm(name, local, selection or Selection(), FullUpdate(), FedAvg(weighting))


def central_dp_fedavg(local: LocalProgram, clip: float, noise_multiplier: float, selection: Selection,
                      server_lr: float = 1.0) -> Algorithm:
    """McMahan et al. 2018: client-level DP by server-side clipping and noise."""
    if local.private:
        raise ValueError("central DP-FedAvg protects clients; use a non-private local program")
    return Algorithm("dp_fedavg_central", local, selection, FullUpdate(),
                     CentralDPFedAvg(clip, noise_multiplier, server_lr))

"""An algorithm is a named bundle of round stages: select -> broadcast -> local -> upload -> server step.

The stages' contracts are in `dpfl.algorithms.stages`. The bundle also declares its privacy semantics (unit, observer,
mechanism), derived from its stages, which the runner and the privacy report restate. New algorithms add stages,
never branches in the round loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dpfl.algorithms.client.program import LocalProgram
from dpfl.algorithms.client.upload import FullUpdate
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.central_dp_fedavg import CentralDPFedAvg
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.optimizers import unwrapped
from dpfl.algorithms.stages import ClientState, ServerStep, UploadMechanism, as_server_step


@dataclass(frozen=True)
class Algorithm:
    name: str
    local: LocalProgram
    selection: Selection = field(default_factory=Selection)
    upload: UploadMechanism = field(default_factory=FullUpdate)
    aggregator: ServerStep = field(default_factory=FedAvg)
    personal: ClientState | None = None  # client-side state that never leaves the client (PPSGD's u_k), or None

    def __post_init__(self) -> None:
        if not isinstance(self.upload, UploadMechanism):
            raise TypeError(f"algorithm {self.name!r}: the upload stage must be a dpfl.UploadMechanism, got "
                            f"{type(self.upload).__name__}")
        object.__setattr__(self, "aggregator", as_server_step(self.aggregator))
        if len(self.units) > 1:
            raise ValueError(f"algorithm {self.name!r} mixes privacy units {sorted(self.units)}; "
                             "a run protects one unit")

    @property
    def central(self) -> bool:
        return isinstance(unwrapped(self.aggregator), CentralDPFedAvg)  # under a server optimizer too

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
        secure = self.aggregator.secure
        central = self.central or self.aggregator.central_noise  # the server step adds (or decrypts) the noise
        if central and secure:
            return ("anyone who sees the global models, the server included: it sees only the secure-aggregation sum "
                    "of the clients' clipped, noised updates (honest-but-curious server; colluding clients can remove "
                    "their own noise shares, see docs/secure.md)")
        if central:
            return "anyone who sees the global models (the server is trusted: it sees individual updates)"
        if secure and self.upload.secure_sum:
            return ("the server and anyone who sees the global models: the server sees only secure-aggregation sums "
                    "of at least t noised uploads, and knows who took part (no amplification by client sampling is "
                    "claimed; colluding clients can remove their own noise shares, see docs/secure.md)")
        if secure and self.unit is not None:
            return ("the server, as if it saw every individual upload (it sees only their secure-aggregation sum, so "
                    "this guarantee is conservative)")
        fdp = self.upload.fdp_accounting
        if fdp is not None and fdp.view == "aggregate":
            return ("anyone who sees only the averaged models (individual uploads hidden by secure aggregation or a "
                    "trusted aggregator)")
        return "the server, which sees every individual upload"

    @property
    def mechanism(self) -> str:
        parts = []
        if self.local.private:
            adaptive = self.local.spec.adaptive_clipping
            clip = (f"per-sample clip {self.local.spec.clip}" if adaptive is None else "adaptive per-sample clip of "
                    f"each client's own from {adaptive.initial_clip} to quantile {adaptive.target_quantile}, its count "
                    "noised within its noise multiplier (Andrew et al. 2021, Theorem 1)")
            parts.append(f"DP-SGD ({self.local.sampling} sampling, {clip})")
        if self.upload.unit:
            label = "" if self.upload.accounted else self.upload.unaccounted_label
            parts.append(f"{self.upload.describe()}{label}")
        ac = self.aggregator.adaptive_clipping
        adaptive = "" if ac is None else (f"; the clip is adaptive: S = C_t, from {ac.initial_clip:g} towards the "
                                          f"update norms' {ac.target_quantile:g}-quantile, its noised count and "
                                          "the sum together cost z (privacy.json adaptive_clipping)")
        if self.central and self.aggregator.secure:
            parts.append(f"distributed Gaussian: each client clips its update to {self.aggregator.clip} and adds its "
                         "share N(0, z^2 S^2 / t); secure aggregation reveals only sums of >= t clients, which carry "
                         f"at least N(0, z^2 S^2){adaptive}")
        elif self.central:
            parts.append(f"server-side Gaussian on the clipped sum (clip {self.aggregator.clip}){adaptive}")
        return "; ".join(parts) or "none (not private)"

    def uncalibrated_stage(self) -> str | None:
        """The stage ('upload' or 'aggregator') whose noise is unset, to be calibrated from the budgets."""
        if self.upload.calibration_family is not None and self.upload.noise is None:
            return "upload"
        if self.aggregator.calibration_family is not None and self.aggregator.noise is None:
            return "aggregator"
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

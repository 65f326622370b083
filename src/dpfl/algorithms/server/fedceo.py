"""FedCEO (spec fedceo.md §2-3): every `interval` rounds, smooth the clients' noisy models with T-tSVD.

Between smoothings the server is plain FedAvg (UDP-FedAvg). At a smoothing round it stacks the K
uploaded models per parameter tensor, soft-thresholds the singular values of every DFT slice along the
client mode (threshold ϑ^j / (2λ) at the j-th smoothing) and hands each client its own smoothed model
ŵ_k; the new global model is their mean. A client selected in the round right after a smoothing starts
from its latest ŵ_k (personalised state). Everything is post-processing of the uploads, so privacy is
exactly that of UDP-FedAvg with the same mechanism (Theorem 4.5).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.t_tsvd import smooth_stack_with_stats, threshold
from dpfl.algorithms.server.view import ServerView
from dpfl.algorithms.stages import CheckpointedServerStep, RoundInputs
from dpfl.engine import params as P

STALENESS = ("any", "last")
PROX_DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclass
class FedCEO(CheckpointedServerStep):
    """The FedCEO server with its personal state.

    lam, theta, interval: λ, ϑ ≥ 1 and I of spec §2.3. layers: "all" parameter tensors, or an int n,
    the last n parameterised modules in forward order (the rest get the plain mean, §3.5).
    personalize: clients start from their own ŵ_k in the round after a smoothing (§3.4);
    personal_staleness "any" accepts a client's latest ŵ_k however old, "last" only one from the
    immediately preceding smoothing round. rfft: SVT only the non-redundant half of the spectrum (the
    same result, tested against the full FFT).
    """

    lam: float
    theta: float = 1.0
    interval: int = 1
    layers: str | int = "all"
    personalize: bool = True
    personal_staleness: str = "any"
    prox_dtype: str = "float64"
    rfft: bool = True
    personal: dict[int, P.Params] = field(default_factory=dict, repr=False)
    personal_round: dict[int, int] = field(default_factory=dict, repr=False)
    last_diagnostics: dict[str, Any] = field(default_factory=dict, repr=False)

    personalises_starts = True
    linear_in_updates = False  # smoothing is not a weighted sum: no Σw²σ² noise statistic

    def __post_init__(self) -> None:
        threshold(1, self.lam, self.theta)  # validates λ and ϑ
        if isinstance(self.interval, bool) or not isinstance(self.interval, int) or self.interval < 1:
            raise ValueError(f"FedCEO interval must be an integer >= 1, got {self.interval!r}")
        if self.layers != "all" and (isinstance(self.layers, bool) or not isinstance(self.layers, int)
                                     or self.layers < 1):
            raise ValueError(f"FedCEO layers must be 'all' or a number of last modules >= 1, got {self.layers!r}")
        if self.personal_staleness not in STALENESS:
            raise ValueError(f"personal_staleness must be one of {STALENESS}, got {self.personal_staleness!r}")
        if self.prox_dtype not in PROX_DTYPES:
            raise ValueError(f"prox_dtype must be one of {tuple(PROX_DTYPES)}, got {self.prox_dtype!r}")

    # ---- schedule ----------------------------------------------------------------------------------
    def smooths(self, round_: int) -> bool:
        """Whether 0-based round `round_` (t = round_ + 1) ends with a smoothing."""
        return (round_ + 1) % self.interval == 0

    def threshold_at(self, round_: int) -> float:
        return threshold((round_ + 1) // self.interval, self.lam, self.theta)

    def smoothed_names(self, names: Sequence[str]) -> list[str]:
        """The parameter tensors T-tSVD runs on: all, or those of the last n modules (forward order)."""
        if self.layers == "all":
            return list(names)
        modules: list[str] = []
        for name in names:
            module = name.rsplit(".", 1)[0] if "." in name else ""
            if module not in modules:
                modules.append(module)
        keep = set(modules[-int(self.layers):])
        return [n for n in names if (n.rsplit(".", 1)[0] if "." in n else "") in keep]

    # ---- the round ---------------------------------------------------------------------------------
    def starts(self, global_params: P.Params, clients: Sequence[int], round_: int) -> P.Params | None:
        """Stacked start models `[K, ...]` for this round's clients, or None when all start from w_g.

        Only the round right after a smoothing uses personal models (Algorithm 2, lines 5-8); a client
        without one (or, with staleness "last", without one from that smoothing) starts from w_g.
        """
        if not self.personalize or round_ == 0 or not self.smooths(round_ - 1):
            return None
        own = [self._personal_start(int(c), round_) for c in clients]
        if all(p is None for p in own):
            return None
        return {n: torch.stack([global_params[n] if p is None else p[n] for p in own]) for n in global_params}

    def _personal_start(self, client: int, round_: int) -> P.Params | None:
        if client not in self.personal:
            return None
        if self.personal_staleness == "last" and self.personal_round[client] != round_ - 1:
            return None
        return self.personal[client]

    def step(self, params: P.Params, uploads: P.Params, inputs: RoundInputs) -> P.Params:
        return self.aggregate(params, uploads, inputs.view, inputs.seed, inputs.round_, starts=inputs.starts)

    def aggregate(self, global_params: P.Params, uploads: P.Params, view: ServerView, seed: int, round_: int,
                  starts: P.Params | None = None) -> P.Params:
        """New global model from the uploaded updates (relative to each client's start model)."""
        self.last_diagnostics = {}
        if not self.smooths(round_):
            if starts is None:  # exactly UDP-FedAvg's arithmetic (spec test R1)
                return FedAvg("uniform").aggregate(global_params, uploads, view, seed, round_)
            return {n: (starts[n] + uploads[n]).mean(0) for n in global_params}
        k = len(view)
        base = starts if starts is not None else P.broadcast(global_params, k)
        models = {n: base[n] + uploads[n] for n in global_params}
        thr = self.threshold_at(round_)
        t0 = time.perf_counter()
        zeroed: dict[str, float] = {}
        smoothed = dict(models)
        dtype = PROX_DTYPES[self.prox_dtype]
        for name in self.smoothed_names(list(models)):
            smoothed[name], zeroed[name] = _smooth(models[name], thr, self.rfft, dtype)
        seconds = time.perf_counter() - t0
        for n in models:
            if n not in zeroed:  # unsmoothed tensors: everyone gets the plain mean (§3.5)
                smoothed[n] = models[n].mean(0, keepdim=True).expand_as(models[n]).clone()
        for j, c in enumerate(view.clients.tolist()):
            self.personal[int(c)] = {n: smoothed[n][j].clone() for n in smoothed}
            self.personal_round[int(c)] = round_
        self.last_diagnostics = {"smoothing": (round_ + 1) // self.interval, "threshold": thr,
                                 "zeroed_fraction": zeroed, "prox_seconds": seconds}
        return {n: smoothed[n].mean(0) for n in smoothed}

    def diagnostics(self) -> dict[str, Any]:
        """What the last aggregation logs (threshold, share of singular values zeroed, prox time)."""
        return dict(self.last_diagnostics)

    def personal_models(self, global_params: P.Params | None = None) -> dict[int, P.Params]:
        """Each client's latest smoothed model ŵ_k (for the personalised accuracy)."""
        return self.personal

    # ---- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"personal": self.personal, "personal_round": self.personal_round}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore `state_dict()` output; None resets to the state before round 1."""
        self.personal = {} if state is None else {int(c): dict(p) for c, p in state["personal"].items()}
        self.personal_round = {} if state is None else {int(c): int(r) for c, r in state["personal_round"].items()}


def _smooth(stacked: torch.Tensor, thr: float, rfft: bool, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """T-tSVD of one parameter's K client copies `[K, *shape]`, and the share of singular values zeroed.

    Runs on the `[K, out, rest]` layout (`smooth_stack_with_stats`), equal to fold -> T-tSVD -> unfold up
    to rounding without its permuted copies.
    """
    y, zeroed, _ = smooth_stack_with_stats(stacked, thr, rfft=rfft, dtype=dtype)
    return y, float(zeroed)

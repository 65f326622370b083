"""FedCEO (spec fedceo.md §2-3): every `interval` rounds, smooth the clients' noisy models with T-tSVD.

Between smoothings the server is plain FedAvg (UDP-FedAvg). At a smoothing round it stacks the K
uploaded models per parameter tensor, soft-thresholds the singular values of every DFT slice along the
client mode (threshold ϑ^j / (2λ) at the j-th smoothing) and hands each client its own smoothed model
ŵ_k; the new global model is their mean. A client selected in the round right after a smoothing starts
from its latest ŵ_k (personalised state). Everything is post-processing of the uploads, so privacy is
exactly that of UDP-FedAvg with the same mechanism (Theorem 4.5).

The step is its configuration only; its state (`init`, returned by `update`) is
{"personal": client -> its latest ŵ_k, "personal_round": client -> the 0-based round that wrote it}.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.t_tsvd import smooth_stack_with_stats, threshold
from dpfl.algorithms.stages import RoundInputs, ServerStep, ServerUpdate
from dpfl.engine import params as P

STALENESS = ("any", "last")
PROX_DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclass(frozen=True)
class FedCEO(ServerStep):
    """The FedCEO server step (its personal models live in the state it returns, never in attributes).

    lam, theta, interval: λ, ϑ ≥ 1 and I of spec §2.3. layers: "all" parameter tensors, or an int n,
    the last n parameterised modules in forward order (the rest get the plain mean, §3.5).
    personalize: clients start from their own ŵ_k in the round after a smoothing (§3.4);
    personal_staleness "any" accepts a client's latest ŵ_k however old, "last" only one from the
    immediately preceding smoothing round. rfft: SVT only the non-redundant half of the spectrum (the
    same result, tested against the full FFT). prox_dtype: the T-tSVD's precision, float32 by default (issue 67:
    within ~3e-6 relative of float64's smoothed models at the benchmark sizes, about twice as fast; the FedCEO
    reproduction pins float64, with which its published numbers were made).
    """

    lam: float
    theta: float = 1.0
    interval: int = 1
    layers: str | int = "all"
    personalize: bool = True
    personal_staleness: str = "any"
    prox_dtype: str = "float32"
    rfft: bool = True

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
    def init(self, params: P.Params) -> dict[str, Any]:  # noqa: ARG002
        """No personal models before round 1."""
        return {"personal": {}, "personal_round": {}}

    def start_points(self, state: Any, global_params: P.Params, clients: Sequence[int],
                     round_: int) -> tuple[P.Params | None, Any]:
        """Stacked start models `[K, ...]` for this round's clients, or None when all start from w_g; the state
        is unchanged.

        Only the round right after a smoothing uses personal models (Algorithm 2, lines 5-8); a client
        without one (or, with staleness "last", without one from that smoothing) starts from w_g.
        """
        if not self.personalize or round_ == 0 or not self.smooths(round_ - 1):
            return None, state
        personal, written = _entries(state)
        own = [self._personal_start(personal, written, int(c), round_) for c in clients]
        if all(p is None for p in own):
            return None, state
        return {n: torch.stack([global_params[n] if p is None else p[n] for p in own]) for n in global_params}, state

    def _personal_start(self, personal: dict[int, P.Params], written: dict[int, int], client: int,
                        round_: int) -> P.Params | None:
        if client not in personal:
            return None
        if self.personal_staleness == "last" and written[client] != round_ - 1:
            return None
        return personal[client]

    def update(self, state: Any, params: P.Params, uploads: P.Params, inputs: RoundInputs) -> ServerUpdate:
        """New global model from the uploaded updates (relative to each client's start model `inputs.starts`); at
        a smoothing round the new state holds the participants' ŵ_k, and the metrics say how the smoothing went
        (threshold, share of singular values zeroed per tensor, prox time); otherwise state unchanged, no metrics."""
        view, round_, starts = inputs.view, inputs.round_, inputs.starts
        if not self.smooths(round_):
            if starts is None:  # exactly UDP-FedAvg's arithmetic (spec test R1)
                return ServerUpdate(FedAvg("uniform").aggregate(params, uploads, view, inputs.seed, round_), state, {})
            return ServerUpdate({n: (starts[n] + uploads[n]).mean(0) for n in params}, state, {})
        k = len(view)
        base = starts if starts is not None else P.broadcast(params, k)
        models = {n: base[n] + uploads[n] for n in params}
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
        personal, written = _entries(state)
        for j, c in enumerate(view.clients.tolist()):
            personal[int(c)] = {n: smoothed[n][j].clone() for n in smoothed}
            written[int(c)] = round_
        metrics = {"smoothing": (round_ + 1) // self.interval, "threshold": thr, "zeroed_fraction": zeroed,
                   "prox_seconds": seconds}
        return ServerUpdate({n: smoothed[n].mean(0) for n in smoothed},
                            {"personal": personal, "personal_round": written}, metrics)

    def personal_models(self, state: Any, global_params: P.Params | None = None) -> dict[int, P.Params]:
        """Each client's latest smoothed model ŵ_k in `state` (for the personalised accuracy)."""
        return _entries(state)[0]


def _entries(state: Any) -> tuple[dict[int, P.Params], dict[int, int]]:
    """New dicts of the state's personal models and the rounds that wrote them (client ids as ints, as a
    checkpoint written by any version may hold them), so that writing to them leaves `state` as it was; the
    models themselves are shared (never written in place). None: before round 1."""
    if state is None:
        return {}, {}
    return ({int(c): p for c, p in state["personal"].items()},
            {int(c): int(r) for c, r in state["personal_round"].items()})


def _smooth(stacked: torch.Tensor, thr: float, rfft: bool, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """T-tSVD of one parameter's K client copies `[K, *shape]`, and the share of singular values zeroed.

    Runs on the `[K, out, rest]` layout (`smooth_stack_with_stats`), equal to fold -> T-tSVD -> unfold up
    to rounding without its permuted copies.
    """
    y, zeroed, _ = smooth_stack_with_stats(stacked, thr, rfft=rfft, dtype=dtype)
    return y, float(zeroed)

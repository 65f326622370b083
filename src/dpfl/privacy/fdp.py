"""f-DP (Gaussian DP) accounting of Noisy-FedAvg / Noisy-FedProx with a threat model (spec fdp_accounting.md §1.2, §5).

`fdp_report` turns a run's hyperparameters into μ and ε(δ) on a grid of rounds for each bound that applies:

| view | who observes | noise the adversary cannot remove | bounds |
|---|---|---|---|
| upload (default without secure aggregation) | the server sees each noisy upload | σ, shift m·γ_t | composition |
| aggregate, release transcript | only the averages w_1..w_T | σ√m_h/m | composition |
| aggregate, release final | only the final model (the paper's setting) | σ√m_h/m | composition, shifted-interpolation |

The headline guarantee is the smallest rigorous bound that applies (§4.5). The paper-claimed curve is computed only on
request, labelled "paper-claimed (NOT a guarantee)" everywhere and never the headline. Record-level DP: neighbours
differ in one record of one client. No amplification by mini-batch or client sampling is claimed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpfl.privacy.fdp_bounds import PAPER_VARIANTS, composition_mu, h0_mu, paper_claimed_mu, shifted_mu
from dpfl.privacy.fdp_sensitivity import SCHEDULES, sensitivities, step_sizes
from dpfl.privacy.gdp import gdp_eps

__all__ = ["COMPOSITION", "PAPER", "PAPER_LABEL", "RELEASES", "SHIFTED", "VIEWS", "FdpCurve", "FdpReport",
           "fdp_report", "parse_grid", "resolve_view"]

VIEWS = ("auto", "upload", "aggregate")
RELEASES = ("transcript", "final")
COMPOSITION, SHIFTED, PAPER = "composition", "shifted-interpolation", "paper-claimed"
PAPER_LABEL = "paper-claimed (NOT a guarantee)"
LABELS = {COMPOSITION: "composition (guarantee)",
          SHIFTED: "shifted interpolation, λ in [0, 1] (guarantee if the loss is L-smooth with the ASSUMED L)",
          PAPER: PAPER_LABEL}
VIEW_TEXT = {
    "upload": "upload: the server sees every noisy upload and every global model (noise σ per upload)",
    "aggregate": "aggregate: the observer sees only the averaged models (noise σ·√m_h/m), e.g. behind secure "
                 "aggregation",
}
RELEASE_TEXT = {"transcript": "every global model w_1..w_T is released (every participant receives them)",
                "final": "only the final model w_T is released"}


@dataclass
class FdpCurve:
    """μ and ε(δ) of one bound on the grid of rounds; `is_guarantee` is False for the paper-claimed curve."""

    name: str
    label: str
    is_guarantee: bool
    mu: np.ndarray
    eps: dict[float, np.ndarray]

    def rdp(self, zeta: float) -> np.ndarray:
        """μ-GDP implies (ζ, ζμ²/2)-RDP."""
        return zeta * self.mu**2 / 2


@dataclass
class FdpReport:
    """Every bound's curve with the threat model, the inputs, the assumptions and the warnings."""

    view: str
    release: str
    rounds: np.ndarray
    deltas: tuple[float, ...]
    curves: list[FdpCurve]
    headline: str
    params: dict[str, Any]
    assumptions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def curve(self, name: str) -> FdpCurve | None:
        return next((c for c in self.curves if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        head = self.curve(self.headline)
        assert head is not None
        return {
            "view": self.view, "view_meaning": VIEW_TEXT[self.view],
            "release": self.release, "release_meaning": RELEASE_TEXT[self.release],
            "unit": "record (one record of one client replaced)",
            "deltas": list(self.deltas), "rounds": [int(t) for t in self.rounds],
            "headline": {"bound": self.headline, "mu": float(head.mu[-1]),
                         "epsilon": {str(d): float(head.eps[d][-1]) for d in self.deltas},
                         "rounds": int(self.rounds[-1])},
            "curves": [{"bound": c.name, "label": c.label, "is_guarantee": c.is_guarantee,
                        "mu": [float(v) for v in c.mu],
                        "epsilon": {str(d): [float(v) for v in c.eps[d]] for d in self.deltas}} for c in self.curves],
            "params": self.params, "assumptions": self.assumptions, "warnings": self.warnings,
        }


def parse_grid(spec: str, t_max: int) -> np.ndarray:
    """`log:N` (N log-spaced rounds from 1 to t_max, deduplicated) or an explicit list such as `1,10,100`."""
    spec = str(spec).strip()
    if spec.startswith("log:"):
        try:
            n = int(spec[4:])
        except ValueError:
            raise ValueError(f"--grid log:N needs an integer N, got {spec!r}") from None
        if n < 1 or t_max < 1:
            raise ValueError(f"--grid log:N needs N >= 1 and T-max >= 1, got {spec!r} with T-max {t_max}")
        return np.unique(np.round(np.logspace(0, math.log10(t_max), n)).astype(np.int64))
    try:
        rounds = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--grid must be log:N or a comma-separated list of rounds, got {spec!r}") from None
    if not rounds or rounds[0] < 1:
        raise ValueError(f"--grid rounds must be >= 1, got {spec!r}")
    return np.array(rounds, dtype=np.int64)


def resolve_view(view: str, secure_aggregation: bool) -> str:
    """`auto` is `upload` unless the deployment uses secure aggregation (then `aggregate`)."""
    if view not in VIEWS:
        raise ValueError(f"view must be one of {', '.join(VIEWS)}, got {view!r}")
    if view == "auto":
        return "aggregate" if secure_aggregation else "upload"
    return view


def fdp_report(*, algo: str, schedule: str, eta: float, K: int, V: float, sigma: float, m: int, rounds: Sequence[int],
               L: float | None = None, alpha: float | None = None, deltas: Sequence[float] = (1e-5,),
               view: str = "auto", secure_aggregation: bool = False, release: str = "transcript",
               sensitivity: str = "exact", paper: str | None = None, c: float | None = None, z: float | None = None,
               honest_clients: int | None = None, eta_array: np.ndarray | None = None) -> FdpReport:
    """μ and ε(δ) at each of `rounds` for every applicable bound (see the module docstring).

    `eta_array` [T, K] gives the steps (a run's realised or custom steps; T >= max(rounds)); `schedule` then only
    names them ("custom" allowed, which admits only the paper variant h0).
    `paper` (printed | eta-consistent | h0) adds the paper-claimed curve, which needs L.
    """
    rounds = np.asarray(sorted({int(t) for t in rounds}), dtype=np.int64)
    if rounds.size == 0 or rounds[0] < 1:
        raise ValueError("rounds must hold integers >= 1")
    if not sigma > 0:
        raise ValueError(f"σ must be > 0, got {sigma!r}")
    if release not in RELEASES:
        raise ValueError(f"release must be one of {', '.join(RELEASES)}, got {release!r}")
    if paper is not None and paper not in PAPER_VARIANTS:
        raise ValueError(f"paper variant must be one of {', '.join(PAPER_VARIANTS)}, got {paper!r}")
    if paper not in (None, "h0") and schedule not in SCHEDULES:
        raise ValueError(f"the paper's {paper} formulas need a named schedule ({', '.join(SCHEDULES)}), got "
                         f"{schedule!r}; variant h0 applies the paper's method to any steps")
    if paper is not None and L is None:
        raise ValueError("the paper-claimed curve needs the smoothness constant L (--L)")
    deltas = tuple(float(d) for d in deltas)
    if not deltas or not all(0 < d < 1 for d in deltas):
        raise ValueError(f"every δ must be in (0, 1), got {deltas!r}")
    m_h = m if honest_clients is None else int(honest_clients)
    if not 1 <= m_h <= m:
        raise ValueError(f"honest_clients must be in [1, m = {m}], got {honest_clients!r}")
    view = resolve_view(view, secure_aggregation)
    t_max = int(rounds[-1])
    if eta_array is None:
        steps = step_sizes(schedule, eta, t_max, K)
    else:
        steps = np.asarray(eta_array, dtype=np.float64)
        if steps.ndim != 2 or steps.shape[0] < t_max:
            raise ValueError(f"eta_array must be [T, K] with T >= {t_max}")
        steps = steps[:t_max]
    sens = sensitivities(algo, steps, V, m, L=L, alpha=alpha, mode=sensitivity, schedule=schedule, c=c, z=z)
    if view == "upload":
        gamma_t = m * sens.gamma / sigma  # one client's local shift over its own noise σ
    else:
        gamma_t = sens.gamma * m / (sigma * math.sqrt(m_h))  # the average's shift over σ√m_h/m
    index = rounds - 1
    mus: dict[str, np.ndarray] = {COMPOSITION: composition_mu(gamma_t)[index]}
    if view == "aggregate" and release == "final" and sens.rho is not None:
        mus[SHIFTED] = shifted_mu(gamma_t, sens.rho)[index]
    if paper is not None:
        mus[PAPER] = _paper_curve(paper, algo, schedule, steps, rounds, eta, K, V, m, sigma, L, alpha, c, z)
    curves = [FdpCurve(name, LABELS[name], name != PAPER, mu, {d: np.array([gdp_eps(float(v), d) for v in mu])
                                                               for d in deltas}) for name, mu in mus.items()]
    headline = SHIFTED if SHIFTED in mus else COMPOSITION
    params = {"algo": algo, "schedule": schedule, "eta": eta, "K": K, "V": V,
              "sigma": sigma, "m": m, "honest_clients": m_h, "L": L, "alpha": alpha, "sensitivity": sensitivity,
              "paper_variant": paper, "c": c, "z": z, "secure_aggregation": secure_aggregation}
    return FdpReport(view, release, rounds, deltas, curves, headline, params,
                     _assumptions(L), _warnings(algo, schedule, view, release, steps, L, alpha, paper, sensitivity))


def _paper_curve(variant: str, algo: str, schedule: str, steps: np.ndarray, rounds: np.ndarray, eta: float, K: int,
                 V: float, m: int, sigma: float, L: float, alpha: float | None, c: float | None,
                 z: float | None) -> np.ndarray:
    """The paper's claim, always in its own view (final model, aggregate noise σ/√m)."""
    if variant == "h0":
        exact = sensitivities(algo, steps, V, m, L=L, alpha=alpha)
        return h0_mu(exact.gamma * math.sqrt(m) / sigma, exact.rho)[rounds - 1]
    return paper_claimed_mu(algo, schedule, rounds, eta=eta, K=K, V=V, m=m, sigma=sigma, L=L, alpha=alpha,
                            variant=variant, c=c, z=z)


def _assumptions(L: float | None) -> list[str]:
    out = ["record-level DP: neighbouring datasets differ in one record of one client; no amplification by "
           "mini-batch or client sampling is claimed"]
    if L is not None:
        out.append(f"L = {L:g} is an ASSUMPTION (every per-sample loss L-smooth); it cannot be verified for "
                   "neural networks")
    return out


def _warnings(algo: str, schedule: str, view: str, release: str, steps: np.ndarray, L: float | None,
              alpha: float | None, paper: str | None, sensitivity: str) -> list[str]:
    out = []
    if view == "aggregate" and release == "final" and L is None:
        out.append("no smoothness constant L: the shifted-interpolation bound is skipped (composition only)")
    if algo == "fedprox" and alpha is not None and float(np.max(steps)) * alpha > 1:
        out.append("η·α > 1: the paper's FedProx surrogates do not apply (the exact sensitivities use |1 − ηα|)")
    if paper is not None and L is not None and schedule in ("cyclic", "continuous") and float(np.max(steps)) * L > 1:
        out.append(f"η·L > 1: the paper's {schedule} formulas need ηL <= 1")
    if sensitivity == "paper":
        out.append("sensitivities are the paper's surrogates (upper bounds of the exact forms with the default c, z)")
    return out

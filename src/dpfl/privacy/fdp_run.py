"""The f-DP accounting of one Noisy-FedAvg / Noisy-FedProx run (spec fdp_accounting.md §5–§6).

Built from the run's realised hyperparameters (the step sizes η[T, K] it uses, clip V, noise σ, α, the view and
release scope), it gives

- `event(t, cohort)`: round t as one Gaussian mechanism with shift Δ_t over the noise s_t the observer cannot remove,
  for the run's per-client ledger (budgets and `epsilon_spent`: the composition bound through the run's accountant);
- `report(...)`: μ and ε(δ) per client for every rigorous bound that applies, from the rounds that client actually
  took part in and the cohort sizes actually averaged, plus the paper-claimed value as a separately labelled field.

Per client, a round it sat out has γ_t = 0 (its data were not used; the selection never looks at data), so the
guarantee holds conditionally on every selection sequence: no amplification by client sampling is claimed.
In the upload view one client's upload moves by Δ_t = m·γ_t (FedAvg: 2V Σ_k η_{k,t}) over its own noise σ; in the
aggregate view the average moves by γ_t over σ·√m_h/m_t. The shifted-interpolation bound (aggregate view, release
final, L given) uses ρ̃_t = ρ_t s_{t−1}/s_t, so cohorts of changing size are covered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import dp_accounting as dpa
import numpy as np

from dpfl.privacy.fdp import COMPOSITION, LABELS, PAPER, PAPER_LABEL, RELEASE_TEXT, RELEASES, SHIFTED, VIEW_TEXT
from dpfl.privacy.fdp_bounds import composition_mu, paper_claimed_mu, shifted_mu
from dpfl.privacy.fdp_sensitivity import ALGORITHMS, SCHEDULES, sensitivities
from dpfl.privacy.gdp import gdp_eps, gdp_to_rdp

__all__ = ["RDP_ORDERS", "NoisyRunAccounting"]

RDP_ORDERS = (1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)  # ζ of the RDP ε(ζ) = ζμ²/2 reported per client


@dataclass(frozen=True)
class NoisyRunAccounting:
    """What the accountant needs of a Noisy-FedAvg/FedProx run; `view` is resolved (upload | aggregate)."""

    algo: str  # fedavg | fedprox
    schedule: str  # a named schedule, or custom
    step_sizes: np.ndarray  # η[T, K] as the run uses them
    clip: float  # V
    sigma: float | None  # None until calibrated from the budgets (`dpfl.privacy.run_calibration`)
    view: str
    release: str = "transcript"
    alpha: float | None = None
    smoothness_L: float | None = None
    honest_clients: int | None = None
    secure_aggregation: bool = False
    clip_mode: str = "per_example"
    gamma_one: np.ndarray = field(init=False, repr=False)  # m·γ_t: one client's shift (exact forms)
    rho: np.ndarray | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.algo not in ALGORITHMS:
            raise ValueError(f"algo must be one of {', '.join(ALGORITHMS)}, got {self.algo!r}")
        if self.view not in ("upload", "aggregate"):
            raise ValueError(f"view must be 'upload' or 'aggregate' (resolved), got {self.view!r}")
        if self.release not in RELEASES:
            raise ValueError(f"release must be one of {', '.join(RELEASES)}, got {self.release!r}")
        if self.sigma is not None and not self.sigma > 0:
            raise ValueError(f"σ must be > 0, got {self.sigma!r}")
        steps = np.asarray(self.step_sizes, dtype=np.float64)
        object.__setattr__(self, "step_sizes", steps)
        sens = sensitivities(self.algo, steps, self.clip, 1, L=self.smoothness_L,
                             alpha=self.alpha if self.algo == "fedprox" else None)
        object.__setattr__(self, "gamma_one", sens.gamma)
        object.__setattr__(self, "rho", sens.rho)

    @property
    def rounds(self) -> int:
        return int(self.step_sizes.shape[0])

    def noise_left(self, cohort: int) -> float:
        """s: the noise std the observer cannot remove in a round averaging `cohort` uploads."""
        if self.sigma is None:
            raise ValueError("σ is not set yet: it is calibrated from the budgets when the run starts")
        if self.view == "upload":
            return self.sigma
        honest = cohort if self.honest_clients is None else min(self.honest_clients, cohort)
        return self.sigma * math.sqrt(honest) / cohort

    def shift(self, t: int, cohort: int) -> float:
        """Δ_t: one client's upload (upload view) or the average (aggregate view) under one replaced record."""
        return float(self.gamma_one[t]) if self.view == "upload" else float(self.gamma_one[t]) / cohort

    def event(self, t: int, cohort: int) -> dpa.GaussianDpEvent:
        """Round t (0-based) for a client that takes part, `cohort` uploads averaged: N(shift, s²) is G_{Δ/s}."""
        if cohort < 1:
            raise ValueError(f"a round averages at least one upload, got {cohort}")
        return dpa.GaussianDpEvent(self.noise_left(cohort) / self.shift(t, cohort))

    def normalised(self, participated: Sequence[bool], cohorts: Sequence[int]) -> tuple[np.ndarray, np.ndarray | None]:
        """(γ̃_t, ρ̃_t) of one client over the rounds run: γ̃_t = 0 where it sat out."""
        part = np.asarray(participated, dtype=bool)
        m_t = np.asarray(cohorts, dtype=np.float64)
        T = len(part)
        if len(m_t) != T or T > self.rounds or (T and m_t.min() < 1):
            raise ValueError(f"need one cohort size >= 1 per round run (<= {self.rounds}), got {len(m_t)} for {T}")
        s = np.array([self.noise_left(int(c)) for c in m_t])
        shift = np.array([self.shift(t, int(c)) for t, c in enumerate(m_t)])
        gamma = np.where(part, shift / s, 0.0)
        if self.rho is None:
            return gamma, None
        rho = self.rho[:T] * np.concatenate([[1.0], s[:-1] / s[1:]])  # ρ̃_t = ρ_t s_{t−1}/s_t
        return gamma, rho

    def bounds(self, participated: Sequence[bool], cohorts: Sequence[int]) -> dict[str, float]:
        """μ of every rigorous bound that applies, after the rounds run, for one client."""
        gamma, rho = self.normalised(participated, cohorts)
        if not len(gamma):
            return {COMPOSITION: 0.0}
        out = {COMPOSITION: float(composition_mu(gamma)[-1])}
        if self.view == "aggregate" and self.release == "final" and rho is not None:
            out[SHIFTED] = float(shifted_mu(gamma, rho)[-1]) if gamma.any() else 0.0
        return out

    def report(self, participation: np.ndarray, cohorts: Sequence[int], deltas: Sequence[Sequence[float]],
               rounds_run: int) -> dict[str, Any]:
        """privacy.json's `fdp` block: per client μ and ε for each bound, the headline, RDP, the paper's claim.

        participation: bool [clients, rounds_run]; deltas: per client the δs to report ε at.
        """
        part = np.asarray(participation, dtype=bool).reshape(len(deltas), -1)
        cache: dict[bytes, dict[str, float]] = {}
        clients = []
        for i, ds in enumerate(deltas):
            key = part[i].tobytes()
            if key not in cache:  # clients with the same participation have the same bounds
                cache[key] = self.bounds(part[i], cohorts)
            mus = cache[key]
            head = SHIFTED if SHIFTED in mus else COMPOSITION
            clients.append({
                "client": i, "rounds_participated": int(part[i].sum()), "headline": head, "mu": mus[head],
                "epsilon": {str(d): gdp_eps(mus[head], d) for d in ds},
                "bounds": {name: {"mu": mu, "epsilon": {str(d): gdp_eps(mu, d) for d in ds}}
                           for name, mu in mus.items()},
                "rdp": {str(z): gdp_to_rdp(mus[head], z) for z in RDP_ORDERS},
            })
        worst = max(clients, key=lambda c: c["mu"]) if clients else None
        return {
            "accountant": "f-DP (Gaussian DP), exact conversion to (ε, δ); spec fdp_accounting.md",
            "unit": "record (one record of one client replaced)",
            "view": self.view, "view_meaning": VIEW_TEXT[self.view],
            "release": self.release, "release_meaning": RELEASE_TEXT[self.release],
            "rounds": rounds_run, "uploads_averaged": [int(c) for c in cohorts],
            "headline": worst["headline"] if worst else COMPOSITION,
            "labels": {name: LABELS[name] for name in (COMPOSITION, SHIFTED)},
            "mu_max": worst["mu"] if worst else 0.0,
            "epsilon_max": worst["epsilon"] if worst else {},
            "clients": clients,
            "params": self.params(),
            "assumptions": self.assumptions(),
            "warnings": self.warnings() + ([] if part.all() else [
                "partial participation: each client is charged for the rounds it took part in, with the cohort size "
                "of those rounds; no amplification by client sampling is claimed"]),
            "paper_claimed": self.paper_claimed(rounds_run, cohorts),
        }

    def params(self) -> dict[str, Any]:
        steps = self.step_sizes
        return {"algo": self.algo, "schedule": self.schedule, "K": int(steps.shape[1]), "T": self.rounds,
                "eta": float(steps[0, 0]), "step_sizes_min": float(steps.min()), "step_sizes_max": float(steps.max()),
                "V": self.clip, "clip_mode": self.clip_mode, "sigma": self.sigma, "alpha": self.alpha,
                "smoothness_L": self.smoothness_L, "honest_clients": self.honest_clients,
                "secure_aggregation": self.secure_aggregation}

    def assumptions(self) -> list[str]:
        out = ["record-level DP: neighbouring datasets differ in one record of one client; the record is assumed to "
               "change the clipped gradient at every local step (worst case)",
               "no amplification by mini-batch or client sampling is claimed; rounds a client sat out cost it nothing",
               "the simulator adds the noise itself; the guarantee assumes clients do so honestly"]
        if self.view == "aggregate":
            out.append("aggregate view: individual uploads are hidden (secure aggregation or a trusted aggregator; "
                       "dpfl simulates no cryptography)" + ("" if self.secure_aggregation else
                                                            "; this run did NOT declare secure_aggregation"))
        if self.smoothness_L is not None:
            out.append(f"L = {self.smoothness_L:g} is an ASSUMPTION (every per-sample loss L-smooth); it cannot be "
                       "verified for neural networks")
        return out

    def warnings(self) -> list[str]:
        out = []
        if self.view == "aggregate" and self.release == "final" and self.smoothness_L is None:
            out.append("no smoothness constant L: the shifted-interpolation bound is skipped (composition only)")
        if self.algo == "fedprox" and self.alpha and float(self.step_sizes.max()) * self.alpha > 1:
            out.append("η·α > 1: the paper's FedProx surrogates do not apply (the exact sensitivities use |1 − ηα|)")
        if (self.smoothness_L is not None and self.schedule in ("cyclic", "continuous")
                and float(self.step_sizes.max()) * self.smoothness_L > 1):
            out.append(f"η·L > 1: the paper's {self.schedule} formulas need ηL <= 1 (its claimed value is not even "
                       "self-consistent here)")
        return out

    def paper_claimed(self, rounds_run: int, cohorts: Sequence[int]) -> dict[str, Any] | None:
        """The paper's printed closed form at the rounds run, in its own setting; NEVER a guarantee.

        Only for a named schedule, full rounds of equal cohorts and a given L (its formulas need them)."""
        m = sorted({int(c) for c in cohorts})
        if (self.smoothness_L is None or self.schedule not in SCHEDULES or rounds_run < 1 or len(m) != 1
                or (self.algo == "fedprox" and not (self.alpha or 0) > self.smoothness_L)):
            return None
        steps = self.step_sizes
        mu = paper_claimed_mu(self.algo, self.schedule, np.array([rounds_run]), eta=float(steps[0, 0]),
                              K=int(steps.shape[1]), V=self.clip, m=m[0], sigma=self.sigma, L=self.smoothness_L,
                              alpha=self.alpha, variant="printed")
        return {"label": PAPER_LABEL, "is_guarantee": False, "bound": PAPER, "variant": "printed",
                "setting": "the paper's own: final model, aggregate noise σ/√m, every client in every round",
                "mu": float(mu[0])}

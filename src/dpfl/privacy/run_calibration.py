"""Noise from budgets for a whole planned run: the one place where dpfl decides how much noise a run adds.

    plan = PlannedRun("dpsgd", budgets, rounds=30, records=[...], batch_sizes=[...], local_steps=[...],
                      local_sampling="poisson")
    calibrated = calibrate_run(plan)      # .noise: one noise multiplier per client, and what it was planned for

For each mechanism the run's whole event for one client at noise z is the event family its ledger records,
so a run calibrated here never exceeds a budget when it takes part as planned:

- ``dpsgd`` (sample level, one z_i per client): DP-SGD steps = planned participations x steps per
  participation, with the local sampling's event (Poisson: Poisson sampled Gaussian; fixed: sampled without
  replacement, replace-one). ``method="pfa-heuristic"`` uses PFA's closed form instead (NOT a guarantee; the
  run still accounts it with the real accountant and stops each client after the T* steps it was computed for).
- ``central`` (client level, one z): every round the server's Gaussian on the clipped sum, amplified by the
  client sampling (Poisson, fixed K without replacement, or none when everyone takes part).
- ``udp`` (client level, one z): each participation is one Gaussian at z/sqrt(K) seen by the server; with
  ``hidden_sampling`` every client is charged every round, amplified by the client sampling (an assumption the
  report labels).
- ``param_noise`` (Noisy-FedAvg/FedProx, sample level, one sigma): round t is G(Delta_t / s_t) with s_t the
  noise the observer cannot remove (spec fdp_accounting.md section 5); the planned rounds compose to one
  Gaussian with mu^2 = sum_t mu_t^2, exactly, under every accountant.

Participation (sampled client selection only): ``expected`` plans rounds x rate participations (the PFA
spec's T* = (K/M) R tau); a client drawn more often than that reaches its budget early and retires, and a
fixed-K run whose eligible clients drop below K stops with stop_reason "budget". ``worst_case`` plans a
participation in every round, so no client ever retires and the run always completes, at the price of more
noise. Central DP charges every client every round and has no participation choice.

Mechanisms with one noise for everyone (central, udp, param_noise) are calibrated to the smallest target
epsilon and the smallest delta, which needs at least as much noise as any client's own budget: every client
stays within its own budget.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import dp_accounting as dpa
import numpy as np

from dpfl.privacy.budgets import Budgets, ClientBudget
from dpfl.privacy.calibration import calibrate_event, calibrate_noise_multiplier, heuristic_pfa_noise
from dpfl.privacy.events import gaussian_event, sampled_gaussian_event
from dpfl.privacy.fdp_run import NoisyRunAccounting

__all__ = ["MECHANISMS", "PARTICIPATIONS", "CalibratedNoise", "PlannedRun", "calibrate_run", "calibration_targets",
           "refuse_a_run_that_trains_nothing"]

Mechanism = Literal["dpsgd", "central", "udp", "param_noise"]
Participation = Literal["expected", "worst_case"]
MECHANISMS: tuple[str, ...] = ("dpsgd", "central", "udp", "param_noise")
PARTICIPATIONS: tuple[str, ...] = ("expected", "worst_case")
SELECTIONS = ("all", "fixed", "poisson")


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """What calibration needs to know of a run before it starts (no data values, no model).

    budgets: the true per-client budgets. targets: the epsilon each client is calibrated to (default: its
    own budget; PFA's Minimum-/Maximum-epsilon baselines pass a common one, see `calibration_targets`).
    selection / k / rate: who takes part in a round (all, fixed k without replacement, Poisson rate).
    participation_rates: per-client probability of taking part in a round when it differs from the
    selection's (PFA re-draws a round until it holds a public client).
    dpsgd: records, batch_sizes, local_steps (DP-SGD steps per participation) and local_sampling, per client.
    udp: upload_cohort (the K the noise is split over) and hidden_sampling. param_noise: the run's
    `NoisyRunAccounting` (its sigma is ignored).
    """

    mechanism: Mechanism
    budgets: Sequence[ClientBudget]
    rounds: int
    accountant: str = "rdp"
    selection: str = "all"
    k: int | None = None
    rate: float | None = None
    participation: Participation = "expected"
    participation_rates: Sequence[float] | None = None
    targets: Sequence[float] | None = None
    method: str = "accountant"
    records: Sequence[int] | None = None
    batch_sizes: Sequence[int] | None = None
    local_steps: Sequence[int] | None = None
    local_sampling: str | None = None
    upload_cohort: float = 1.0
    hidden_sampling: bool = False
    noisy: NoisyRunAccounting | None = None

    def __post_init__(self) -> None:
        n = len(self.budgets)
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {self.mechanism!r}")
        if n < 1:
            raise ValueError("a planned run needs at least one client budget")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"rounds must be an integer >= 1, got {self.rounds!r}")
        if self.participation not in PARTICIPATIONS:
            raise ValueError(f"participation must be one of {', '.join(PARTICIPATIONS)}, got {self.participation!r}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}, got {self.selection!r}")
        if self.selection == "fixed" and not (isinstance(self.k, int) and 1 <= self.k <= n):
            raise ValueError(f"fixed selection needs k in [1, {n}], got {self.k!r}")
        if self.selection == "poisson" and not (self.rate is not None and 0 < self.rate <= 1):
            raise ValueError(f"poisson selection needs a rate in (0, 1], got {self.rate!r}")
        if self.method not in ("accountant", "pfa-heuristic"):
            raise ValueError(f"method must be 'accountant' or 'pfa-heuristic', got {self.method!r}")
        if self.method == "pfa-heuristic" and self.mechanism != "dpsgd":
            raise ValueError("the PFA heuristic calibrates DP-SGD only")
        for name in ("participation_rates", "targets"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries for {n} clients")
        if self.mechanism == "dpsgd":
            for name in ("records", "batch_sizes", "local_steps"):
                values = getattr(self, name)
                if values is None or len(values) != n:
                    raise ValueError(f"dpsgd calibration needs {name}: one per client ({n})")
            if self.local_sampling not in ("poisson", "fixed"):
                raise ValueError(f"DP-SGD's local sampling must be 'poisson' or 'fixed', got {self.local_sampling!r}")
        if self.mechanism == "param_noise":
            if self.noisy is None:
                raise ValueError("param_noise calibration needs the run's NoisyRunAccounting (noisy=...)")
            if self.selection == "poisson":
                raise ValueError("Noisy-FedAvg/FedProx run with full participation or fixed cohorts, not Poisson")
        if not self.upload_cohort >= 1:
            raise ValueError(f"upload_cohort must be >= 1, got {self.upload_cohort!r}")

    @property
    def n_clients(self) -> int:
        return len(self.budgets)

    def selection_rate(self) -> float:
        """The probability that a given client takes part in a round, as the selection samples."""
        if self.selection == "all":
            return 1.0
        if self.selection == "fixed":
            assert self.k is not None
            return self.k / self.n_clients
        assert self.rate is not None
        return float(self.rate)

    def participations(self) -> np.ndarray:
        """Planned rounds of participation per client: rounds x rate (expected) or every round (worst case)."""
        if self.participation == "worst_case":
            return np.full(self.n_clients, float(self.rounds))
        rates = (np.asarray(self.participation_rates, dtype=float) if self.participation_rates is not None
                 else np.full(self.n_clients, self.selection_rate()))
        return self.rounds * rates

    def client_level_event(self, noise_multiplier: float) -> dpa.DpEvent:
        """One round of a Gaussian on the sum of clipped client updates, amplified by the client sampling."""
        if self.selection == "all":
            return sampled_gaussian_event(noise_multiplier, sampling="full")
        if self.selection == "poisson":
            return sampled_gaussian_event(noise_multiplier, sampling="poisson", sample_rate=self.rate)
        return sampled_gaussian_event(noise_multiplier, sampling="fixed", population=self.n_clients,
                                      sample_size=self.k)

    def planned_cohort(self) -> int:
        """Uploads averaged per round as planned (param_noise): everyone, or k."""
        return self.n_clients if self.selection == "all" else int(self.k)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class CalibratedNoise:
    """The noise a planned run adds, per client, and what it was calibrated for (for the privacy report).

    noise: the noise multiplier z_i (dpsgd: per client; central/udp: the common z; param_noise: the common
    std sigma). steps: the DP-SGD steps each client's noise was planned for (the PFA heuristic's T*).
    """

    mechanism: str
    noise: np.ndarray
    common: bool
    targets: np.ndarray
    participations: np.ndarray
    participation: str
    method: str
    accountant: str
    steps: np.ndarray | None = None

    def summary(self) -> dict[str, object]:
        """privacy.json's `calibration` block: what the noise was calibrated for, in plain words."""
        what = {
            "dpsgd": "each client's DP-SGD noise multiplier z_i from its own target",
            "central": "the server's noise multiplier, from the smallest target epsilon and delta",
            "udp": "the upload noise multiplier sigma, from the smallest target epsilon and delta",
            "param_noise": "the parameter-noise std sigma, from the smallest target epsilon and delta",
        }[self.mechanism]
        parts = self.participations
        return {
            "mechanism": self.mechanism, "what": what, "method": self.method, "accountant": self.accountant,
            "participation": self.participation,
            "participation_meaning": (
                "every round (worst case: no client retires on budget before the last round)"
                if self.participation == "worst_case" else
                "the expected number of rounds (rounds x participation rate); a client drawn more often retires "
                "when its next round would exceed its budget"),
            "planned_participations_min": float(parts.min()), "planned_participations_max": float(parts.max()),
            "common_noise": self.common,
        }


def calibration_targets(budgets: Sequence[ClientBudget] | Budgets, reported: Sequence[float], calibrate_to: str | float,
                        enforce_budgets: bool) -> np.ndarray:
    """The epsilon each client's noise is calibrated to.

    ``"own"``: each client its own (true) budget. ``"min"`` / ``"max"``: everyone the smallest / largest
    REPORTED epsilon (PFA's Minimum-epsilon and Maximum-epsilon baselines). A number: everyone that epsilon.
    A common target above some client's budget is refused unless budgets are not enforced (a labelled,
    non-private reference run).
    """
    own = Budgets.of(budgets).epsilons.astype(float)  # a copy, from the arrays (no Python per client)
    if calibrate_to == "own":
        return own
    if calibrate_to in ("min", "max"):
        rep = np.asarray(reported, dtype=float)
        common = float(rep.min() if calibrate_to == "min" else rep.max())
    elif isinstance(calibrate_to, (int, float)) and not isinstance(calibrate_to, bool) and calibrate_to > 0:
        common = float(calibrate_to)
    else:
        raise ValueError(f"calibrate_to must be 'own', 'min', 'max' or an epsilon > 0, got {calibrate_to!r}")
    over = np.flatnonzero(common > own * (1 + 1e-9)).tolist()
    if over and enforce_budgets:
        raise ValueError(f"calibrating everyone to epsilon {common:g} exceeds the budgets of clients {over[:10]}"
                         f"{'...' if len(over) > 10 else ''}; this is a non-private reference: "
                         "set allow_budget_violation")
    return np.full(len(own), common)


def calibrate_run(plan: PlannedRun) -> CalibratedNoise:
    """The noise of every client of `plan` (see the module docstring for each mechanism's event)."""
    targets = (np.asarray(plan.targets, dtype=float) if plan.targets is not None
               else np.array([b.epsilon for b in plan.budgets], dtype=float))
    unlimited = [i for i, t in enumerate(targets) if math.isinf(t)]
    if unlimited and (plan.mechanism == "dpsgd" or len(unlimited) == len(targets)):
        raise ValueError(f"clients {unlimited[:10]} have unlimited budgets, so no noise can be calibrated for them; "
                         "give the noise explicitly")
    parts = plan.participations()
    common = dict(mechanism=plan.mechanism, targets=targets, participations=parts, participation=plan.participation,
                  method=plan.method, accountant=plan.accountant)
    if plan.mechanism == "dpsgd":
        noise, steps = _dpsgd(plan, targets, parts)
        return CalibratedNoise(noise=noise, common=False, steps=steps, **common)
    finite = [i for i in range(plan.n_clients) if not math.isinf(targets[i])]
    target = float(min(targets[i] for i in finite))
    delta = float(min(plan.budgets[i].delta for i in finite))
    make, what, scale = _common_event(plan, parts)
    z = calibrate_event(make, target, delta, accountant=plan.accountant, what=what)
    return CalibratedNoise(noise=np.full(plan.n_clients, z * scale), common=True, **common)


def _dpsgd(plan: PlannedRun, targets: np.ndarray, parts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per client: DP-SGD noise for its planned steps (cached over clients with the same setting)."""
    assert plan.records is not None and plan.batch_sizes is not None and plan.local_steps is not None
    out, steps_planned = np.empty(plan.n_clients), np.zeros(plan.n_clients, dtype=np.int64)
    cache: dict[tuple, float] = {}
    for i in range(plan.n_clients):
        b, m = int(plan.batch_sizes[i]), int(plan.records[i])
        steps = max(1, int(round(parts[i] * int(plan.local_steps[i]))))
        steps_planned[i] = steps
        delta = plan.budgets[i].delta
        if plan.method == "pfa-heuristic":
            out[i] = heuristic_pfa_noise(float(targets[i]), delta, min(1.0, b / m), steps)
            continue
        key = (float(targets[i]), delta, b, m, steps)
        if key not in cache:
            if plan.local_sampling == "poisson":
                cache[key] = calibrate_noise_multiplier(key[0], delta, steps=steps, sampling="poisson",
                                                        sample_rate=min(1.0, b / m), accountant=plan.accountant)
            else:
                cache[key] = calibrate_noise_multiplier(key[0], delta, steps=steps, sampling="fixed", population=m,
                                                        sample_size=b, accountant=plan.accountant)
        out[i] = cache[key]
    return out, steps_planned


def refuse_a_run_that_trains_nothing(plan: PlannedRun, calibrated: CalibratedNoise) -> None:
    """For a run that enforces its budgets (stops each client at its budget): under the expected plan with fewer
    rounds than M/K (T* = (K/M) R tau < tau, spec heterogeneous_dp 2.3) every client's DP-SGD noise is calibrated
    for less than one participation, so no client can afford its first round and the run would stop before round 1
    with nothing trained. A ValueError here, not an empty result."""
    if plan.mechanism != "dpsgd" or plan.participation != "expected" or plan.local_steps is None:
        return
    parts = calibrated.participations
    if bool((np.asarray(calibrated.steps) < np.asarray(plan.local_steps, dtype=np.int64)).all()):
        raise ValueError(
            f"{plan.rounds} round(s) at a participation rate of {float(parts.max()) / plan.rounds:.3g} plan each "
            f"client {float(parts.max()):.3g} participations (the expected count), less than one: no client could "
            "afford its first round, so the run would train nothing. Plan more rounds, or participation "
            "worst_case (a participation in every round)")


def _common_event(plan: PlannedRun, parts: np.ndarray):  # noqa: ANN202 - (make, what, scale)
    """The whole run's event at noise multiplier z for the client needing the most noise, a description for
    errors, and the factor from z to the stage's noise parameter (param_noise: sigma = z x scale)."""
    if plan.mechanism == "central":
        return (lambda z: dpa.SelfComposedDpEvent(plan.client_level_event(z), plan.rounds),
                f"central DP over {plan.rounds} rounds ({plan.selection} client selection)", 1.0)
    if plan.mechanism == "udp":
        root = math.sqrt(plan.upload_cohort)
        if plan.hidden_sampling:
            return (lambda z: dpa.SelfComposedDpEvent(plan.client_level_event(z / root), plan.rounds),
                    f"client-level uploads over {plan.rounds} rounds, sampling assumed hidden from the server", 1.0)
        count = max(1, int(round(float(parts.max()))))
        return (lambda z: dpa.SelfComposedDpEvent(gaussian_event(z / root), count),
                f"client-level uploads, {count} participations ({plan.participation})", 1.0)
    assert plan.noisy is not None
    unit = dataclasses.replace(plan.noisy, sigma=1.0)
    cohort = plan.planned_cohort()
    mu_sq = math.fsum((unit.shift(t, cohort) / unit.noise_left(cohort)) ** 2 for t in range(unit.rounds))
    share = float(parts.max()) / plan.rounds  # expected participation weighs each round's mu^2 by the rate
    mu_one = math.sqrt(share * mu_sq)  # mu of the planned run at sigma = 1; mu(sigma) = mu_one / sigma
    # The planned rounds compose to one Gaussian of multiplier z = sigma / mu_one (exact under every accountant).
    return (gaussian_event, f"parameter noise over {plan.rounds} rounds ({plan.participation} participation)",
            mu_one)

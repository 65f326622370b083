"""The `privacy` section: the threat model the run claims and how its guarantee is obtained."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_serializer, field_validator

from dpfl.experiment.config.base import _is_number, _Section, _too_big
from dpfl.experiment.config.budgets import (
    _BUDGETS_ALLOWED,
    BUDGET_DISTRIBUTION_MODELS,
    Budgets,
    _budget_distribution_name,
    _epsilon_ok,
)
from dpfl.experiment.config.errors import _fail, _sub_validate
from dpfl.experiment.config.limits import MAX_NOISE_MULTIPLIER, MIN_NOISE_MULTIPLIER
from dpfl.experiment.config.vocabulary import Mechanism


class MisreportConfig(_Section):
    """Falsified-budget scenario: `client` tells the server factor × its true epsilon (spec hdp §6)."""

    client: int = Field(0, ge=0)
    factor: float = Field(10.0, gt=0)


class AdaptiveClippingConfig(_Section):
    """Adaptive clipping (Andrew et al. 2021; `dpfl.privacy.adaptive_clipping`): the clip follows the target quantile
    of the norms it clips. count_noise: the count's noise std (null: expected contributions per release / 20)."""

    target_quantile: float = Field(0.5, ge=0, le=1)
    learning_rate: float = Field(0.2, ge=0)
    initial_clip: float = Field(0.1, gt=0)
    count_noise: float | None = Field(None, gt=0)


class PrivacyConfig(_Section):
    """The guarantee the run claims and how it is obtained.

    unit / observer / mechanism: left null, they are filled in from the algorithm; given, they must agree
    with it. sampling: the record sampling of DP-SGD. clip: the clipping norm (per sample for dpsgd, per
    update for udp and central). noise_multiplier: explicit, or null to calibrate it from the budgets; 0 (no
    noise) or in [1e-6, 1e6], the range dpfl's accountants compute reliably in float64.
    accountant: rdp, pld, gdp (exact, for unsampled Gaussian mechanisms only: Noisy-FedAvg/FedProx, udp
    without per_upload_amplification, central with every client every round) or prv (Gopi et al. 2021; Gaussian and
    Poisson-subsampled Gaussian only, no fixed-size sampling: it reports the upper end of its error bars,
    privacy.json's `prv` block the rest); null resolves to gdp for Noisy-FedAvg/FedProx and rdp otherwise.
    calibration: `accountant` (bisection, the default) or `pfa-heuristic` (PFA's formula; NOT a
    guarantee: the accountant's epsilon of the noise used is still what is reported). participation (when the
    noise is calibrated under sampled client selection): `expected` (rounds x participation rate; a client
    drawn more often retires on its budget, and a fixed-K run may stop early with stop_reason budget) or
    `worst_case` (a participation in every round: the run never stops early, with more noise). misreport: one
    client reports a false epsilon to the server. allow_budget_violation: required by max_eps, a
    non-private reference whose results are tagged meets_budgets: false. paper_eta_scaling (udp only): upload
    w_0 + η·(Δ̃ + ξ), FedCEO Algorithm 1's line 10 taken literally (post-processing: ε is unchanged).
    adaptive_clipping (mechanism central: the clip of the client updates; dpsgd: each client's per-sample clip): the
    clip starts at adaptive_clipping.initial_clip (privacy.clip stays null) and follows the target quantile of the
    norms, its count noised within the planned noise multiplier (the update noise grows to make room).
    noise_cohort_size (mechanism central, selection fixed or poisson; pfl-research's noise_cohort_size): simulate a
    cohort of this many clients: the noise on the sum is scaled by (expected cohort / noise_cohort_size) and the
    accountant models the larger cohort, so the ledger's epsilons (and budgets) are those of the SIMULATED run;
    privacy.json reports this run's own epsilon beside them as its guarantee.
    per_upload_amplification (udp with Poisson client selection only): account each upload as amplified by
    the client sampling, ASSUMING the server cannot tell who took part (FedCEO spec §7; labelled in privacy.json).

    Noisy-FedAvg/FedProx (mechanism param_noise; spec fdp_accounting.md §5) also take: secure_aggregation (the
    deployment hides individual uploads; on its own it only selects the default observer 'aggregate', and with a
    top-level `secure_aggregation` section dpfl runs the protocol for real and sets it), release (transcript:
    every global model is seen, the default; final: only w_T, which admits the shifted-interpolation bound),
    smoothness_L (an ASSUMED smoothness constant of every per-sample loss; needed by the shifted-interpolation
    bound) and honest_clients (the adversary knows the noise of all other clients).
    observer 'server' is the upload view (each noisy upload seen), 'aggregate' the view of the averages only.
    """

    unit: Literal["sample", "client", "none"] | None = None
    observer: Literal["server", "aggregate", "none"] | None = None
    mechanism: Mechanism | None = None
    sampling: Literal["poisson", "fixed"] | None = None
    clip: float | None = Field(None, gt=0)
    adaptive_clipping: AdaptiveClippingConfig | None = None
    noise_cohort_size: int | None = Field(None, ge=2)
    noise_multiplier: float | None = Field(None, ge=0)
    budgets: Budgets | None = None
    delta: float = Field(1e-5, gt=0, lt=1)
    accountant: Literal["rdp", "pld", "gdp", "prv"] | None = None
    calibration: Literal["accountant", "pfa-heuristic"] = "accountant"
    participation: Literal["expected", "worst_case"] = "expected"
    misreport: MisreportConfig | None = None
    allow_budget_violation: bool = False
    paper_eta_scaling: bool = False
    per_upload_amplification: bool = False
    secure_aggregation: bool = False
    release: Literal["transcript", "final"] = "transcript"
    smoothness_L: float | None = Field(None, gt=0)
    honest_clients: int | None = Field(None, ge=1)

    @field_validator("noise_multiplier")
    @classmethod
    def _noise_in_range(cls, v: float | None) -> float | None:
        if v is not None and v != 0 and not MIN_NOISE_MULTIPLIER <= v <= MAX_NOISE_MULTIPLIER:
            _fail("", "outside the range dpfl's accountants compute reliably", v,
                  f"0 (no noise) or a number in [{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}]")
        return v

    @field_validator("budgets", mode="plain")
    @classmethod
    def _budgets(cls, v: Any) -> Budgets | None:
        if isinstance(v, BaseModel):
            v = v.model_dump()
        if v is None:
            return None
        if _is_number(v):
            if _too_big(v):
                _fail("", "too large for a number (write .inf for unlimited)", v, "a number > 0")
            if not _epsilon_ok(v):
                _fail("", "an epsilon must be > 0 (.inf = unlimited)", v, "a number > 0")
            return float(v)
        if isinstance(v, list):
            if not v:
                _fail("", "an empty list", v, "one epsilon > 0 per client")
            for i, e in enumerate(v):
                if not _epsilon_ok(e):
                    _fail(str(i), "not an epsilon", e, "a number > 0 (.inf = unlimited)")
            return [float(e) for e in v]
        if isinstance(v, dict):
            if "distribution" not in v:
                _fail("distribution", "required field is missing", ..., ", ".join(BUDGET_DISTRIBUTION_MODELS))
            kind = v["distribution"]
            name = _budget_distribution_name(kind) if isinstance(kind, str) else None
            if isinstance(name, list):
                _fail("distribution", "ambiguous budget distribution: names differing only in case are different "
                      "distributions", kind, " or ".join(name))
            if name is None:
                _fail("distribution", "unknown budget distribution", kind, ", ".join(BUDGET_DISTRIBUTION_MODELS))
            return _sub_validate(BUDGET_DISTRIBUTION_MODELS[name], {**v, "distribution": name})
        _fail("", "wrong type", v, _BUDGETS_ALLOWED)

    @field_serializer("budgets")
    def _dump_budgets(self, v: Any) -> Any:
        return v.model_dump() if isinstance(v, BaseModel) else v

    @property
    def private(self) -> bool:
        return self.mechanism not in (None, "none")

"""`RunConfig`: one run, its sections, and the checks that span sections.

The declared threat model (unit, observer, mechanism, sampling) is filled in from the algorithm when left
out and must agree with it when given; privacy fields a mechanism does not use are refused; the f-DP
assumptions of Noisy-FedAvg/FedProx are checked; per-client lists must have one entry per client.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dpfl.experiment.config.algorithm import ALGORITHM_MECHANISMS, AlgorithmConfig
from dpfl.experiment.config.backend import RayConfig
from dpfl.experiment.config.base import _Section
from dpfl.experiment.config.budgets import _BUDGETS_ALLOWED, Rhdp20Budgets, _all_unlimited, _has_unlimited
from dpfl.experiment.config.data import DataConfig
from dpfl.experiment.config.errors import _fail
from dpfl.experiment.config.limits import MAX_NOISY_STEPS
from dpfl.experiment.config.model import ModelConfig
from dpfl.experiment.config.privacy import PrivacyConfig
from dpfl.experiment.config.secure import SecureAggregationConfig
from dpfl.experiment.config.training import CheckpointConfig, EvaluationConfig, TrainingConfig
from dpfl.experiment.config.vocabulary import (
    _CALIBRATED,
    _FDP_FIELDS,
    _NEEDS_BUDGETS,
    _ADAPTIVE,
    _NEEDS_CLIP,
    _NOISY,
    _OBSERVER_WHY,
    _OWN_LOCAL,
    _STATED,
    MECHANISM_OBSERVER,
    MECHANISM_UNIT,
    SECURE_ALGORITHMS,
)
from dpfl.privacy.budget_distributions import RHDP_BATCH20, RHDP_EPS20


_DEVICE = re.compile(r"cpu|cuda(:(0|[1-9][0-9]{0,3}))?")


def check_device(v: str) -> str:
    """`v` if it names a device this machine has ("cpu", "cuda", "cuda:N"); else a one-line validation error.

    Checked where the config is validated (a CUDA run is refused before anything is built or written): a GPU
    index is checked against `torch.cuda.device_count()`.
    """
    if not isinstance(v, str) or _DEVICE.fullmatch(v) is None:
        _fail("", "not a device", v, "'cpu', 'cuda' or 'cuda:N' (N a GPU index)")
    if v == "cpu":
        return v
    import torch

    if not torch.cuda.is_available():
        _fail("", "cuda is not available on this machine (no CUDA GPU, or a CPU-only PyTorch build)", v, "'cpu'")
    count = torch.cuda.device_count()
    if v.startswith("cuda:") and int(v[5:]) >= count:
        index = "'cuda:0'" if count == 1 else f"'cuda:0' to 'cuda:{count - 1}'"
        _fail("", f"this machine has {count} CUDA GPU{'s' if count != 1 else ''}", v, f"'cpu', 'cuda' or {index}")
    return v


class RunConfig(_Section):
    """One run. See configs/*.yaml for examples and `config_to_yaml` for every field with its value."""

    name: str = Field("run", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    seed: int = Field(0, ge=0)
    device: str = "cpu"
    backend: Literal["local", "ray"] = "local"
    ray: RayConfig | None = None
    data: DataConfig
    model: ModelConfig
    algorithm: AlgorithmConfig
    training: TrainingConfig
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    secure_aggregation: SecureAggregationConfig | None = None

    @field_validator("device")
    @classmethod
    def _device_available(cls, v: str) -> str:
        """cpu, cuda (the current GPU) or cuda:N (GPU N), refused in one line where this machine has no such GPU."""
        return check_device(v)

    @model_validator(mode="after")
    def _ray_section(self) -> RunConfig:
        """`ray` settings go with `backend: ray` only (left out: its defaults)."""
        if self.ray is not None and self.backend != "ray":
            _fail("ray", "the ray section configures backend 'ray'; this run's backend is "
                  f"{self.backend!r}", "{...}", "null (or set backend: ray)")
        if self.backend == "ray" and self.ray is None:
            self.ray = RayConfig()
        return self

    @property
    def planned_cohort(self) -> int | None:
        """Uploads averaged per round as planned: every client, or k of a fixed cohort (None under Poisson)."""
        sel = self.training.selection
        return self.data.clients if sel.kind == "all" else sel.k

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        self._resolve_threat_model()
        self._check_privacy_fields()
        self._check_calibration()
        self._check_stages()
        self._check_per_client_lengths()
        self._check_secure_aggregation()
        return self

    # The declared threat model must be the one the algorithm provides; missing parts are filled in.
    def _resolve_threat_model(self) -> None:
        p, alg = self.privacy, self.algorithm.name
        allowed = ALGORITHM_MECHANISMS[alg]
        if p.mechanism is None:
            p.mechanism = allowed[0]
        elif p.mechanism not in allowed:
            _fail("privacy.mechanism", f"algorithm {alg!r} runs with mechanism {' or '.join(map(repr, allowed))}",
                  p.mechanism, ", ".join(allowed))
        unit = MECHANISM_UNIT[p.mechanism]
        if p.unit is None:
            p.unit = unit  # type: ignore[assignment]
        elif p.unit != unit:
            _fail("privacy.unit", f"mechanism {p.mechanism!r} of algorithm {alg!r} protects unit {unit!r}",
                  p.unit, unit)
        observer = MECHANISM_OBSERVER[p.mechanism]
        if p.mechanism == "param_noise" and self.secure_aggregation is not None:  # the protocol runs for real
            if "secure_aggregation" in p.model_fields_set and not p.secure_aggregation:
                _fail("privacy.secure_aggregation", "a secure_aggregation section runs the protocol, so the server "
                      "sees only the sums", False, "true (or leave it out)")
            p.secure_aggregation = True
        if p.mechanism == "param_noise":  # the f-DP view: uploads seen (server) or only their averages
            observer = p.observer if p.observer in ("server", "aggregate") else (
                "aggregate" if p.secure_aggregation else "server")
        if p.observer is None:
            p.observer = observer  # type: ignore[assignment]
        elif p.observer != observer:
            _fail("privacy.observer", f"with algorithm {alg!r} and mechanism {p.mechanism!r} the guarantee "
                  f"holds against observer {observer!r} ({_OBSERVER_WHY[observer]})", p.observer, observer)

    def _check_privacy_fields(self) -> None:
        p, alg, mech = self.privacy, self.algorithm.name, self.privacy.mechanism
        not_private = f"algorithm {alg!r} with mechanism {mech!r}"
        if mech == "dpsgd":
            if p.sampling is None:
                p.sampling = "poisson"
        elif p.sampling is not None:
            _fail("privacy.sampling", f"record sampling is only used by mechanism 'dpsgd' (this run: {mech!r}); "
                  "client sampling is training.selection", p.sampling, "null")
        if p.adaptive_clipping is not None:
            if mech not in _ADAPTIVE:
                _fail("privacy.adaptive_clipping", f"adapts the clip of mechanism 'central' (client updates) or "
                      f"'dpsgd' (records); not used by {not_private}", "{...}", "null")
            if p.clip is not None:
                _fail("privacy.clip", "with privacy.adaptive_clipping the clip starts at "
                      "adaptive_clipping.initial_clip", p.clip, "null")
            if p.noise_cohort_size is not None:
                _fail("privacy.noise_cohort_size", "a simulated cohort does not combine with adaptive clipping",
                      p.noise_cohort_size, "null")
        elif mech in _NEEDS_CLIP and p.clip is None:
            _fail("privacy.clip", f"required by mechanism {mech!r}", None, "a number > 0")
        if mech not in _NEEDS_CLIP and p.clip is not None:
            _fail("privacy.clip", f"not used by {not_private}", p.clip, "null")
        if p.noise_cohort_size is not None and mech != "central":
            _fail("privacy.noise_cohort_size", f"simulates a larger cohort of central DP (mechanism 'central'); not "
                  f"used by {not_private}", p.noise_cohort_size, "null")
        if mech in ("param_noise", "none") and p.noise_multiplier is not None:
            hint = "; the noise of 'param_noise' is algorithm.params.std" if mech == "param_noise" else ""
            _fail("privacy.noise_multiplier", f"not used by {not_private}{hint}", p.noise_multiplier, "null")
        if mech != "param_noise":
            for name in _FDP_FIELDS:
                if getattr(p, name) != PrivacyConfig.model_fields[name].default:
                    _fail(f"privacy.{name}", f"only used by the f-DP accounting of {' and '.join(_NOISY)} (this run: "
                          f"{not_private})", getattr(p, name), repr(PrivacyConfig.model_fields[name].default))
        else:
            self._check_noisy()
        if mech in _NEEDS_BUDGETS and p.budgets is None:
            _fail("privacy.budgets", f"required by mechanism {mech!r}", None, _BUDGETS_ALLOWED)
        if mech == "none" and p.budgets is not None:
            _fail("privacy.budgets", f"{not_private} is not private, so budgets have no effect", p.budgets, "null")
        if mech in _STATED and p.budgets is not None:
            _fail("privacy.budgets", f"{not_private} states its guarantee per round (algorithm.params.epsilon and "
                  "delta), so budgets have no effect", p.budgets, "null")
        if p.calibration == "pfa-heuristic" and (mech != "dpsgd" or p.noise_multiplier is not None):
            _fail("privacy.calibration", "the PFA heuristic calibrates DP-SGD noise from the budgets (mechanism "
                  "'dpsgd', no explicit noise_multiplier)", p.calibration, "accountant")
        if alg == "max_eps" and not p.allow_budget_violation:
            _fail("privacy.allow_budget_violation", "max_eps calibrates everyone to the largest epsilon, violating the "
                  "smaller budgets: it is a non-private reference and must be allowed explicitly", False, "true")
        if alg in ("min_eps", "max_eps") and p.noise_multiplier is not None:
            _fail("privacy.noise_multiplier", f"{alg} calibrates the noise itself", p.noise_multiplier, "null")
        if p.misreport is not None and p.misreport.client >= self.data.clients:
            _fail("privacy.misreport.client", f"no such client (data.clients is {self.data.clients})",
                  p.misreport.client, f"an integer in [0, {self.data.clients - 1}]")
        sel = self.training.selection.kind
        if p.accountant in ("pld", "prv") and ((mech == "dpsgd" and p.sampling == "fixed")
                                               or (mech == "central" and sel == "fixed")):
            what = "privacy.sampling" if mech == "dpsgd" else "training.selection.kind"
            _fail("privacy.accountant", f"{p.accountant!r} cannot account fixed-size sampling (replace-one; {what} is "
                  "'fixed')", p.accountant, "rdp")
        if p.accountant == "prv" and alg in ("rdpcfl", "ifca_dp"):
            _fail("privacy.accountant", f"'prv' accounts Gaussian mechanisms only; {alg}'s private selections are "
                  "zCDP (exponential mechanism)", p.accountant, "rdp")

    def _noise_given(self) -> bool:
        """Whether the config fixes the noise itself (else it is calibrated from the budgets)."""
        p = self.privacy
        if p.mechanism == "param_noise":
            return self.algorithm.params.get("std") is not None
        return p.noise_multiplier is not None

    def _check_calibration(self) -> None:
        """Noise from budgets: something to calibrate from, an accountant that can, participation where it applies."""
        p, mech, sel = self.privacy, self.privacy.mechanism, self.training.selection.kind
        if p.accountant is None:
            p.accountant = "gdp" if mech == "param_noise" else "rdp"  # type: ignore[assignment]
        if p.accountant == "gdp":
            unsampled = (mech == "param_noise" or (mech == "udp" and not p.per_upload_amplification)
                         or (mech == "central" and sel == "all"))
            if not unsampled:
                _fail("privacy.accountant", "'gdp' is exact only for Gaussian mechanisms without sampling "
                      "(Noisy-FedAvg/FedProx, udp without per_upload_amplification, central with selection 'all'); "
                      "this run's events are sampled", p.accountant, "rdp or pld")
        if mech not in _CALIBRATED or self._noise_given():
            if p.participation != "expected":
                why = ("the noise is given, not calibrated" if mech in _CALIBRATED
                       else f"mechanism {mech!r} adds no noise")
                _fail("privacy.participation", f"only used when the noise is calibrated from the budgets ({why})",
                      p.participation, "expected")
            if mech == "param_noise" and p.budgets is None:
                return  # sigma given, no budgets: unlimited budgets, the run reports what it spent
            return
        what = "algorithm.params.std" if mech == "param_noise" else "privacy.noise_multiplier"
        if p.budgets is None:
            _fail("privacy.budgets", f"required to calibrate the noise (or give {what})", None, _BUDGETS_ALLOWED)
        if _has_unlimited(p.budgets) if mech == "dpsgd" else _all_unlimited(p.budgets):
            _fail("privacy.budgets", f"unlimited (.inf) budgets cannot calibrate noise; give {what} or finite budgets",
                  p.budgets, "finite numbers > 0")
        if mech == "central" and p.participation != "expected":
            _fail("privacy.participation", "central DP charges every client every round: participation does not apply",
                  p.participation, "expected")

    def _check_stages(self) -> None:
        """User-registered stages may replace only what keeps the run's guarantee as accounted."""
        alg, mech, observer = self.algorithm, self.privacy.mechanism, self.privacy.observer
        if alg.aggregator is not None and mech != "none" and observer != "server":
            _fail("algorithm.aggregator", f"with mechanism {mech!r} the guarantee holds against an observer of the "
                  "aggregate only, so the aggregation is part of the mechanism and cannot be replaced",
                  alg.aggregator.name, "null")
        if alg.local is not None and alg.name in _OWN_LOCAL:
            _fail("algorithm.local", f"algorithm {alg.name!r} builds its own local program (its analysis depends on "
                  "it)", alg.local.name, "null")

    def _check_secure_aggregation(self) -> None:
        """The protocol runs with FedAvg-style aggregation of fixed or known cohorts, and its threshold must be met."""
        s = self.secure_aggregation
        if s is None:
            return
        alg, sel = self.algorithm, self.training.selection
        if alg.name not in SECURE_ALGORITHMS or alg.aggregator is not None or alg.params.get("splitting") or \
                alg.params.get("anderson") is not None or alg.params.get("schedule", "constant") != "constant":
            _fail("secure_aggregation", f"runs with the FedAvg aggregation of {', '.join(SECURE_ALGORITHMS)} (the "
                  f"server must need only the sum of the uploads), not with algorithm {alg.name!r}", "{...}", "null")
        if alg.name in _NOISY and s.dropout > 0:
            _fail("secure_aggregation.dropout", f"{alg.name}'s f-DP accounting averages every selected upload; "
                  "dropouts would leave fewer in the sum than it assumes", s.dropout, "0")
        if alg.params.get("weighting", "uniform") not in ("uniform", "samples"):
            _fail("algorithm.params.weighting", "secure aggregation weights uniformly or by record count",
                  alg.params["weighting"], "uniform | samples")
        if self.privacy.mechanism == "central" and sel.kind != "all":
            _fail("training.selection.kind", "dp_fedavg_central with secure aggregation (distributed noise) accounts "
                  "the central event, whose amplification by client sampling does not hold against a server that "
                  "runs the protocol with the selected clients; use selection all, or udp_fedavg with a "
                  "secure_aggregation section (charged per participation)", sel.kind, "all")
        if self.privacy.per_upload_amplification:
            _fail("privacy.per_upload_amplification", "assumes the server cannot tell who took part, but the "
                  "secure-aggregation server runs the protocol with them", True, "false")
        if self.privacy.mechanism == "udp" and sel.kind == "poisson":
            _fail("training.selection.kind", "distributed noise (udp with secure aggregation) is split over the "
                  "threshold t of a fixed cohort", sel.kind, "all | fixed")
        cohort = self.planned_cohort
        if cohort is None:
            if s.threshold is not None:
                _fail("secure_aggregation.threshold", "a threshold needs a fixed cohort (training.selection.kind all "
                      "or fixed); with Poisson selection it is floor(K/2) + 1 of each round's K", s.threshold, "null")
            return
        if cohort < 2:
            _fail("training.selection.k", "secure aggregation needs at least 2 clients per round", cohort, ">= 2")
        t = s.threshold if s.threshold is not None else cohort // 2 + 1
        if not cohort / 2 < t <= cohort:
            _fail("secure_aggregation.threshold", f"must exceed half the cohort and not exceed it (K = {cohort})", t,
                  f"an integer in [{cohort // 2 + 1}, {cohort}]")
        left = cohort - int(s.dropout * cohort)
        if left < t:
            _fail("secure_aggregation.dropout", f"leaves {left} of {cohort} clients per round, below the threshold "
                  f"{t}: every round would abort", s.dropout,
                  # floor(dropout K) clients leave (the protocol's count): at most K - t may
                  f"less than {(cohort - t + 1) / cohort:.4g} (at most {cohort - t} of {cohort} clients leaving)")

    def _check_noisy(self) -> None:
        """What the f-DP analysis of Noisy-FedAvg/FedProx assumes (spec fdp_accounting.md §1.1)."""
        t, p, alg = self.training, self.privacy, self.algorithm
        name = alg.name
        if t.local_steps is None:
            _fail("training.local_steps", f"{name} needs a fixed number K of local steps (the sensitivities sum over "
                  "them); local_epochs would give clients different K", t.local_epochs, "local_steps: an integer >= 1")
        if t.rounds * t.local_steps > MAX_NOISY_STEPS:
            _fail("training.local_steps", f"{name} keeps one step size per local step: training.rounds x "
                  f"training.local_steps = {t.rounds} x {t.local_steps} is above dpfl's limit of {MAX_NOISY_STEPS}",
                  t.local_steps, f"at most {MAX_NOISY_STEPS // t.rounds} with {t.rounds} rounds")
        if t.optimizer.momentum:
            _fail("training.optimizer.momentum", f"{name} takes plain clipped steps: the sensitivity analysis has no "
                  "momentum", t.optimizer.momentum, "0")
        if t.selection.kind == "poisson":
            _fail("training.selection.kind", f"{name} runs with full participation or fixed-size cohorts (the "
                  "accountant uses the cohort size and claims no sampling amplification)", "poisson", "all | fixed")
        steps = alg.params.get("step_sizes")
        if steps is not None and (len(steps) != t.rounds or any(len(row) != t.local_steps for row in steps)):
            shape = f"[{len(steps)}][{', '.join(sorted({str(len(row)) for row in steps}))}]"
            _fail("algorithm.params.step_sizes", f"must have training.rounds rows of training.local_steps step sizes "
                  f"([{t.rounds}][{t.local_steps}])", shape, f"a [{t.rounds}][{t.local_steps}] list")
        cohort = self.planned_cohort
        if p.honest_clients is not None and cohort is not None and p.honest_clients > cohort:
            _fail("privacy.honest_clients", f"more than the {cohort} clients averaged per round", p.honest_clients,
                  f"an integer in [1, {cohort}]")

    def _check_per_client_lengths(self) -> None:
        n = self.data.clients
        sel = self.training.selection
        if sel.kind == "fixed" and sel.k is not None and sel.k > n:
            _fail("training.selection.k", f"more clients than data.clients ({n})", sel.k, f"an integer in [1, {n}]")
        bs = self.training.batch_size
        if isinstance(bs, list) and len(bs) != n:
            _fail("training.batch_size", f"has {len(bs)} entries for {n} clients (data.clients)", bs,
                  f"one integer per client ({n})")
        if bs == "rhdp20" and n != len(RHDP_BATCH20):
            _fail("training.batch_size", f"the rhdp20 list has {len(RHDP_BATCH20)} clients, data.clients is {n}", bs,
                  f"hetero, an integer, a list of {n} integers or {{distribution: choice, ...}}")
        public = self.algorithm.params.get("public_clients") if self.algorithm.name in ("pfa", "pfa_plus") else None
        for i, client in enumerate(public or ()):
            if client >= n:
                _fail(f"algorithm.params.public_clients.{i}", f"no such client (data.clients is {n})", client,
                      f"an integer in [0, {n - 1}]")
        b = self.privacy.budgets
        if isinstance(b, list) and len(b) != n:
            _fail("privacy.budgets", f"has {len(b)} entries for {n} clients (data.clients)", b,
                  f"one epsilon per client ({n}), a number or a distribution")
        if isinstance(b, Rhdp20Budgets) and n != len(RHDP_EPS20[b.dist]):
            _fail("privacy.budgets", f"rhdp20 lists have {len(RHDP_EPS20[b.dist])} clients; for {n} clients use "
                  f"distribution {b.dist} (sampled)", b, f"{{distribution: {b.dist}}} or data.clients: 20")

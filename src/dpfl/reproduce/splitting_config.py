"""The config of one convex splitting setting (configs/splitting/convex/*.yaml): a problem, rounds, and the methods.

    name: ls-s1
    problem: {kind: least_squares, n_clients: 25, dim: 100, n_per_client: 5000, shift_scale: 1.0}
    rounds: 605
    anderson: {memories: [0, 2]}          # every method runs once per memory tau
    methods:
      - {name: fedavg_k5, preset: fedavg, eta: 1.0e-5, local: {name: gradient_steps, k: 5}}
      - {name: fedpi, preset: fedpi, eta: 1.0e-5, local: {name: exact_ls_prox}}

Every field is validated (unknown fields, wrong types and out-of-range values are errors naming the field), and the
objects dpfl runs are built from it here, so a config error surfaces before any run starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationError, model_validator

from dpfl.algorithms.client.local_operators import ExactLeastSquaresProx, GradientSteps, InexactProx
from dpfl.algorithms.selection import Selection
from dpfl.algorithms.server.splitting import AndersonII, SplittingDP, UnifiedSplitting, presets
from dpfl.algorithms.server.splitting.schedules import SCHEDULES
from dpfl.data.synthetic import ConvexProblem, heterogeneity, make_least_squares, make_logistic
from dpfl.experiment.config.base import _Section
from dpfl.experiment.config.errors import ConfigError, _config_error
from dpfl.experiment.config.yaml_io import parse_yaml


class ProblemSpec(_Section):
    """A convex problem of operator_splitting.md §10; sizes default to the spec's (LS 25 x 5000 x 100, LR 10 x 1000
    x 100); `preset: small` is 5 clients, d = 20, N_i = 200."""

    kind: Literal["least_squares", "logistic"]
    n_clients: int | None = Field(None, ge=1, le=10_000)
    dim: int | None = Field(None, ge=1, le=100_000)
    n_per_client: int | None = Field(None, ge=1, le=1_000_000)
    preset: Literal["small"] | None = None
    shift_scale: float = Field(0.0, ge=0)
    noise_std: float | None = Field(None, ge=0)
    flip_std: float | None = Field(None, ge=0)
    weights: Literal["uniform", "samples"] = "uniform"

    @model_validator(mode="after")
    def _knobs_of_the_kind(self) -> ProblemSpec:
        if self.kind == "least_squares" and self.flip_std is not None:
            raise ValueError("problem.flip_std is a logistic-regression knob (least squares has noise_std)")
        if self.kind == "logistic" and self.noise_std is not None:
            raise ValueError("problem.noise_std is a least-squares knob (logistic regression has flip_std)")
        return self

    def build(self, seed: int) -> ConvexProblem:
        sizes = {k: v for k, v in (("n_clients", self.n_clients), ("dim", self.dim),
                                   ("n_per_client", self.n_per_client)) if v is not None}
        if self.kind == "least_squares":
            extra = {} if self.noise_std is None else {"noise_std": self.noise_std}
            return make_least_squares(**sizes, shift_scale=self.shift_scale, seed=seed, weights=self.weights,
                                      preset=self.preset, **extra)
        extra = {} if self.flip_std is None else {"flip_std": self.flip_std}
        return make_logistic(**sizes, shift_scale=self.shift_scale, seed=seed, weights=self.weights,
                             preset=self.preset, **extra)


class LocalSpec(_Section):
    """gradient_steps (k steps, optional minibatch), exact_ls_prox (least squares only), inexact_prox ((S)GD with
    momentum on the prox objective, warm start u or server_avg)."""

    name: Literal["gradient_steps", "exact_ls_prox", "inexact_prox"]
    k: int = Field(1, ge=1, le=100_000)
    batch: int | None = Field(None, ge=1)
    steps: int = Field(100, ge=1, le=100_000)
    lr: float = Field(0.01, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    warm_start: Literal["u", "server_avg"] = "u"

    def build(self):
        if self.name == "gradient_steps":
            return GradientSteps(self.k, self.batch)
        if self.name == "exact_ls_prox":
            return ExactLeastSquaresProx()
        return InexactProx(self.steps, self.lr, self.batch, self.momentum, self.warm_start)


class DPSpec(_Section):
    """DP mode (§9) with its clip, and either the noise multiplier or every client's epsilon budget (delta: the
    setting's), from which the noise is calibrated for worst-case participation."""

    mode: Literal["update_gaussian", "dpsgd"]
    clip: float = Field(gt=0)
    noise_multiplier: float | None = Field(None, ge=0)
    epsilon: float | None = Field(None, gt=0)
    batch: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one_noise_source(self) -> DPSpec:
        if (self.noise_multiplier is None) == (self.epsilon is None):
            raise ValueError("dp: give exactly one of noise_multiplier and epsilon (the budget to calibrate it for)")
        return self


class MethodSpec(_Section):
    """One compared method: a preset at step eta (schedule, ergodic averaging, report, mode), its local operator."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.+-]+$")
    preset: Literal[presets.NAMES]  # type: ignore[valid-type]
    eta: float = Field(gt=0)
    local: LocalSpec
    schedule: Literal[SCHEDULES] = "constant"  # type: ignore[valid-type]
    period: int = Field(500, ge=1)
    ergodic: bool = False
    report: Literal["xbar", "shadow"] = "xbar"
    mode: Literal["centralized", "decentralized"] = "centralized"
    dp: DPSpec | None = None

    def build(self, participation: Selection, anderson: AndersonII | None) -> UnifiedSplitting:
        dp = None if self.dp is None else SplittingDP(self.dp.mode, self.dp.clip, self.dp.noise_multiplier,
                                                      self.dp.batch)
        return presets.make(self.preset, self.eta, self.local.build(), schedule=self.schedule, period=self.period,
                            participation=participation, ergodic=self.ergodic, report=self.report, mode=self.mode,
                            anderson=anderson, dp=dp)


class ParticipationSpec(_Section):
    """all, Bernoulli(rate) per client (`poisson`), or `fixed` k clients without replacement."""

    kind: Literal["all", "poisson", "fixed"] = "all"
    rate: float | None = Field(None, gt=0, le=1)
    k: int | None = Field(None, ge=1)

    def build(self) -> Selection:
        return Selection(self.kind, self.k, self.rate)


class AndersonSpec(_Section):
    memories: list[int] = Field(default_factory=lambda: [0], min_length=1)
    scope: Literal["state", "global"] = "state"
    blend: float = Field(0.0, ge=0, le=1)
    safeguard: bool = False

    def build(self, memory: int) -> AndersonII | None:
        return None if memory == 0 else AndersonII(memory, self.scope, self.blend, self.safeguard)


class SettingConfig(_Section):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.+-]+$")
    describe: str = ""
    problem: ProblemSpec
    rounds: int = Field(ge=1, le=1_000_000)
    participation: ParticipationSpec = Field(default_factory=ParticipationSpec)
    anderson: AndersonSpec = Field(default_factory=AndersonSpec)
    methods: list[MethodSpec] = Field(min_length=1)
    delta: float = Field(1e-5, gt=0, lt=1)

    @model_validator(mode="after")
    def _consistent(self) -> SettingConfig:
        names = [m.name for m in self.methods]
        if len(set(names)) != len(names):
            raise ValueError(f"methods: names must be distinct, got {names}")
        if any(tau < 0 for tau in self.anderson.memories):
            raise ValueError(f"anderson.memories: Anderson memory tau must be >= 0, got {self.anderson.memories}")
        for m in self.methods:  # build once so that preset / operator / mode mismatches are config errors
            for tau in self.anderson.memories:
                m.build(self.participation.build(), self.anderson.build(tau))
            if m.local.name == "exact_ls_prox" and self.problem.kind != "least_squares":
                raise ValueError(f"methods.{m.name}: the exact least-squares prox cannot apply to a logistic problem")
        return self


def problem_spec(**fields: Any) -> ProblemSpec:
    """A validated ProblemSpec; a problem is one ConfigError line naming the field."""
    try:
        return ProblemSpec.model_validate(fields)
    except ValidationError as e:
        raise _config_error(e, ProblemSpec) from None


def load_setting(path: Path | str) -> SettingConfig:
    """Read and validate a setting; any problem is one ConfigError line naming the file and the field."""
    path = Path(path)
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    return validate_setting(data, str(path))


def validate_setting(data: Any, source: str = "<setting>") -> SettingConfig:
    try:
        return SettingConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: {_config_error(e, SettingConfig)}") from None


def problem_statistics(problem: ConvexProblem, *, kind: str, shift_scale: float, seed: int) -> dict[str, Any]:
    """The statistics `dpfl data convex` prints of a built problem: sizes, ||theta*||, f(theta*) and the heterogeneity
    H = (1/n) sum_i ||grad f_i(theta*)||^2 (also per sample: the gradients of the mean losses); `kind`, `shift_scale`
    and `seed` (what built it) are listed among them."""
    return {"kind": kind, "clients": problem.n_clients, "dim": problem.dim,
            "samples_per_client": problem.n_samples.tolist(),
            "shift_scale": shift_scale, "seed": seed, "theta_star_norm": float(np.linalg.norm(problem.theta_star)),
            "objective_at_theta_star": problem.objective(problem.theta_star),
            "heterogeneity_H": heterogeneity(problem),
            "heterogeneity_H_per_sample": heterogeneity(problem, per_sample=True)}

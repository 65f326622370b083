"""Noisy-FedAvg / Noisy-FedProx (spec fdp_accounting.md §1.1): clipped local steps on a step-size schedule, Gaussian
noise on every uploaded parameter, a plain mean; accounted in f-DP (`dpfl.privacy.fdp_run.NoisyRunAccounting`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from dpfl.algorithms.algorithm import Algorithm
from dpfl.algorithms.catalog.context import AlgorithmError, RunFacts, mechanism_of, validated
from dpfl.algorithms.catalog.validation import Params, fail
from dpfl.algorithms.client.param_noise import ParameterNoise
from dpfl.algorithms.client.program import clipped_sgd
from dpfl.algorithms.secure.aggregator import SecureFedAvg
from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.privacy.fdp_run import NoisyRunAccounting
from dpfl.privacy.fdp_sensitivity import step_sizes as fdp_step_sizes

__all__ = ["NoisyParams", "NoisyProxParams", "noisy_fedavg", "noisy_fedprox", "noisy_run_accounting"]

MECHANISMS = ("param_noise",)
NoisySchedule = Literal["constant", "cyclic", "stagewise", "continuous", "custom"]


class NoisyParams(Params):
    """Noisy-FedAvg (spec fdp_accounting.md §1.1): K clipped local steps (clip norm privacy.clip, per example or
    on the batch mean), N(0, std²) on every uploaded parameter, a plain mean. Step sizes η_{k,t} from the base
    rate training.optimizer.lr: constant η, cyclic η/(k+1), stagewise η/(t+1), continuous η/(tK+k+1), or
    custom `step_sizes` ([rounds][local_steps]). batch_sampling: shuffled epochs or a fresh uniform subset per
    step (both independent of the data; no sampling amplification is claimed). std: null calibrates it from
    privacy.budgets (dpfl.privacy.run_calibration)."""

    std: float | None = Field(None, gt=0)
    schedule: NoisySchedule = "constant"
    step_sizes: list[list[Annotated[float, Field(gt=0)]]] | None = None
    clip_mode: Literal["per_example", "batch"] = "per_example"
    batch_sampling: Literal["shuffle", "fixed"] = "shuffle"

    @model_validator(mode="after")
    def _custom_steps(self) -> NoisyParams:
        if (self.schedule == "custom") != (self.step_sizes is not None):
            fail("step_sizes", "give step_sizes exactly when schedule is 'custom'", self.step_sizes,
                 "a [rounds][local_steps] list of numbers > 0 with schedule: custom, else null")
        return self


class NoisyProxParams(NoisyParams):
    """Noisy-FedProx: Noisy-FedAvg's steps plus α(w − w_t), added after clipping (α = 0 is Noisy-FedAvg)."""

    alpha: float = Field(ge=0)


def noisy_run_accounting(run: RunFacts, name: str, params: Any) -> NoisyRunAccounting:
    """The f-DP accounting of noisy_fedavg / noisy_fedprox: its realised step sizes η[T, K] and threat model.
    Reads run.lr, rounds, local_steps, clip and the f-DP fields (observer, release, smoothness_L, honest_clients,
    secure_view)."""
    if run.local_steps is None:
        raise AlgorithmError(f"training.local_steps: {name} runs a fixed number of local steps", "training.local_steps")
    if run.clip is None:
        raise AlgorithmError(f"privacy.clip: {name} clips every local step", "privacy.clip")
    if params.schedule == "custom":
        eta = np.asarray(params.step_sizes, dtype=np.float64)
    else:
        eta = fdp_step_sizes(params.schedule, run.lr, run.rounds, run.local_steps)
    fedprox = name == "noisy_fedprox"
    return NoisyRunAccounting(
        "fedprox" if fedprox else "fedavg", params.schedule, eta, float(run.clip), params.std,
        view="aggregate" if run.observer == "aggregate" else "upload", release=run.release,
        alpha=params.alpha if fedprox else None, smoothness_L=run.smoothness_L, honest_clients=run.honest_clients,
        secure_aggregation=run.secure_view, clip_mode=params.clip_mode)


def _noisy(run: RunFacts, name: str, params: Any) -> Algorithm:
    """Clipped local steps on the schedule, parameter noise on upload, a plain mean (the user's aggregator, or the
    secure-aggregation sum when run.secure is set)."""
    mechanism_of(run, name, MECHANISMS)
    accounting = noisy_run_accounting(run, name, params)
    if accounting.sigma is not None:  # sigma given: every round's event must be computable before anything runs
        cohort = run.planned_cohort or 1
        try:
            for t in range(accounting.rounds):
                accounting.event(t, cohort)
        except (ValueError, ZeroDivisionError, OverflowError) as err:
            raise AlgorithmError(f"algorithm.params: the f-DP accounting of these settings fails (std, privacy.clip, "
                                 f"step sizes): {err}", "algorithm.params") from None
    local = clipped_sgd(accounting.step_sizes, accounting.clip, clip_mode=params.clip_mode,
                        sampling=params.batch_sampling, loss=run.loss, prox_mu=accounting.alpha or 0.0)
    aggregator: Any = run.aggregator if run.aggregator is not None else FedAvg("uniform")
    if run.secure is not None:  # the aggregate view, for real: the server sees only the sum
        aggregator = SecureFedAvg(run.secure)
    return Algorithm(name, local, run.selection, ParameterNoise(accounting), aggregator)


def noisy_fedavg(run: RunFacts, *, std: float | None = None, schedule: NoisySchedule = "constant",
                 step_sizes: list[list[float]] | None = None,
                 clip_mode: Literal["per_example", "batch"] = "per_example",
                 batch_sampling: Literal["shuffle", "fixed"] = "shuffle") -> Algorithm:
    """Noisy-FedAvg; std None: calibrated from the budgets. Reads what `noisy_run_accounting` reads, run.loss,
    selection and clients."""
    return _noisy(run, "noisy_fedavg", validated(NoisyParams, "noisy_fedavg", locals()))


def noisy_fedprox(run: RunFacts, *, alpha: float, std: float | None = None, schedule: NoisySchedule = "constant",
                  step_sizes: list[list[float]] | None = None,
                  clip_mode: Literal["per_example", "batch"] = "per_example",
                  batch_sampling: Literal["shuffle", "fixed"] = "shuffle") -> Algorithm:
    """Noisy-FedProx: Noisy-FedAvg's steps plus alpha (w - w_t). Reads what noisy_fedavg reads."""
    return _noisy(run, "noisy_fedprox", validated(NoisyProxParams, "noisy_fedprox", locals()))

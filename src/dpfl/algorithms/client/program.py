"""A local program: what a selected client runs on its data, and the DP event that constitutes.

The program is a pure description (hyperparameters); the engine executes it for a whole cohort.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from dp_accounting import DpEvent

from dpfl.algorithms.client.engine_round import train_on_engine
from dpfl.algorithms.stages import LocalInputs, LocalOutput
from dpfl.engine.local_training import ClientPlan, LocalSpec
from dpfl.privacy.adaptive_clipping import COUNT_NOISE_KEY, AdaptiveClipping
from dpfl.privacy.events import dpsgd_event

SAMPLE_CLIP = "sample_clip"  # the key of the clients' clips in a local program's state (adaptive clipping)


@dataclass(frozen=True)
class LocalProgram:
    """Local steps of SGD or DP-SGD.

    Exactly one of `steps` (per round) and `epochs` is set; an epoch is ceil(n_i / b_i) steps.
    `private` means sample-level DP-SGD: each step is the sampled Gaussian mechanism on the client's
    records, with the client's own noise multiplier. `step_sizes` (`[rounds][steps]`) replaces spec.lr by a
    per-round, per-step learning rate η_{k,t} (Noisy-FedAvg's schedules); it needs a fixed `steps`.
    `round_specs` ([rounds]) replaces `spec` round by round (a splitting schedule's learning rate or proximal
    weight); it may change only lr and prox_mu, which the DP event does not depend on.
    `round1_batch` (R-DPCFL's two-stage schedule, clustered_dpfl.md §3): round 0 runs with this batch instead of
    the client's own ("full": every record in every step, q = 1); its steps and its DP event follow (`batch_for`).

    Explicit client-side state (docs/concepts/round.md): `init(population)` gives the program's state before round
    1 (None: stateless), `run` takes it in `LocalInputs.state` and returns the new one in `LocalOutput.state`, and the
    run loop checkpoints it. Under sample-level adaptive clipping (`spec.adaptive_clipping`) the state is every
    client's clip C_k, `{"sample_clip": float32 [population]}` (one array: no Python object per client); each
    round the selected clients start from theirs and the state returns the clips their DP-SGD steps moved to. The
    DP event is unchanged: each step is the Gaussian mechanism at the client's z (Theorem 1).
    """

    spec: LocalSpec
    steps: int | None = None
    epochs: float | None = None
    private: bool = False
    step_sizes: tuple[tuple[float, ...], ...] | None = None
    round_specs: tuple[LocalSpec, ...] | None = None
    round1_batch: int | str | None = None

    def __post_init__(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of steps and epochs for the local program")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"local steps must be >= 1, got {self.steps}")
        if self.epochs is not None and not self.epochs > 0:
            raise ValueError(f"local epochs must be > 0, got {self.epochs}")
        if self.private and self.spec.clip is None:
            raise ValueError("a private local program needs a clipping norm")
        if self.spec.adaptive_clipping is not None and not self.private:
            raise ValueError("adaptive clipping adapts DP-SGD's per-sample clip: the local program must be private")
        if self.private and self.spec.sampling == "shuffle":
            raise ValueError("DP-SGD needs 'poisson' or 'fixed' sampling: "
                             "shuffled epochs have no sampled-Gaussian analysis")
        if self.step_sizes is not None:
            rows = tuple(tuple(float(v) for v in row) for row in self.step_sizes)
            object.__setattr__(self, "step_sizes", rows)
            if self.steps is None or not rows or any(len(row) != self.steps for row in rows):
                raise ValueError(f"step_sizes must be [rounds][steps] with a fixed number of steps ({self.steps})")
        if self.round1_batch is not None and self.round1_batch != "full" and (
                isinstance(self.round1_batch, bool) or not isinstance(self.round1_batch, int) or self.round1_batch < 1):
            raise ValueError(f"round1_batch must be 'full' or an integer >= 1, got {self.round1_batch!r}")
        if self.round_specs is not None:
            object.__setattr__(self, "round_specs", tuple(self.round_specs))
            if not self.round_specs:
                raise ValueError("round_specs must hold at least one round's spec")
            for spec in self.round_specs:
                if replace(spec, lr=self.spec.lr, prox_mu=self.spec.prox_mu) != self.spec:
                    raise ValueError("round_specs may change only lr and prox_mu from the program's spec")

    def spec_at(self, round_: int) -> LocalSpec:
        """The spec round `round_` (0-based) runs with."""
        if self.round_specs is None:
            return self.spec
        if not 0 <= round_ < len(self.round_specs):
            raise ValueError(f"round {round_} has no local spec (the schedule covers {len(self.round_specs)} rounds)")
        return self.round_specs[round_]

    @property
    def phases(self) -> tuple[LocalProgram, ...]:
        """The program's phases (one: itself; see PhasedProgram)."""
        return (self,)

    def batch_for(self, n_records: int, batch_size: int, round_: int) -> int:
        """The batch size a client with `n_records` records and batch `batch_size` uses in round `round_`."""
        if round_ == 0 and self.round1_batch is not None:
            return n_records if self.round1_batch == "full" else min(int(self.round1_batch), n_records)
        return batch_size

    def steps_for(self, n_records: int, batch_size: int) -> int:
        """Local steps per round for a client with n_records records and batch size batch_size."""
        if self.steps is not None:
            return self.steps
        assert self.epochs is not None
        return max(1, math.ceil(self.epochs * math.ceil(n_records / batch_size)))

    def plan(self, client: int, n_records: int, batch_size: int, noise_multiplier: float, round_: int) -> ClientPlan:
        """What `client` runs in round `round_` (0-based)."""
        lrs = None
        if self.step_sizes is not None:
            if not 0 <= round_ < len(self.step_sizes):
                raise ValueError(f"round {round_} has no step sizes "
                                 f"(the schedule covers {len(self.step_sizes)} rounds)")
            lrs = self.step_sizes[round_]
        batch_size = self.batch_for(n_records, batch_size, round_)
        return ClientPlan(client, batch_size, self.steps_for(n_records, batch_size),
                          noise_multiplier if self.private else 0.0, step_lrs=lrs)

    def event(self, n_records: int, batch_size: int, noise_multiplier: float) -> DpEvent | None:
        """The sample-level DP event of one round of this program for one client (None if not private)."""
        if not self.private:
            return None
        steps = self.steps_for(n_records, batch_size)
        if self.spec.sampling == "poisson":
            return dpsgd_event(noise_multiplier, steps, sampling="poisson",
                               sample_rate=min(1.0, batch_size / n_records))
        return dpsgd_event(noise_multiplier, steps, sampling="fixed", population=n_records, sample_size=batch_size)

    @property
    def sampling(self) -> str:
        return self.spec.sampling

    def init(self, population: int) -> dict[str, torch.Tensor] | None:
        """The program's state before round 1 for `population` clients: every client's clip at the initial clip under
        adaptive clipping; None (stateless) otherwise."""
        adaptive = self.spec.adaptive_clipping
        if adaptive is None:
            return None
        return {SAMPLE_CLIP: torch.full((population,), adaptive.initial_clip, dtype=torch.float32)}

    def adaptive_budget_problem(self, noise: np.ndarray, n_records: np.ndarray, batch_sizes: np.ndarray) -> str | None:
        """Why the count's noise sigma_b leaves some client's update no budget (Theorem 1 needs 2 sigma_b > z_k for
        every client with noise), or None; vectorised over the population (`noise`, `n_records`, `batch_sizes`: one
        per client). The expected batch is min(b_k, n_k) (round 0's too, under `round1_batch`)."""
        adaptive = self.spec.adaptive_clipping
        if adaptive is None:
            return None
        noise = np.asarray(noise, dtype=np.float64)
        n = np.asarray(n_records, dtype=np.float64)
        batches = [np.asarray(batch_sizes, dtype=np.float64)]
        if self.round1_batch is not None:
            batches.append(n if self.round1_batch == "full" else np.full_like(n, float(self.round1_batch)))
        for b in batches:
            m = np.minimum(b, n)
            sigma_b = np.full_like(m, adaptive.count_noise) if adaptive.count_noise is not None else m / 20.0
            bad = np.flatnonzero((noise > 0) & ~(2.0 * sigma_b > noise))
            if len(bad):
                i = int(bad[0])
                how = "" if adaptive.count_noise is not None else f" (null: the expected batch {m[i]:g} / 20)"
                return (f"{COUNT_NOISE_KEY}: sigma_b={sigma_b[i]:g}{how} leaves client {i} "
                        f"(noise multiplier z={noise[i]:g}) no budget for its update noise (Theorem 1 needs 2 sigma_b "
                        f"> z; {len(bad)} client(s) affected); raise count_noise above {noise[i] / 2:g}")
        return None

    def run(self, inputs: LocalInputs) -> LocalOutput:
        """The selected clients' round: the engine trains them (`engine_round.train_on_engine`); under adaptive
        clipping each starts from its clip in `inputs.state` and the output's state holds the clips it ends with."""
        if self.spec.adaptive_clipping is None:
            return train_on_engine(self, inputs)
        return _adaptive_round(self, inputs)


def sgd(lr: float, *, steps: int | None = None, epochs: float | None = None, loss: str = "cross_entropy",
        momentum: float = 0.0, prox_mu: float = 0.0, trainable: tuple[str, ...] | None = None) -> LocalProgram:
    """Non-private local SGD over shuffled minibatches (mean loss over the actual batch)."""
    spec = LocalSpec(lr=lr, loss=loss, sampling="shuffle", momentum=momentum, prox_mu=prox_mu, trainable=trainable)
    return LocalProgram(spec, steps, epochs)


def dpsgd(lr: float, clip: float, *, steps: int | None = None, epochs: float | None = None, sampling: str = "poisson",
          loss: str = "cross_entropy", momentum: float = 0.0, prox_mu: float = 0.0,
          trainable: tuple[str, ...] | None = None, adaptive_clipping: AdaptiveClipping | None = None) -> LocalProgram:
    """Sample-level DP-SGD: per-sample clipping to `clip` (one global L2 norm), Gaussian noise on the sum.

    Poisson sampling (default) is accounted as the Poisson sampled Gaussian (add/remove); fixed-size
    sampling as sampling without replacement (replace-one). `adaptive_clipping`: each client's clip starts at
    `clip` (its initial_clip) and follows the target quantile of its per-sample norms (`LocalSpec`); the events and
    the calibration are the same.
    """
    spec = LocalSpec(lr=lr, loss=loss, clip=clip, sampling=sampling, momentum=momentum, prox_mu=prox_mu,
                     trainable=trainable, adaptive_clipping=adaptive_clipping)
    return LocalProgram(spec, steps, epochs, private=True)


def _adaptive_round(program: LocalProgram, inputs: LocalInputs) -> LocalOutput:
    """A round of DP-SGD with sample-level adaptive clipping: the selected clients' clips from the state into their
    plans, the clips they end with back into a new state (the one given is not changed), and the cohort's clips in
    the round's metrics (`sample_clip_mean` / `_min` / `_max`)."""
    if inputs.broadcast is not None:
        return train_on_engine(program, inputs)  # refused there, with the reason
    state = inputs.state
    if not isinstance(state, dict) or not isinstance(state.get(SAMPLE_CLIP), torch.Tensor):
        raise ValueError("adaptive clipping needs the clients' clips: pass the program's state (its init) in "
                         "LocalInputs.state")
    clips = state[SAMPLE_CLIP]
    ids = torch.as_tensor([int(c) for c in inputs.clients], dtype=torch.int64, device=clips.device)
    out = train_on_engine(program, inputs, clips.index_select(0, ids).tolist())
    assert out.state is not None, "an adaptive spec's engine result carries the clips"
    ended = torch.tensor(out.state, dtype=clips.dtype, device=clips.device)
    new = clips.clone()
    new[ids] = ended
    metrics = {"sample_clip_mean": float(ended.mean()), "sample_clip_min": float(ended.min()),
               "sample_clip_max": float(ended.max())}
    return out._replace(metrics=metrics, state={**state, SAMPLE_CLIP: new})


def clipped_sgd(step_sizes, clip: float, *, clip_mode: str = "per_example", sampling: str = "shuffle",
                loss: str = "cross_entropy", prox_mu: float = 0.0) -> LocalProgram:
    """Noisy-FedAvg/FedProx's local steps: w ← w − η_{k,t}(clip_V(g) + α(w − w_t)), no noise inside.

    `step_sizes` is η[rounds][K]; the gradient is clipped per example (then averaged) or on the batch mean. Not
    `private` by itself: the upload noise (`ParameterNoise`) is the mechanism, and clipping bounds its sensitivity.
    """
    eta = np.asarray(step_sizes, dtype=np.float64)
    if eta.ndim != 2 or eta.size == 0:
        raise ValueError("step_sizes must be a non-empty [rounds][steps] array")
    spec = LocalSpec(lr=float(eta[0, 0]), loss=loss, clip=clip, clip_mode=clip_mode, sampling=sampling, prox_mu=prox_mu)
    return LocalProgram(spec, steps=eta.shape[1], step_sizes=eta.tolist())

"""Empirical sensitivity of Noisy-FedAvg / Noisy-FedProx: how far apart do models trained on neighbouring datasets end
up? (spec fdp_accounting.md §7, the idea of the paper's Fig. 2 / Table VII; no result value of the paper is a target.)

    result = run_sensitivity("ci", Path("out"))     # OUT/sensitivity.{csv,json,md,png}
    dpfl reproduce fdp-sensitivity --scale ci|full --out DIR

Neighbours. 𝒞′ equals 𝒞 except that record j⋆ of client i⋆ (defaults 0, 0) is replaced (`replacement`):
`test_other_class` (default) takes a record of the global test split whose label differs from the replaced one's
(drawn from the seed's stream; the test split itself is left unchanged), `label_flip` keeps the input and moves the
label to the next class, `random_input` keeps the label and draws the input uniformly in the training inputs' range.

Runs. For every setting and seed four runs advance together, one round at a time (`_lockstep`: one of them computes at
any moment, so nothing depends on thread timing and no trajectory has to be stored): the base run on 𝒞, a control run
on an unchanged deep copy of 𝒞, and two runs on 𝒞′. All four have the same seed and a fresh model of the same
initialisation, so they share w_0 and every mini-batch index sequence: the engine keys batches and noise by
(seed, round, client), never by data values. The `coupled` neighbour run also shares every noise draw n_{i,t} (common
random numbers), so w_t − w′_t is purely the effect of the changed record; the `independent` one draws its upload
noise from other streams (`ParameterNoise.noise_offset` = 2^19), reported separately. The control pair must be at
distance exactly 0 at every round (CPU, deterministic kernels); anything else raises `ControlPairError`.

The runs are not privacy-accounted (their upload stage is marked unaccounted, which changes nothing in training): this
experiment measures distances, the f-DP guarantee of such a run is `dpfl run`'s privacy.json.

Bound. When a smoothness constant L is given, the worst-case recursion d_{t+1} = ρ_t d_t + γ_t (d_0 = 0) uses γ_t, ρ_t
of `dpfl.privacy.fdp_sensitivity.sensitivities` on the run's realised step sizes, with m the number of uploads averaged
per round. Under coupling the noise cancels, so ‖w_{t+1} − w′_{t+1}‖ = ‖φ(w_t) − φ′(w′_t)‖ ≤ ‖φ(w_t) − φ′(w_t)‖ +
‖φ′(w_t) − φ′(w′_t)‖ ≤ γ_t + ρ_t ‖w_t − w′_t‖: the recursion bounds every round's distance. It says nothing about
the independent runs, whose rows have no bound. At ci scale L is exact: the softmax cross-entropy of a linear model
with bias has Hessian (diag(p) − ppᵀ) ⊗ [x;1][x;1]ᵀ w.r.t. (W, b), and ‖diag(p) − ppᵀ‖₂ ≤ 1/2, so every per-sample
loss is L-smooth with L = max_i (‖x_i‖² + 1)/2 over the training records of 𝒞 and 𝒞′ (computed at run time). For the
full scale's neural networks no L is verifiable, so no bound is drawn.

Scales (`sensitivity_settings`):
- ci (configs/fdp/sensitivity_ci.yaml): digits, logr, 5 clients (iid), full participation, K = 5, T = 30, V = 1,
  σ = 0.01, lr 0.1 constant, batch 16, per-example clipping, 1 seed; Noisy-FedAvg and Noisy-FedProx α ∈ {0.01, 0.1, 1}.
- full (configs/fdp/sensitivity_paper.yaml, spec §7): CIFAR-10 with the GroupNorm ResNet-18 if present locally, else
  Fashion-MNIST with LeNet-5, else digits with mlp2 (nothing is downloaded); Dirichlet(0.1) label split with
  min(500, ⌊N_train/m⌋) samples per client; m = 20, K = 5, V = 10, T = 600, lr 0.1 constant, batch 25, σ = 1e-2,
  per-example clipping, 3 seeds; FedAvg and FedProx α ∈ {0.01, 0.1, 1}, and FedAvg one-factor sweeps around the base
  m ∈ {10, 20, 50}, K ∈ {1, 5, 10}, V ∈ {1, 5, 10}.
Cost, measured on one shared CPU core: ci ~25 s in all. Full on Fashion-MNIST / LeNet-5 takes ~9 s per run and round
(20 clients x 5 steps x 25 per-example gradients), so one setting and seed (4 runs x 600 rounds) is ~6 h and the ten
settings x 3 seeds ~180 h; `couplings=("coupled",)` saves a quarter, `seeds` / `rounds` reduce it further.

Resuming. Each finished (setting, seed) pair is saved whole in OUT/pairs/<setting>-seed<seed>.json (its config, the
neighbours and couplings, its rows and summary, the environment that computed it); the same command run again reads
those back and computes only the missing pairs, so a killed study loses at most the pair it was computing. A saved
pair of another experiment (other --rounds, neighbours, couplings) is refused before anything runs. With
`compute=False` (`--tables-only`) only the saved pairs are read and the tables rewritten.

Outputs (written atomically after every setting and seed, so a long run shows its progress): `sensitivity.csv`, one
row per (setting, seed, coupling, round) with COLUMNS (test accuracies of the base run and of that row's neighbour run
every `evaluation.every` = 10 rounds and at the last round, else empty; `bound` empty without L and on independent
rows; `control_distance` is 0); `sensitivity.json`, the same rows plus
the settings, the dataset and model used, each pair's samples per client, L, γ_0, ρ_0 and the replaced record;
`sensitivity.md`, a summary table per setting; `sensitivity.png` (`dpfl.results.sensitivity_plot`).

One file over 600 lines on purpose: one experiment (the neighbours, the lockstep runs, the distances and the bound
beside them, its outputs); the plot and the bound's formulas already live in results/ and privacy/.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpfl.data import available, dataset_options, load_dataset
from dpfl.data.errors import DatasetNotFoundError
from dpfl.data.federated import FederatedDataset
from dpfl.experiment.build import (build_algorithm, build_data, noisy_accounting, refuse_unaccounted_buffers,
                                   resolve_batch_sizes, resolve_budgets)
from dpfl.experiment.config import RunConfig, config_to_yaml, load_config
from dpfl.experiment.federated_run import FederatedRun, RunResult, RunState
from dpfl.models import build_model
from dpfl.privacy.fdp_sensitivity import sensitivities
from dpfl.reproduce.jobs import config_dir, select_names
from dpfl.reproduce.runner import first_difference
from dpfl.results.environment import computed_and_written, describe_job, job_executions
from dpfl.results.run_files import write_json_atomic, write_text_atomic
from dpfl.results.sensitivity_plot import plot_sensitivity
from dpfl.seeding import Purpose, numpy_generator

__all__ = ["ALPHAS", "COLUMNS", "COUPLINGS", "FILES", "REPLACEMENTS", "SCALES", "SPEC", "SWEEPS", "ControlPairError",
           "DatasetChoice", "PairResult", "SensitivityResult", "SensitivitySetting", "base_config", "choose_dataset",
           "logr_smoothness", "make_neighbour", "measure_pair", "recursion_bound", "run_sensitivity",
           "sensitivity_settings", "setting_config"]

SCALES = ("ci", "full")
COUPLINGS = ("coupled", "independent")
REPLACEMENTS = ("test_other_class", "label_flip", "random_input")
INDEPENDENT_NOISE_OFFSET = 1 << 19  # the independent neighbour's upload noise streams: client c draws stream c + 2^19
REPLACEMENT_STREAM = 0x5345  # round key of the Purpose.DATA stream that picks the replacement record
ALPHAS = (0.01, 0.1, 1.0)  # FedProx α of both scales
# full scale, FedAvg one-factor sweeps around the base: (symbol, config field, values)
SWEEPS = (("m", "data.clients", (10, 20, 50)), ("K", "training.local_steps", (1, 5, 10)),
          ("V", "privacy.clip", (1.0, 5.0, 10.0)))
SPEC: dict[str, dict[str, Any]] = {
    "ci": {"base": "sensitivity_ci.yaml", "rounds": 30, "seeds": 1, "smoothness": "logr"},
    "full": {"base": "sensitivity_paper.yaml", "rounds": 600, "seeds": 3, "smoothness": None},
}
FULL_DATASETS = (("cifar10", "resnet18_gn"), ("fashion_mnist", "lenet5"), ("digits", "mlp2"))  # in order of preference
FULL_SAMPLES_PER_CLIENT = 500
COLUMNS = ("setting", "algo", "alpha", "seed", "coupling", "round", "distance", "bound", "control_distance",
           "test_accuracy", "test_accuracy_neighbour")
REPLACEMENT_TEXT = {"test_other_class": "by a record of the test split with another label",
                    "label_flip": "its label moved to the next class", "random_input": "its input drawn at random"}
COUPLING_TEXT = {"coupled": "same w_0, mini-batches and noise draws (common random numbers)",
                 "independent": "same w_0 and mini-batches; the neighbour's upload noise from streams shifted by "
                                f"{INDEPENDENT_NOISE_OFFSET}"}
FILES = {"csv": "sensitivity.csv", "json": "sensitivity.json", "md": "sensitivity.md", "png": "sensitivity.png"}


class ControlPairError(RuntimeError):
    """The control pair (𝒞 = 𝒞′) ended up at a non-zero distance: the runs are not deterministic, so no distance of
    this experiment can be attributed to the changed record."""


# ---- settings -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SensitivitySetting:
    """One line of the experiment: an algorithm (α for FedProx) at (m, K, V); `factor` names a one-factor sweep."""

    name: str
    algo: str  # fedavg | fedprox
    alpha: float | None
    m: int
    K: int
    V: float
    overrides: tuple[str, ...]  # applied to the scale's base config
    factor: str | None = None  # "m", "K" or "V" for a sweep setting, None for the algorithm comparison
    describe: str = ""


def _check_scale(scale: str) -> None:
    if scale not in SPEC:
        raise ValueError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")


def base_config(scale: str) -> Path:
    """configs/fdp/<base> of a scale."""
    _check_scale(scale)
    return config_dir("fdp") / SPEC[scale]["base"]


def _describe(algo: str, alpha: float | None, m: int, K: int, V: float) -> str:
    name = "Noisy-FedAvg" if algo == "fedavg" else f"Noisy-FedProx α = {alpha:g}"
    return f"{name}, m = {m}, K = {K}, V = {V:g}"


def sensitivity_settings(scale: str) -> list[SensitivitySetting]:
    """The settings of a scale: FedAvg and FedProx α ∈ ALPHAS at the base (m, K, V), plus at full scale the FedAvg
    one-factor sweeps of SWEEPS (a sweep value equal to the base is the base setting itself, listed once)."""
    base = load_config(base_config(scale))
    m, K, V = base.data.clients, base.training.local_steps, float(base.privacy.clip or 0.0)
    assert K is not None  # the schema requires local_steps for the noisy algorithms
    out = [SensitivitySetting("fedavg", "fedavg", None, m, K, V, ("algorithm.name=noisy_fedavg",),
                              describe=_describe("fedavg", None, m, K, V))]
    for alpha in ALPHAS:
        out.append(SensitivitySetting(f"fedprox-a{alpha:g}", "fedprox", alpha, m, K, V,
                                      ("algorithm.name=noisy_fedprox", f"algorithm.params.alpha={alpha!r}"),
                                      describe=_describe("fedprox", alpha, m, K, V)))
    if scale == "full":
        for symbol, path, values in SWEEPS:
            for value in values:
                point = {"m": m, "K": K, "V": V, symbol: value}
                if (point["m"], point["K"], point["V"]) == (m, K, V):
                    continue
                out.append(SensitivitySetting(
                    f"fedavg-{symbol}{value:g}", "fedavg", None, int(point["m"]), int(point["K"]), float(point["V"]),
                    ("algorithm.name=noisy_fedavg", f"{path}={value!r}"), factor=symbol,
                    describe=_describe("fedavg", None, int(point["m"]), int(point["K"]), float(point["V"]))
                    + f" (sweep of {symbol})"))
    return out


@dataclass(frozen=True)
class DatasetChoice:
    """The dataset and model a scale runs on; `n_train` is the size of its training split (None: not loaded)."""

    dataset: str
    model: str
    n_train: int | None
    reason: str

    def samples_per_client(self, m: int) -> int | None:
        """min(500, ⌊N_train/m⌋) at full scale (None when the base config's partition decides)."""
        return None if self.n_train is None else min(FULL_SAMPLES_PER_CLIENT, self.n_train // m)


def _present(name: str) -> bool:
    return any(r["name"] == name and r.get("source") != "missing" for r in available())


def choose_dataset(scale: str) -> DatasetChoice:
    """ci: the base config's dataset and model. full: the first of FULL_DATASETS present on this machine (spec §7:
    CIFAR-10, else Fashion-MNIST, else digits); nothing is downloaded."""
    _check_scale(scale)
    if scale == "ci":
        cfg = load_config(base_config(scale))
        return DatasetChoice(cfg.data.dataset, cfg.model.name, None, "the ci base config")
    missing = []
    for name, model in FULL_DATASETS:
        if not _present(name):
            missing.append(name)
            continue
        options = {"download": False} if "download" in dataset_options(name) else {}
        try:
            n_train = load_dataset(name, **options).n_train
        except DatasetNotFoundError:
            missing.append(name)
            continue
        reason = "the spec's dataset" if not missing else f"{' and '.join(missing)} not on this machine"
        return DatasetChoice(name, model, int(n_train), reason)
    raise DatasetNotFoundError(f"none of {', '.join(n for n, _ in FULL_DATASETS)} is available")  # pragma: no cover


def setting_config(scale: str, setting: SensitivitySetting, *, seed: int = 0, rounds: int | None = None,
                   choice: DatasetChoice | None = None) -> RunConfig:
    """The RunConfig of one setting and seed: the scale's base config, the dataset choice (full scale: dataset, model,
    samples per client), the setting's overrides, the seed and (if given) the number of rounds."""
    overrides: list[str] = []
    if scale == "full":
        choice = choose_dataset(scale) if choice is None else choice
        overrides += [f"data.dataset={choice.dataset}", f"model.name={choice.model}"]
        spc = choice.samples_per_client(setting.m)
        if spc is not None:
            overrides.append(f"data.samples_per_client={spc}")
    overrides += [*setting.overrides, f"seed={seed}"]
    if rounds is not None:
        overrides.append(f"training.rounds={rounds}")
    return load_config(base_config(scale), overrides)


# ---- neighbours and the bound -------------------------------------------------------------------------


def make_neighbour(data: FederatedDataset, *, client: int = 0, record: int = 0,
                   replacement: str = "test_other_class", seed: int = 0) -> tuple[FederatedDataset, dict[str, Any]]:
    """(𝒞′, what changed): a deep copy of `data` whose client `client` has training record `record` replaced."""
    if replacement not in REPLACEMENTS:
        raise ValueError(f"replacement must be one of {', '.join(REPLACEMENTS)}, got {replacement!r}")
    if not 0 <= client < data.n_clients:
        raise ValueError(f"client {client} is outside 0..{data.n_clients - 1}")
    n = data.clients[client].n_train
    if not 0 <= record < n:
        raise ValueError(f"record {record} is outside 0..{n - 1} (client {client} has {n} training records)")
    if data.n_classes < 2:
        raise ValueError("the sensitivity experiment needs a classification dataset (n_classes >= 2)")
    out = copy.deepcopy(data)
    c = out.clients[client]
    x_old, y_old = c.x_train[record].clone(), int(c.y_train[record])
    rng = numpy_generator(seed, Purpose.DATA, REPLACEMENT_STREAM, client)
    change: dict[str, Any] = {"client": client, "record": record, "replacement": replacement, "label": y_old}
    if replacement == "test_other_class":
        candidates = np.flatnonzero(data.y_test.numpy() != y_old)
        if not len(candidates):
            raise ValueError(f"the test split has no record whose label differs from {y_old}")
        index = int(rng.choice(candidates))
        x_new, y_new = data.x_test[index].clone(), int(data.y_test[index])
        change["test_index"] = index
    elif replacement == "label_flip":
        x_new, y_new = x_old.clone(), (y_old + 1) % data.n_classes
    else:
        everything = torch.cat([cl.x_train for cl in data.clients])
        lo, hi = float(everything.min()), float(everything.max())
        x_new = torch.from_numpy(rng.uniform(lo, hi, size=tuple(x_old.shape))).to(x_old.dtype)
        y_new = y_old
        change["input_range"] = [lo, hi]
    c.x_train[record] = x_new
    c.y_train[record] = y_new
    change["new_label"] = y_new
    change["input_distance"] = float(torch.linalg.vector_norm((x_new - x_old).double()))
    return out, change


def logr_smoothness(*datasets: FederatedDataset, bias: bool = True) -> float:
    """L = max_i (‖x_i‖² + 1)/2 (without bias ‖x_i‖²/2) over every training record of `datasets`: the exact
    smoothness bound of the softmax cross-entropy of a linear model (spec §7's convex toy)."""
    worst = 0.0
    for data in datasets:
        for c in data.clients:
            if c.n_train:
                worst = max(worst, float(c.x_train.double().flatten(1).pow(2).sum(1).max()))
    return (worst + (1.0 if bias else 0.0)) / 2.0


def recursion_bound(gamma: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """d[t] for t = 1..T of d_{t+1} = ρ_t d_t + γ_t, d_0 = 0 (float64; grows geometrically when ρ > 1)."""
    d, out = 0.0, np.empty(len(gamma))
    with np.errstate(over="ignore"):
        for t, (g, r) in enumerate(zip(np.asarray(gamma, np.float64), np.asarray(rho, np.float64), strict=True)):
            d = r * d + g
            out[t] = d
    return out


# ---- one pair of runs ---------------------------------------------------------------------------------


@dataclass
class PairResult:
    """One setting and seed: per-round distances (index t−1 is round t), the bound, accuracies and what changed."""

    rounds: int
    m: int
    L: float | None
    distance: dict[str, np.ndarray]  # coupling -> [T]
    control: np.ndarray  # [T], exactly 0
    bound: np.ndarray | None  # [T] (coupled runs), None without L
    gamma: np.ndarray
    rho: np.ndarray | None
    accuracy: dict[str, dict[int, float]]  # "base" or a coupling -> {round: test accuracy}
    change: dict[str, Any]
    train_sizes: list[int]
    dataset: dict[str, Any] = field(default_factory=dict)

    def rows(self, setting: str, algo: str, alpha: float | None, seed: int) -> list[dict[str, Any]]:
        """The CSV rows of this pair (COLUMNS), coupled first."""
        out = []
        for coupling, dist in self.distance.items():
            for t in range(1, self.rounds + 1):
                out.append({
                    "setting": setting, "algo": algo, "alpha": alpha, "seed": seed, "coupling": coupling, "round": t,
                    "distance": float(dist[t - 1]),
                    "bound": float(self.bound[t - 1]) if self.bound is not None and coupling == "coupled" else None,
                    "control_distance": float(self.control[t - 1]),
                    "test_accuracy": self.accuracy["base"].get(t),
                    "test_accuracy_neighbour": self.accuracy[coupling].get(t),
                })
        return out

    def max_ratio(self) -> float | None:
        """max_t distance_t / d_t of the coupled runs (≤ 1 when the bound holds), None without a bound."""
        if self.bound is None or "coupled" not in self.distance:
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(self.bound > 0, self.distance["coupled"] / self.bound, 0.0)
        return float(np.max(ratio))


def _smoothness(smoothness: float | str | None, cfg: RunConfig, *datasets: FederatedDataset) -> float | None:
    if smoothness is None:
        return None
    if smoothness == "logr":
        if cfg.model.name != "logr":
            raise ValueError(f"the exact smoothness constant is known for the logr model only, got {cfg.model.name!r}")
        return logr_smoothness(*datasets, bias=bool(cfg.model.options.get("bias", True)))
    if isinstance(smoothness, str) or not float(smoothness) > 0:
        raise ValueError(f"smoothness must be None, 'logr' or a number > 0, got {smoothness!r}")
    return float(smoothness)


def _make_run(cfg: RunConfig, data: FederatedDataset, *, eval_every: int, noise_offset: int = 0) -> FederatedRun:
    """A FederatedRun of `cfg` on `data` with a fresh model of the run seed's initialisation; not accounted."""
    model = build_model(cfg.model.name, tuple(data.input_shape), data.n_classes, seed=cfg.seed, **cfg.model.options)
    refuse_unaccounted_buffers(cfg, model)
    budgets = resolve_budgets(cfg)
    algorithm = build_algorithm(cfg)
    upload = replace(algorithm.upload, accounted=False, noise_offset=noise_offset)
    algorithm = replace(algorithm, upload=upload)
    return FederatedRun(data, model, algorithm, rounds=cfg.training.rounds, batch_sizes=resolve_batch_sizes(cfg, data),
                        budgets=budgets, seed=cfg.seed, eval_every=eval_every)


def _distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """‖a − b‖₂ over all parameters, in float64."""
    if a.keys() != b.keys():
        raise ValueError("the two models have different parameters")
    return math.sqrt(sum(float((a[n].double() - b[n].double()).pow(2).sum()) for n in a))


def _lockstep(runs: Mapping[str, FederatedRun],
              on_round: Callable[[int, dict[str, Mapping[str, torch.Tensor]]], None]) -> dict[str, RunResult]:
    """Run `runs` round by round together: after each round, `on_round(t, {name: w_t})` sees every run's model.

    Each run goes in its own thread, but a lock lets only one of them compute at a time (the same arithmetic as
    running them one after the other); a barrier after each round calls `on_round`. An error in a run or in
    `on_round` breaks the barrier, stops the others and is raised here.
    """
    names = list(runs)
    turn = threading.Lock()
    states: dict[str, RunState] = {}
    results: dict[str, RunResult] = {}
    errors: list[BaseException] = []

    def after_round() -> None:  # the barrier's action: every run has finished the same round
        rounds = {states[n].round for n in names}
        finished = {states[n].stop_reason is not None for n in names}
        if len(rounds) != 1 or len(finished) != 1:
            raise RuntimeError("the runs of a pair went out of step: "
                               + ", ".join(f"{n} at round {states[n].round} ({states[n].stop_reason})" for n in names))
        on_round(rounds.pop(), {n: states[n].params for n in names})

    barrier = threading.Barrier(len(names), action=after_round)

    def work(name: str) -> None:
        turn.acquire()
        try:
            def checkpoint(state: RunState) -> None:
                states[name] = state
                turn.release()
                try:
                    barrier.wait()
                finally:
                    turn.acquire()

            results[name] = runs[name].run(on_checkpoint=checkpoint, checkpoint_every=1)
        except threading.BrokenBarrierError:
            pass  # another run failed (its error is recorded) or the main thread gave up
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)
            barrier.abort()
        finally:
            turn.release()

    threads = [threading.Thread(target=work, args=(n,), name=f"sensitivity-{n}", daemon=True) for n in names]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    except BaseException:
        barrier.abort()
        raise
    if errors:
        raise errors[0]
    if len(results) != len(names):  # pragma: no cover - a broken barrier always records its cause
        raise RuntimeError("a run of the pair stopped without an error")
    return results


def measure_pair(cfg: RunConfig, *, data: FederatedDataset | None = None, smoothness: float | str | None = None,
                 client: int = 0, record: int = 0, replacement: str = "test_other_class",
                 couplings: Sequence[str] = COUPLINGS, progress: Callable[[str], None] | None = None,
                 label: str = "") -> PairResult:
    """Train the base, control and neighbour runs of `cfg` (a noisy_fedavg / noisy_fedprox config) in lockstep.

    `data`: the federated dataset 𝒞 (default `build_data(cfg)`). `smoothness`: None (no bound), a number L, or
    "logr" (the exact L of a logr model, from the training records of 𝒞 and 𝒞′). Raises ControlPairError as soon as
    the control pair is apart.
    """
    if cfg.algorithm.name not in ("noisy_fedavg", "noisy_fedprox"):
        raise ValueError(f"the sensitivity experiment runs noisy_fedavg or noisy_fedprox, got {cfg.algorithm.name!r}")
    unknown = [c for c in couplings if c not in COUPLINGS]
    if unknown or not couplings or len(set(couplings)) != len(couplings):
        raise ValueError(f"couplings must be distinct values of {', '.join(COUPLINGS)}, got {list(couplings)}")
    base = build_data(cfg) if data is None else data
    neighbour, change = make_neighbour(base, client=client, record=record, replacement=replacement, seed=cfg.seed)
    control = copy.deepcopy(base)
    L = _smoothness(smoothness, cfg, base, neighbour)
    accounting = noisy_accounting(cfg)
    m = cfg.planned_cohort  # all clients or a fixed k: the schema refuses Poisson selection for noisy algorithms
    assert m is not None
    sens = sensitivities(accounting.algo, accounting.step_sizes, accounting.clip, m, L=L,
                         alpha=accounting.alpha if accounting.algo == "fedprox" else None)
    bound = recursion_bound(sens.gamma, sens.rho) if sens.rho is not None else None
    T, every = cfg.training.rounds, cfg.evaluation.every
    runs = {"base": _make_run(cfg, base, eval_every=every), "control": _make_run(cfg, control, eval_every=T)}
    for coupling in couplings:
        offset = INDEPENDENT_NOISE_OFFSET if coupling == "independent" else 0
        runs[coupling] = _make_run(cfg, neighbour, eval_every=every, noise_offset=offset)
    dist = {c: np.zeros(T) for c in couplings}
    ctrl = np.zeros(T)
    report_every = max(1, T // 10)

    def on_round(t: int, params: dict[str, Mapping[str, torch.Tensor]]) -> None:
        ctrl[t - 1] = _distance(params["base"], params["control"])
        if ctrl[t - 1] != 0.0:
            raise ControlPairError(f"{label}the control pair (no record changed) is {ctrl[t - 1]:.3g} apart after "
                                   f"round {t}: the runs are not deterministic, so the distances measure nothing")
        for c in couplings:
            dist[c][t - 1] = _distance(params["base"], params[c])
        if progress is not None and (t % report_every == 0 or t == T):
            progress(f"{label}round {t}/{T}: " + ", ".join(f"{c} distance {dist[c][t - 1]:.3g}" for c in couplings))

    results = _lockstep(runs, on_round)
    for name, res in results.items():
        cohorts = {len(row["selected"]) for row in res.history}
        if len(res.history) != T or cohorts != {m}:
            raise RuntimeError(f"{label}run {name!r} did not average {m} uploads in each of {T} rounds "
                               f"({len(res.history)} rounds, cohorts {sorted(cohorts)})")
    accuracy = {name: {int(row["round"]): float(row["test_accuracy"]) for row in results[name].history
                       if row.get("test_accuracy") is not None} for name in ("base", *couplings)}
    return PairResult(T, m, L, dist, ctrl, bound, sens.gamma, sens.rho, accuracy, change,
                      [int(s) for s in base.train_sizes], {"name": base.info.get("dataset", cfg.data.dataset),
                                                            "model": cfg.model.name, "n_test": int(len(base.y_test))})


# ---- the experiment -----------------------------------------------------------------------------------


@dataclass
class SensitivityResult:
    """What `run_sensitivity` wrote (`paths`: csv, json, md, png) and its CSV rows."""

    paths: dict[str, Path]
    rows: list[dict[str, Any]]
    pairs: list[dict[str, Any]] = field(default_factory=list)


def run_sensitivity(scale: str, out: Path, *, seeds: int | None = None, rounds: int | None = None,
                    progress: Callable[[str], None] | None = None, replacement: str = "test_other_class",
                    client: int = 0, record: int = 0, couplings: Sequence[str] = COUPLINGS,
                    settings_pattern: str | None = None, compute: bool = True) -> SensitivityResult:
    """Run every setting of `scale` for `seeds` seeds (default: the scale's) and `rounds` rounds (default: the
    scale's); write OUT/sensitivity.{csv,json,md,png} after each setting and seed. Pairs saved under OUT/pairs by an
    earlier call with the same options are read back, not recomputed; `compute=False` only reads them.

    The neighbours replace training record `record` of client `client` (`replacement`, see `make_neighbour`);
    `couplings` chooses the neighbour runs (both by default; ("coupled",) saves a quarter of the work).
    `settings_pattern`: comma-separated glob patterns of setting names (e.g. "fedavg,fedprox-*") to run a subset.
    Raises ValueError for a bad argument (before anything runs) and ControlPairError if a control pair is apart.
    """
    _check_scale(scale)
    if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1):
        raise ValueError(f"--seeds must be an integer >= 1, got {seeds!r}")
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1):
        raise ValueError(f"--rounds must be an integer >= 1, got {rounds!r}")
    spec = SPEC[scale]
    if replacement not in REPLACEMENTS:
        raise ValueError(f"replacement must be one of {', '.join(REPLACEMENTS)}, got {replacement!r}")
    couplings = tuple(couplings)
    if not couplings or len(set(couplings)) != len(couplings) or any(c not in COUPLINGS for c in couplings):
        raise ValueError(f"couplings must be distinct values of {', '.join(COUPLINGS)}, got {list(couplings)}")
    n_seeds = spec["seeds"] if seeds is None else seeds
    out = Path(out)
    neighbours = {"client": client, "record": record, "replacement": replacement}
    say = progress or (lambda _msg: None)
    choice = choose_dataset(scale)
    every = sensitivity_settings(scale)
    chosen = set(select_names([st.name for st in every], settings_pattern))
    settings = [st for st in every if st.name in chosen]
    configs = {(s.name, seed): setting_config(scale, s, seed=seed, rounds=rounds, choice=choice)
               for s in settings for seed in range(n_seeds)}  # every config is validated before anything runs
    keys = {k: {"config": config_to_yaml(cfg), "neighbours": neighbours, "couplings": list(couplings)}
            for k, cfg in configs.items()}
    saved = {k: _saved_pair(out, *k, key) for k, key in keys.items()}  # another experiment: refused before any run
    if not compute and not any(saved.values()):
        raise ValueError(f"--tables-only: no finished pair of this selection under {out / PAIRS_DIR}")
    T = next(iter(configs.values())).training.rounds
    say(f"fdp-sensitivity {scale}: {len(settings)} settings x {n_seeds} seed(s), {T} rounds, "
        f"{choice.dataset} / {choice.model} ({choice.reason})")
    rows: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []
    for setting in settings:
        for seed in range(n_seeds):
            label = f"{setting.name} seed {seed}: "
            done = saved[(setting.name, seed)]
            if done is None and not compute:
                continue
            computed = done is None
            if done is None:
                say(f"{label}{setting.describe}")
                pair = measure_pair(configs[(setting.name, seed)], smoothness=spec["smoothness"], progress=say,
                                    label=label, couplings=couplings, **neighbours)
                done = {**keys[(setting.name, seed)],
                        "rows": pair.rows(setting.name, setting.algo, setting.alpha, seed),
                        "summary": {**_pair_summary(setting, seed, pair), "environment": describe_job()}}
                write_json_atomic(_pair_path(out, setting.name, seed), done)
            else:
                say(f"{label}finished before")
            rows += done["rows"]
            pairs.append(done["summary"])
            if computed:  # progress on disk after every computed pair (pairs read back add nothing to show)
                _write(out, scale, T, n_seeds, choice, neighbours, couplings, settings, pairs, rows, complete=False)
    complete = len(pairs) == len(configs)
    paths = _write(out, scale, T, n_seeds, choice, neighbours, couplings, settings, pairs, rows, complete=complete)
    return SensitivityResult(paths, rows, pairs)


PAIRS_DIR = "pairs"


def _pair_path(out: Path, setting: str, seed: int) -> Path:
    return out / PAIRS_DIR / f"{setting}-seed{seed}.json"


def _saved_pair(out: Path, setting: str, seed: int, key: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pair saved by an earlier call with the same config, neighbours and couplings; None if there is none; a
    ValueError if OUT holds another experiment's pair (a re-run would mix the two)."""
    path = _pair_path(out, setting, seed)
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    for field_name, wanted in key.items():
        if saved.get(field_name) != wanted:
            why = (first_difference(saved.get("config", ""), wanted) if field_name == "config"
                   else f"{field_name}: {saved.get(field_name)} here, {wanted} asked")
            raise ValueError(f"{path} holds another experiment ({why}); use another --out, or the options that made it")
    return saved


def _pair_summary(setting: SensitivitySetting, seed: int, pair: PairResult) -> dict[str, Any]:
    final = {c: float(d[-1]) for c, d in pair.distance.items()}
    return {
        "setting": setting.name, "seed": seed, "algo": setting.algo, "alpha": setting.alpha, "m": pair.m,
        "K": setting.K, "V": setting.V, "rounds": pair.rounds, "dataset": pair.dataset,
        "samples_per_client": pair.train_sizes, "L": pair.L, "gamma_0": float(pair.gamma[0]),
        "rho_0": float(pair.rho[0]) if pair.rho is not None else None,
        "final_distance": final, "final_bound": float(pair.bound[-1]) if pair.bound is not None else None,
        "max_distance_over_bound": pair.max_ratio(), "control_max": float(np.max(pair.control)),
        "final_test_accuracy": pair.accuracy["base"].get(pair.rounds),
        "final_test_accuracy_neighbour": {c: pair.accuracy[c].get(pair.rounds) for c in pair.distance},
        "changed_record": pair.change,
    }


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_cell(row[c]) for c in COLUMNS])
    return buf.getvalue()


def _mean_std(values: Sequence[float]) -> str:
    if not values:
        return ""
    arr = np.asarray(values, dtype=np.float64)
    return f"{arr.mean():.4g}" + (f" ± {arr.std(ddof=1):.2g}" if len(arr) > 1 else "")


def _markdown(scale: str, rounds: int, n_seeds: int, choice: DatasetChoice, neighbours: Mapping[str, Any],
              settings: Sequence[SensitivitySetting], pairs: Sequence[Mapping[str, Any]], complete: bool) -> str:
    reduced = rounds != SPEC[scale]["rounds"] or n_seeds != SPEC[scale]["seeds"]
    lines = [f"# Empirical sensitivity of Noisy-FedAvg / Noisy-FedProx ({scale} scale{', REDUCED' if reduced else ''})",
             "",
             "Spec fdp_accounting.md §7: ‖w_t − w′_t‖₂ between models trained on neighbouring datasets (training "
             f"record {neighbours['record']} of client {neighbours['client']} replaced: "
             f"{REPLACEMENT_TEXT[neighbours['replacement']]}). `coupled`: the same w_0, mini-batches and noise "
             "draws (common random numbers); `independent`: the neighbour's upload noise from other streams. The "
             "control pair (no record changed) was at distance exactly 0 in every round of every run shown.",
             "",
             f"- Dataset: {choice.dataset} with {choice.model} ({choice.reason}); T = {rounds} rounds; "
             f"{n_seeds} seed(s)"
             + ("" if complete else "; INCOMPLETE (the experiment is still running or was stopped)"),
             f"- {computed_and_written([job_executions(p) for p in pairs], 'pair')}",
             ]
    sizes = sorted({s for p in pairs for s in p["samples_per_client"]})
    if sizes:
        lines.append(f"- Samples per client: {sizes[0]}" + (f" to {sizes[-1]}" if len(sizes) > 1 else ""))
    Ls = [p["L"] for p in pairs if p["L"] is not None]
    if Ls:
        lines.append(f"- Smoothness L = max_i (‖x_i‖² + 1)/2 (exact for softmax cross-entropy of a linear model with "
                     f"bias): {min(Ls):.6g}" + (f" to {max(Ls):.6g}" if max(Ls) > min(Ls) else "")
                     + "; bound: d_{t+1} = ρ_t d_t + γ_t, d_0 = 0 (valid for the coupled runs)")
    else:
        lines.append("- No smoothness constant L (neural networks): no bound")
    lines += ["", "| setting | algo | α | m | K | V | final distance, coupled | final distance, independent | "
              "final bound | max distance / bound | final test acc (base / neighbour) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    violated = []
    for s in settings:
        mine = [p for p in pairs if p["setting"] == s.name]
        if not mine:
            continue
        coupled = [p["final_distance"]["coupled"] for p in mine if "coupled" in p["final_distance"]]
        indep = [p["final_distance"]["independent"] for p in mine if "independent" in p["final_distance"]]
        bounds = [p["final_bound"] for p in mine if p["final_bound"] is not None]
        ratios = [p["max_distance_over_bound"] for p in mine if p["max_distance_over_bound"] is not None]
        if ratios and max(ratios) > 1:
            violated.append(s.name)
        acc = [p["final_test_accuracy"] for p in mine if p["final_test_accuracy"] is not None]
        acc_n = [p["final_test_accuracy_neighbour"].get("coupled") for p in mine]
        acc_n = [a for a in acc_n if a is not None]
        lines.append("| " + " | ".join([
            s.name, s.algo, f"{s.alpha:g}" if s.alpha is not None else "", str(mine[0]["m"]), str(s.K), f"{s.V:g}",
            _mean_std(coupled), _mean_std(indep), _mean_std(bounds) if bounds else "—",
            f"{max(ratios):.3g}" if ratios else "—",
            f"{np.mean(acc):.4f} / {np.mean(acc_n):.4f}" if acc and acc_n else ""]) + " |")
    lines += ["", "Mean ± sample standard deviation over seeds. Files: `sensitivity.csv` (one row per setting, seed, "
              "coupling and round), `sensitivity.json` (the rows, the settings, each pair's samples per client, L, "
              "γ_0, ρ_0 and replaced record), `sensitivity.png`."]
    if violated:
        lines += ["", f"**WARNING: the coupled distance exceeded the worst-case recursion in {', '.join(violated)}: "
                  "the bound or the coupling is broken.**"]
    return "\n".join(lines) + "\n"


def _write(out: Path, scale: str, rounds: int, n_seeds: int, choice: DatasetChoice, neighbours: Mapping[str, Any],
           couplings: Sequence[str], settings: Sequence[SensitivitySetting], pairs: Sequence[Mapping[str, Any]],
           rows: Sequence[Mapping[str, Any]], *, complete: bool) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    spec = SPEC[scale]
    paths = {"csv": write_text_atomic(out / FILES["csv"], _csv_text(rows))}
    doc = {
        "experiment": "fdp-sensitivity", "spec": "fdp_accounting.md §7", "scale": scale, "complete": complete,
        "rounds": rounds, "spec_rounds": spec["rounds"], "seeds": n_seeds, "spec_seeds": spec["seeds"],
        "dataset": {"name": choice.dataset, "model": choice.model, "n_train": choice.n_train, "chosen": choice.reason},
        "neighbours": dict(neighbours),
        "couplings": {c: COUPLING_TEXT[c] for c in couplings},
        "smoothness": ("L = max_i (||x_i||^2 + 1)/2 over the training records of both datasets (exact for logr)"
                       if spec["smoothness"] == "logr" else None),
        "bound": "d_{t+1} = rho_t d_t + gamma_t, d_0 = 0 (coupled rows only)" if spec["smoothness"] else None,
        "control": "the control pair (no record changed) was at distance exactly 0 in every round (checked)",
        "settings": [asdict(s) for s in settings],
        "pairs": list(pairs),
        "columns": list(COLUMNS),
        "rows": list(rows),
        "environment": describe_job(),  # the process that wrote this file; each pair's own is in its summary
    }
    paths["json"] = write_json_atomic(out / FILES["json"], doc)
    md = _markdown(scale, rounds, n_seeds, choice, neighbours, settings, pairs, complete)
    paths["md"] = write_text_atomic(out / FILES["md"], md)
    title = (f"Empirical sensitivity ({scale}): {choice.dataset} / {choice.model}, T = {rounds}, {n_seeds} seed(s); "
             "control pair at distance 0 in every round")
    paths["png"] = plot_sensitivity(rows, out / FILES["png"], title=title)
    return paths

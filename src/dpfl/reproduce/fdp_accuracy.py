"""The f-DP paper's accuracy-versus-noise study (Sun, Shen, Tao, arXiv:2408.15621; spec fdp_accounting.md §8).

Noisy-FedAvg (spec §1.1) on a Dirichlet(0.1) quota split, full participation, over a grid of client counts m,
(local steps K, rounds T) pairs with a fixed budget TK = 30000, and per-client noise std σ. The table is the final
test accuracy (mean ± std over seeds, "diverged" where training blew up: the paper's "-") next to the accountant's
output for the same configuration (μ and ε at δ from privacy.json's `fdp` block, the headline bound and the view),
so that accuracy and privacy sit side by side.

Scales (base configs in configs/fdp/):
- `full` (spec §8): MNIST with LeNet-5 (600 samples per client; `paper_repro.yaml`) and CIFAR-10 with the GroupNorm
  ResNet-18 (`resnet18_gn`, 500 per client; `accuracy_cifar10_resnet18.yaml`); m ∈ {20, 50, 100};
  (K, T) ∈ {(50, 600), (100, 300), (200, 150)}; σ ∈ {1.0, 1e-1, 1e-2, 1e-3}; 5 seeds: 2 x 3 x 3 x 4 x 5 = 360 runs.
  Neither dataset is on this machine: their jobs are "skipped" by the runner. `--dataset fashion_mnist` adds the
  same grid on Fashion-MNIST with LeNet-5 as a STAND-IN for MNIST.
- `reduced`: Fashion-MNIST with LeNet-5, a STAND-IN for MNIST (labelled REDUCED/stand-in in every output); m = 20,
  one scaled-down pair (K, T) = (10, 12) (TK = 120, not 30000), the four σ values, 2 seeds: 8 runs. Measured: 80 s
  wall per run with the 2026-11-30 engine (1 thread, on a 2-core machine shared with other jobs; 4.9 minutes when
  first run), so about 11 minutes in all. Per-example gradients of LeNet-5 for 20 clients x 32 samples cost ~0.4 s
  per local step (the full grid's TK = 30000 is 3-17 hours per run), which is what bounds K and T; expect
  accuracies far below the paper's (σ = 1e-3, seed 0 reached 0.26 after 120 steps, as did the same run with
  negligible noise: at this length the per-example clipping, not the noise, holds it back; docs/papers/fdp.md).
- `ci`: scikit-learn's digits with logistic regression, m = 10 clients of 100 samples, K = 5, T = 3, σ ∈ {1.0, 1e-3},
  1 seed: a smoke test of the pipeline (seconds per run), not the paper's setting.

Values the paper does not state are dpfl defaults, recorded in the base configs and in results.md: learning rate
0.1 (constant schedule; the local lr the spec gives as dpfl default for the sensitivity study, §7), batch size 32,
per-example clipping with V = 1, δ = 1e-5, the default view (no secure aggregation: `upload`, release `transcript`;
composition bound only, since no smoothness L is assumed for these networks), and per-dataset input normalisation.

Methods: Noisy-FedAvg only. Noisy-FedProx is NOT part of this grid: spec §8 states no FedProx coefficient α for the
accuracy study (the α values in §7 belong to the sensitivity experiment), so any α here would be invented. Run it by
hand on a job's config (`dpfl run OUT/runs/<setting>/noisy_fedavg/seed0/config.yaml --set algorithm.name=
noisy_fedprox --set algorithm.params.alpha=...`).

Divergence (`diverged`): a finished run is "diverged" when (a) any evaluated round logged a non-finite test loss or
test accuracy (NaN/inf weights), or (b) its final test accuracy is at most chance + CHANCE_MARGIN (1/C + 0.05 for C
classes) AND its test loss exceeded LOSS_BLOWUP x ln C (10 ln 10 ≈ 23.0 nats; ln C is the loss of the uniform
prediction) at some evaluated round. A run that merely stays near chance with a moderate loss is not "diverged": its
accuracy is shown. dpfl logs no training loss, so the rule reads the global model's test loss, the observable proxy.
A table cell is "diverged" when every finished seed diverged; otherwise it is the mean ± std over the seeds that did
not, with "k/n diverged" next to it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpfl.reproduce.jobs import Grid, GridError, Method, Setting, build_grid, config_dir
from dpfl.reproduce.runner import FAILED, FINISHED, INCOMPLETE, LOGS_DIR, OK, PARTIAL, SKIPPED, Outcome, job_state
from dpfl.reproduce.tables import csv_text, md_table, seeds_ok, seeds_phrase
from dpfl.results.environment import computed_and_written, run_environments
from dpfl.results.run_files import (as_float, as_number, read_metrics, read_privacy, read_summary, training_time,
                                    write_text_atomic)

__all__ = ["CHANCE_MARGIN", "CLIENTS", "COLUMNS", "DATASETS", "DEFAULT_DATASETS", "KT_PAIRS", "LOSS_BLOWUP",
           "PAPER", "SCALES", "SIGMAS", "SPEC", "TK", "Divergence", "cell", "divergence", "grid", "outcomes_from_dirs",
           "settings", "write_results"]

PAPER = "fdp-accuracy"
FAMILY = "fdp"  # configs/fdp/
SCALES = ("ci", "reduced", "full")
TK = 30000
KT_PAIRS = ((50, 600), (100, 300), (200, 150))  # spec §8: TK = 30000
CLIENTS = (20, 50, 100)
SIGMAS = ("1.0", "0.1", "0.01", "0.001")  # σ ∈ {1.0, 1e-1, 1e-2, 1e-3}
DEFAULT_LR = 0.1  # as the sensitivity study's dpfl default (spec §7)
REDUCED_KT = (10, 12)


@dataclass(frozen=True)
class _Data:
    """A dataset of the grid: its setting prefix, model, quota per client, base config, classes, and what it is."""

    short: str
    model: str
    quota: int
    base: str
    normalize: str = ""  # data.options.normalize as an override value ("" keeps the base config's)
    classes: int = 10
    stand_in: str = ""  # "" or what it stands in for


_MNIST_NORM, _FMNIST_NORM = "[0.1307, 0.3081]", "[0.2860, 0.3530]"  # (mean, std) of the training images
_CIFAR10_NORM = "[[0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]]"
DATASETS: dict[str, dict[str, _Data]] = {  # scale -> dataset -> _Data
    "full": {
        "mnist": _Data("mnist", "lenet5", 600, "paper_repro.yaml", _MNIST_NORM),
        "cifar10": _Data("cifar10", "resnet18_gn", 500, "accuracy_cifar10_resnet18.yaml", _CIFAR10_NORM),
        "fashion_mnist": _Data("fmnist", "lenet5", 600, "paper_repro.yaml", _FMNIST_NORM, stand_in="mnist"),
    },
    "reduced": {"fashion_mnist": _Data("fmnist", "lenet5", 600, "accuracy_reduced_fmnist_lenet5.yaml", _FMNIST_NORM,
                                       stand_in="mnist")},
    "ci": {"digits": _Data("digits", "logr", 100, "accuracy_ci_digits_logr.yaml")},
}
DEFAULT_DATASETS = {"full": ("mnist", "cifar10"), "reduced": ("fashion_mnist",), "ci": ("digits",)}
# scale -> the spec's grid at that scale: clients, (K, T) pairs, σ values, seeds
SPEC: dict[str, dict[str, Any]] = {
    "full": {"clients": CLIENTS, "kt": KT_PAIRS, "sigmas": SIGMAS, "seeds": 5},
    "reduced": {"clients": (20,), "kt": (REDUCED_KT,), "sigmas": SIGMAS, "seeds": 2},
    "ci": {"clients": (10,), "kt": ((5, 3),), "sigmas": ("1.0", "0.001"), "seeds": 1},
}
SCALE_TEXT = {
    "full": "the paper's grid (spec fdp_accounting.md §8)",
    "reduced": (f"REDUCED stand-in: Fashion-MNIST + LeNet-5 for MNIST, m = 20, (K, T) = {REDUCED_KT} (TK = "
                f"{REDUCED_KT[0] * REDUCED_KT[1]}, not 30000), 2 seeds; NOT the paper's setting"),
    "ci": "ci smoke test: digits + logistic regression, m = 10, K = 5, T = 3; NOT the paper's setting",
}
PAPER_REF = ("Y. Sun, L. Shen, D. Tao, \"Convergent Differential Privacy Analysis for General Federated Learning: the "
             "f-DP Perspective\", arXiv:2408.15621 (accuracy study; spec fdp_accounting.md §8)")
METHOD = Method("noisy_fedavg", "noisy_fedavg", ("algorithm.name=noisy_fedavg",))

# ---- divergence -----------------------------------------------------------------------------------------
CHANCE_MARGIN = 0.05  # final accuracy <= 1/C + this counts as chance
LOSS_BLOWUP = 10.0  # a test loss above this many times ln C (the uniform prediction's loss) has blown up
DIVERGED = "diverged"


@dataclass(frozen=True)
class Divergence:
    """The verdict on one run's logged metrics: `diverged`, and why (empty when not)."""

    diverged: bool
    reason: str = ""
    final_test_loss: float | None = None
    max_test_loss: float | None = None


def divergence(metrics: Sequence[Mapping[str, Any]], classes: int = 10) -> Divergence:
    """Apply the divergence rule (module docstring) to a run's metrics rows (metrics.jsonl, in round order).

    (a) a non-finite test loss or test accuracy at any evaluated round; (b) final test accuracy <= 1/C +
    CHANCE_MARGIN and a test loss > LOSS_BLOWUP·ln C at some evaluated round. No evaluated round: not diverged.
    """
    evaluated = [r for r in metrics if "test_loss" in r or "test_accuracy" in r]
    if not evaluated:
        return Divergence(False)
    losses = [(r.get("round"), _float(r.get("test_loss"))) for r in evaluated]
    finite = [v for _, v in losses if v is not None and math.isfinite(v)]
    final_loss = losses[-1][1]
    peak = max(finite) if finite else None
    for r in evaluated:
        for key in ("test_loss", "test_accuracy"):
            v = _float(r.get(key))
            if key in r and (v is None or not math.isfinite(v)):
                return Divergence(True, f"non-finite {key} ({r.get(key)!r}) at round {r.get('round')}", final_loss,
                                  peak)
    acc = _float(evaluated[-1].get("test_accuracy"))
    chance = 1.0 / classes
    blowup = LOSS_BLOWUP * math.log(classes)
    if acc is not None and peak is not None and acc <= chance + CHANCE_MARGIN and peak > blowup:
        at = next(rnd for rnd, v in losses if v == peak)
        return Divergence(True, f"test loss {peak:.4g} > {LOSS_BLOWUP:g} ln {classes} = {blowup:.4g} at round {at}, "
                                f"final accuracy {acc:.4f} <= chance {chance:g} + {CHANCE_MARGIN:g}", final_loss, peak)
    return Divergence(False, "", final_loss, peak)


def _float(x: Any) -> float | None:
    """as_float, with NaN kept (it is evidence of divergence) and anything unreadable as None."""
    try:
        return as_float(x)
    except (TypeError, ValueError):
        return None


def cell(rows: Sequence[Mapping[str, Any]], fmt: str = ".4f") -> str:
    """The table cell of one configuration from its results.csv rows (see the module docstring)."""
    ok = [r for r in rows if r["status"] == OK]
    if not ok:
        statuses = sorted({str(r["status"]) for r in rows})
        return "—" + (f" ({', '.join(statuses)})" if statuses else "")
    div = [r for r in ok if r.get("diverged")]
    if len(div) == len(ok):
        return DIVERGED + (f" ({len(div)}/{len(ok)})" if len(ok) > 1 else "")
    text = _mean_std((r["final_accuracy"] for r in ok if not r.get("diverged")), fmt)
    return text + (f" ({len(div)}/{len(ok)} diverged)" if div else "")


def _mean_std(values: Iterable[Any], fmt: str) -> str:
    vals = [v for v in (as_number(x) for x in values) if v is not None and math.isfinite(v)]
    if not vals:
        return "n/a"
    mean = statistics.fmean(vals)
    return f"{mean:{fmt}} ± " + ("n/a" if len(vals) == 1 else f"{statistics.stdev(vals):{fmt}}")


# ---- the grid -------------------------------------------------------------------------------------------
def _check_scale(scale: str) -> None:
    if scale not in SPEC:
        raise GridError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")


def _sigma_name(sigma: str) -> str:
    return f"sg{sigma}"


def settings(scale: str, datasets: Sequence[str] | None = None, rounds: int | None = None) -> list[Setting]:
    """One setting per (dataset, m, (K, T), σ), e.g. ``mnist-lenet5-m20-K50-T600-sg0.01``.

    `rounds` (``--rounds``) replaces every T, in the name too, so a run directory says how long it trained.
    """
    _check_scale(scale)
    datasets = list(datasets) if datasets else list(DEFAULT_DATASETS[scale])
    shipped = DATASETS[scale]
    for d in datasets:
        if d not in shipped:
            raise GridError(f"--dataset: the fdp-accuracy grid at --scale {scale} ships {', '.join(shipped)} "
                            f"(got {d!r})")
    spec = SPEC[scale]
    out = []
    for d in datasets:
        info = shipped[d]
        base = config_dir(FAMILY) / info.base
        model = info.model.replace("_", "")
        stand_in = f"; STAND-IN for {info.stand_in}" if info.stand_in else ""
        what = {"full": "spec §8 grid", "reduced": "REDUCED", "ci": "ci smoke test"}[scale]
        for m in spec["clients"]:
            for k, spec_t in spec["kt"]:
                t = rounds if rounds is not None else spec_t
                replaced = f"; --rounds replaced T = {spec_t}" if t != spec_t else ""
                for sigma in spec["sigmas"]:
                    overrides = [f"data.dataset={d}", f"model.name={info.model}", f"data.clients={m}",
                                 f"data.samples_per_client={info.quota}", f"training.local_steps={k}",
                                 f"training.rounds={t}", f"algorithm.params.std={sigma}"]
                    if info.normalize:
                        overrides.append(f"data.options.normalize={info.normalize}")
                    out.append(Setting(
                        name=f"{info.short}-{model}-m{m}-K{k}-T{t}-{_sigma_name(sigma)}", base=base,
                        overrides=tuple(overrides), methods=(METHOD,), dataset=d,
                        describe=(f"{d} ({what}{stand_in}), {info.model}, Dirichlet(0.1) quota split of {info.quota} "
                                  f"samples per client, m = {m} (full participation), K = {k}, "
                                  f"T = {t} (TK = {k * t}{replaced}), σ = {sigma}"),
                        meta={"dataset": d, "model": info.model, "m": str(m), "K": str(k), "T": str(t),
                              "sigma": sigma, "quota": str(info.quota), "classes": str(info.classes),
                              "stand_in": info.stand_in}))
    return out


def grid(scale: str, *, datasets: Sequence[str] | None = None, seeds: int | None = None, rounds: int | None = None,
         settings_pattern: str | None = None, methods: Sequence[str] | None = None, extra: Sequence[str] = ()) -> Grid:
    """The jobs of `dpfl reproduce fdp-accuracy` (module docstring); `extra` overrides apply to every job.

    `rounds` replaces every setting's T (the TK budget then no longer holds; the label says so).
    """
    chosen = settings(scale, datasets, rounds)
    spec = SPEC[scale]
    spec_ts = sorted({t for _, t in spec["kt"]}, reverse=True)
    g = build_grid(PAPER, scale, chosen, spec_rounds=spec_ts[0], spec_seeds=spec["seeds"], seeds=seeds, rounds=rounds,
                   settings_pattern=settings_pattern, methods=methods, extra=extra, selection=_selection(scale))
    g.label = _label(scale, spec_ts, spec["seeds"], rounds, len(g.seeds), extra, chosen)
    g.rounds = rounds if rounds is not None else spec_ts[0]
    return g


def _label(scale: str, spec_ts: Sequence[int], spec_seeds: int, rounds: int | None, seeds: int,
           extra: Sequence[str], chosen: Sequence[Setting]) -> str:
    """The scale as every output states it: what differs from the spec's grid, and the stand-in."""
    changes, smaller = [], False
    if rounds is not None and (len(spec_ts) > 1 or rounds != spec_ts[0]):
        changes.append(f"{rounds} round{'s' * (rounds != 1)} instead of T = {'/'.join(map(str, spec_ts))}")
        smaller |= rounds < spec_ts[0]
    if seeds != spec_seeds:
        changes.append(f"{seeds} seed{'s' * (seeds != 1)} instead of {spec_seeds}")
        smaller |= seeds < spec_seeds
    if extra:
        changes.append("overrides " + " ".join(extra))
        smaller = True
    label = scale if not changes else f"{scale} ({'reduced' if smaller else 'changed'}: {', '.join(changes)})"
    if scale == "reduced":
        label += " [REDUCED stand-in: fashion_mnist + lenet5 for mnist]"
    elif any(s.meta.get("stand_in") for s in chosen):
        label += " [includes the fashion_mnist STAND-IN for mnist]"
    return label


def _selection(scale: str) -> list[str]:
    notes = ["Noisy-FedAvg only: spec §8 gives no FedProx α for the accuracy study, so Noisy-FedProx is not run"]
    if scale == "full":
        notes.append("jobs of a dataset that is not on this machine are skipped by the runner (status skipped), "
                     "not failed")
    return notes


# ---- outcomes from the run directories ---------------------------------------------------------------
def outcomes_from_dirs(grid: Grid, out: Path) -> list[Outcome]:
    """Each selected job's outcome as its directory shows it, plus every other finished job of the grid.

    finished -> ok; a traceback in OUT/logs -> failed; its dataset missing on this machine -> skipped; a
    started but unfinished run -> incomplete; nothing -> "not run". (`dpfl reproduce` writes the results
    files after running, from these.)
    """
    from dpfl.data import available

    out = Path(out)
    missing = {r["name"] for r in available() if r.get("source") == "missing" and not r.get("fetchable")}
    selected = {j.key for j in grid.jobs}
    outcomes = []
    for job in grid.all_jobs:
        state, why = job_state(job, out)
        d = job.run_dir(out)
        if state == FINISHED:
            outcomes.append(Outcome(job, d, OK, "collected"))
        elif job.key not in selected:
            continue
        elif (out / LOGS_DIR / f"{job.setting}.{job.method}.seed{job.seed}.log").is_file():
            outcomes.append(Outcome(job, d, FAILED, message=f"see {LOGS_DIR}/{job.setting}.{job.method}.seed"
                                                            f"{job.seed}.log"))
        elif job.config.data.dataset in missing:
            outcomes.append(Outcome(job, d, SKIPPED, message=f"dataset {job.config.data.dataset} is not available "
                                                             "on this machine"))
        elif state == PARTIAL:
            outcomes.append(Outcome(job, d, INCOMPLETE))
        else:
            outcomes.append(Outcome(job, d, "not run", message=why or None))
    return outcomes


# ---- results.csv / results.md ---------------------------------------------------------------------------
COLUMNS = [
    "method", "setting", "seed", "scale", "status", "dataset", "model", "stand_in", "clients", "local_steps",
    "rounds", "sigma", "final_accuracy", "best_accuracy", "final_test_loss", "max_test_loss", "diverged",
    "diverged_reason", "view", "release", "headline_bound", "delta", "mu", "epsilon", "rounds_run", "stop_reason",
    "lr", "schedule", "batch_size", "clip_mode", "clip", "partition", "alpha", "samples_per_client", "seconds",
    "cpu_seconds", "run_dir", "message",
]


def job_row(outcome: Outcome, scale: str, out: Path, meta: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The results.csv row of one job: its configuration, accuracy, divergence verdict and f-DP output."""
    job, d = outcome.job, outcome.run_dir
    c = job.config
    p = c.algorithm.params
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(method=job.method, setting=job.setting, seed=job.seed, scale=scale, status=outcome.status,
               dataset=c.data.dataset, model=c.model.name, clients=c.data.clients, local_steps=c.training.local_steps,
               rounds=c.training.rounds, sigma=p.get("std"), lr=c.training.optimizer.lr, schedule=p.get("schedule"),
               batch_size=c.training.batch_size, clip_mode=p.get("clip_mode"), clip=c.privacy.clip,
               partition=c.data.partition, alpha=c.data.alpha, samples_per_client=c.data.samples_per_client,
               delta=c.privacy.delta, message=outcome.message or None)
    meta = meta or {}
    row["stand_in"] = meta.get("stand_in") or None
    if not (d / "metrics.jsonl").is_file():
        if outcome.status == OK:
            row["status"] = INCOMPLETE
        return row
    row["run_dir"] = d.relative_to(out).as_posix() if d.is_relative_to(out) else str(d)
    try:
        metrics = read_metrics(d)
    except ValueError as err:
        row["message"] = f"{row['message'] or ''} unreadable run directory: {err}".strip()
        return row
    try:
        privacy = read_privacy(d) if (d / "privacy.json").is_file() else None
    except ValueError as err:  # accuracy stays readable without it
        privacy = None
        row["message"] = f"{row['message'] or ''} unreadable privacy.json: {err}".strip()
    times = training_time(metrics)
    acc = [a for a in (as_number(r.get("test_accuracy")) for r in metrics) if a is not None]
    row.update(final_accuracy=acc[-1] if acc else None, best_accuracy=max(acc) if acc else None,
               rounds_run=len(metrics),
               seconds=times["train_seconds"] if metrics else None, cpu_seconds=times["train_cpu_seconds"])
    if outcome.status == OK:
        v = divergence(metrics, int(meta.get("classes", 10)))
        row.update(diverged=v.diverged, diverged_reason=v.reason or None, final_test_loss=v.final_test_loss,
                   max_test_loss=v.max_test_loss)
        try:
            row["stop_reason"] = (read_summary(d) or {}).get("stop_reason")
        except ValueError:
            pass
    row.update(_fdp(privacy, c.privacy.delta))
    return row


def _fdp(privacy: Mapping[str, Any] | None, delta: float) -> dict[str, Any]:
    """μ, ε at δ, the headline bound and the view from privacy.json's `fdp` block (empty when absent)."""
    fdp = (privacy or {}).get("fdp")
    if not isinstance(fdp, Mapping):
        return {}
    eps = None
    for key, value in (fdp.get("epsilon_max") or {}).items():
        try:
            k = float(key)  # JSON object keys are strings: "1e-05"
        except (TypeError, ValueError):
            continue
        if math.isclose(k, delta, rel_tol=1e-9):
            eps = as_float(value)
    return {"view": fdp.get("view"), "release": fdp.get("release"), "headline_bound": fdp.get("headline"),
            "mu": as_float(fdp.get("mu_max")), "epsilon": eps}


def _g(x: Any, fmt: str = ".4g") -> str:
    v = as_float(x) if x is not None else None
    return "n/a" if v is None else f"{v:{fmt}}"


def _privacy_cells(rows: Sequence[Mapping[str, Any]]) -> tuple[str, str, str, str]:
    """(μ, ε, bound, view) of a configuration from its finished runs (the same for every seed)."""
    have = [r for r in rows if r.get("mu") is not None]
    if not have:
        return "n/a", "n/a", "n/a", "n/a"

    def span(key: str) -> str:
        vals = sorted({round(float(r[key]), 12) for r in have if r.get(key) is not None})
        if not vals:
            return "n/a"
        return _g(vals[0]) if len(vals) == 1 else f"{_g(vals[0])}–{_g(vals[-1])}"

    bound = ", ".join(sorted({str(r["headline_bound"]) for r in have}))
    view = ", ".join(sorted({f"{r['view']}/{r['release']}" for r in have}))
    return span("mu"), span("epsilon"), bound, view


def write_results(grid: Grid, outcomes: Sequence[Outcome], out: Path, *, command: str = "") -> tuple[Path, Path]:
    """OUT/results.csv (one row per run) and OUT/results.md (accuracy and privacy per configuration)."""
    out = Path(out)
    metas = {s.name: s.meta for s in grid.settings}
    by_key = {o.job.key: o for o in outcomes}
    ordered = [by_key[j.key] for j in grid.all_jobs if j.key in by_key]
    rows = [job_row(o, grid.label, out, metas.get(o.job.setting)) for o in ordered]
    csv_path = write_text_atomic(out / "results.csv", csv_text(rows, COLUMNS))
    md = _markdown(grid, rows, command, [o.run_dir for o in ordered])
    md_path = write_text_atomic(out / "results.md", "\n".join(md).rstrip() + "\n")
    return csv_path, md_path


def _defaults(grid: Grid) -> str:
    """The values the paper does not state, as the jobs use them (one value each, or every value used)."""
    configs = [j.config for j in grid.all_jobs]
    if not configs:
        return "n/a"

    def vals(fn: Any) -> str:
        return ", ".join(dict.fromkeys(str(fn(c)) for c in configs))

    return (f"learning rate {vals(lambda c: c.training.optimizer.lr)} ({vals(lambda c: c.algorithm.params['schedule'])}"
            f" schedule), batch size {vals(lambda c: c.training.batch_size)} "
            f"({vals(lambda c: c.algorithm.params.get('batch_sampling', 'shuffle'))} batch sampling), "
            f"{vals(lambda c: c.algorithm.params['clip_mode'])} clipping with V = {vals(lambda c: c.privacy.clip)}, "
            f"δ = {vals(lambda c: c.privacy.delta)}, secure aggregation {vals(lambda c: c.privacy.secure_aggregation)}"
            f" (view {vals(lambda c: 'upload' if c.privacy.observer == 'server' else c.privacy.observer)}), release "
            f"{vals(lambda c: c.privacy.release)}, smoothness L {vals(lambda c: c.privacy.smoothness_L)} (none "
            f"assumed), input normalisation {vals(lambda c: c.data.options.get('normalize'))}")


def _scale_text(grid: Grid) -> str:
    """The scale's description; when the run changed the scale (--rounds, --seeds) it is the scale as specified."""
    text = SCALE_TEXT.get(grid.scale, grid.scale)
    if grid.label.startswith(f"{grid.scale} ("):
        return f"the {grid.scale} scale as specified, before the changes in parentheses: {text}"
    return text


def _markdown(grid: Grid, rows: Sequence[Mapping[str, Any]], command: str, run_dirs: Sequence[Path]) -> list[str]:
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    seeds = seeds_phrase(grid.seeds, sorted({int(r["seed"]) for r in rows}))
    lines = [f"# Reproduction: {PAPER}", "",
             f"- **Scale: {grid.label}** — {_scale_text(grid)}.",
             f"- Paper: {PAPER_REF}. No result values of the paper are used or shown."]
    if command:
        lines.append(f"- Command: `{command}`")
    lines += [
        f"- {computed_and_written(run_environments(run_dirs))}",
        f"- Runs: {len(rows)} (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + f"); {seeds}.",
        "- Method: Noisy-FedAvg (clipped local steps, N(0, σ²) on every uploaded parameter, plain mean; spec §1.1), "
        "full participation, Dirichlet(0.1) quota split.",
        f"- Not stated by the paper, dpfl defaults (recorded in every run's config.yaml): {_defaults(grid)}.",
        "- Accuracy: the global model on the full test split after the last round; mean ± sample std (ddof = 1) "
        "over the seeds that finished and did not diverge (± n/a with one seed).",
        "- **diverged** (the paper's \"-\"): a run with a non-finite test loss or accuracy at some evaluated round, "
        f"or whose final test accuracy is <= chance + {CHANCE_MARGIN:g} (chance = 1/C for C classes) after its test "
        f"loss exceeded {LOSS_BLOWUP:g} ln C ({LOSS_BLOWUP * math.log(10):.4g} nats for C = 10; ln C is the loss of "
        "the uniform prediction) at some evaluated round. dpfl logs no training loss, so the global model's test "
        "loss is the observable used. A cell reads \"diverged\" when every finished seed diverged; otherwise the "
        "non-diverged seeds' mean ± std with \"k/n diverged\".",
        "- Privacy: the accountant's output for the same configuration, from each run's privacy.json (`fdp` block): "
        "μ (GDP), ε at the run's δ (exact GDP conversion), the headline bound and the view/release. Without secure "
        "aggregation the view is `upload` (the server sees every noisy upload) and the bound is composition only; "
        "no smoothness L is assumed for these networks, so no shifted-interpolation bound (spec §4.5, §5). The "
        "paper's convergent (paper-claimed) bound is not a guarantee and is not shown (spec §4.4).",
        "- Files: `results.csv` (one row per run, with each run's divergence reason), `runs/<setting>/noisy_fedavg/"
        "seed<k>/` (each run's directory with config.yaml, metrics.jsonl, privacy.json, report.md), `logs/`.",
    ]
    lines += [f"- Note: {note}." for note in [*grid.selection, *grid.notes]]
    problems: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r["status"] not in (OK, "not run"):
            problems.setdefault((str(r["status"]), r["message"] or ""), []).append(r)
    if problems:
        lines += ["", "Runs without a result:", ""]
        for (status, message), rs in problems.items():
            which = (f"{rs[0]['setting']} / seed {rs[0]['seed']}" if len(rs) == 1 else f"{len(rs)} runs")
            lines.append(f"- {which}: {status}" + (f": {message}" if message else ""))
    lines.append("")
    by_setting: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_setting.setdefault(r["setting"], []).append(r)
    chosen = [s for s in grid.settings if s.name in by_setting]
    for dataset in dict.fromkeys(s.meta["dataset"] for s in chosen):
        mine = [s for s in chosen if s.meta["dataset"] == dataset]
        lines += _dataset_tables(grid, dataset, mine, by_setting)
    return lines


def _dataset_tables(grid: Grid, dataset: str, chosen: Sequence[Setting],
                    by_setting: Mapping[str, list[Mapping[str, Any]]]) -> list[str]:
    first = chosen[0].meta
    tag = ""
    if first.get("stand_in"):
        tag = f" — {'REDUCED ' if grid.scale == 'reduced' else ''}STAND-IN for {first['stand_in']}"
    elif grid.scale != "full":
        tag = f" — {grid.scale.upper()} scale, not the paper's setting"
    title = f"## {dataset} with {first['model']}, {first['quota']} samples per client{tag}"
    sigmas = list(dict.fromkeys(s.meta["sigma"] for s in chosen))
    configs = list(dict.fromkeys((int(s.meta["m"]), int(s.meta["K"]), int(s.meta["T"])) for s in chosen))
    index = {(int(s.meta["m"]), int(s.meta["K"]), int(s.meta["T"]), s.meta["sigma"]): s.name for s in chosen}
    rounds = f"; every run trained {grid.rounds} rounds (--rounds)" if "rounds instead of" in grid.label else ""
    pivot = []
    for m, k, t in configs:
        cells = [cell(by_setting[index[(m, k, t, sg)]]) if (m, k, t, sg) in index else "—" for sg in sigmas]
        pivot.append([str(m), str(k), str(t), *cells])
    lines = [title, "", f"Final test accuracy (mean ± std over seeds; \"diverged\" as defined above){rounds}.", "",
             *md_table(["m", "K", "T", *[f"σ = {sg}" for sg in sigmas]], pivot), "",
             "Accuracy and privacy per configuration (μ and ε from the accountant; the same for every seed):", ""]
    body = []
    for s in chosen:
        rs = by_setting[s.name]
        ok = [r for r in rs if r["status"] == OK]
        mu, eps, bound, view = _privacy_cells(ok)
        delta = ", ".join(dict.fromkeys(_g(r["delta"]) for r in rs))
        n_div = sum(bool(r.get("diverged")) for r in ok)
        body.append([s.meta["m"], s.meta["K"], s.meta["T"], s.meta["sigma"], seeds_ok(rs, len(grid.seeds)), cell(rs),
                     f"{n_div}/{len(ok)}", mu, f"{eps} (δ = {delta})", bound, view])
    lines += md_table(["m", "K", "T", "σ", "seeds ok", "final test acc", "diverged", "μ", "ε", "bound", "view"],
                       body)
    return lines + [""]

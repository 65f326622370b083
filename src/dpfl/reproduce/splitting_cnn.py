"""The nonconvex half of `dpfl reproduce splitting`: the reference CNN on Fashion-MNIST (operator_splitting.md §10).

Settings (one per partition, base configs configs/splitting/cnn_fmnist_{iid,shards6,shards2}.yaml): the reference
code's CNN (`cnn_mnist_splitting`), 100 clients, 10 sampled per round, batch 20, SGD lr 0.01 with momentum 0.5
(the inexact prox of §5), i.i.d. / at most 6 classes / at most 2 classes per client. MNIST is not shipped on this
machine; the same configs run on it with `data.dataset=mnist` where its files exist.

Methods: fedavg, fedprox (mu = 1), fedsplit, fedpi, fedrp (eta = 1, the configs' choice: the paper's is not
recoverable), each plain and with Anderson tau = 10 (the paper's CNN memory, §7): scope `global` (the reference
nonconvex code's) where the spec allows it (fedavg, fedprox, fedrp), `state` for fedsplit and fedpi. Plain fedavg
and fedprox are dpfl's own algorithms (the splitting presets with tau = 0 give the same models, tested).

Scales: `full` is the configs' 100 rounds of 10 local epochs at 4 seeds (the paper averages 4 seeds), about 10 s
per round on 2 cores: days for the 120 runs. `reduced` is 30 rounds of ONE local epoch at 4 seeds (labelled
REDUCED), about 40 s per run. `reduced-all-clients` is `reduced` with every one of the 100 clients in every round
instead of 10: the reference code's splitting methods only ran with full participation (they index the cohort's
outputs by population index), so this may be the paper's setting; 10x the cost of a reduced run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dpfl.reproduce.jobs import Grid, Method, Setting, build_grid, config_dir
from dpfl.reproduce.runner import OK, Outcome, Progress, collect_finished, run_jobs
from dpfl.reproduce.tables import job_row, md_table, mean_std
from dpfl.results.environment import computed_by, run_environments
from dpfl.results.run_files import as_number, read_metrics

PAPER = "splitting"
PARTITIONS = {
    "cnn-iid": ("cnn_fmnist_iid.yaml", "i.i.d."),
    "cnn-shards6": ("cnn_fmnist_shards6.yaml", "label shards, at most 6 classes per client"),
    "cnn-shards2": ("cnn_fmnist_shards2.yaml", "label shards, at most 2 classes per client"),
}
PRESETS = ("fedavg", "fedprox", "fedsplit", "fedpi", "fedrp")
TAU = 10  # the paper's Anderson memory on the CNN (§7)
CHANCE = 0.11  # final test accuracy at or below this (10 balanced classes): the run ended at chance level
GLOBAL_SCOPE = ("fedavg", "fedprox", "fedrp")  # u is in H after round 0: the reference code accelerates xbar only
ETA = 1.0  # the prox step of the configs (fedprox's mu = 1 / eta)
SCALES = {
    "full": {"rounds": 100, "seeds": 4, "extra": ()},
    "reduced": {"rounds": 30, "seeds": 4, "extra": ("training.local_epochs=1",)},
}
SCALES["reduced-all-clients"] = {**SCALES["reduced"],
                                 "extra": (*SCALES["reduced"]["extra"], "training.selection={kind: all}")}


def method_name(preset: str, tau: int) -> str:
    return f"{preset}-aa{tau}"


def parse_method(name: str) -> tuple[str, int]:
    """(preset, tau) of a method name made by `method_name`."""
    preset, _, tau = name.rpartition("-aa")
    return preset, int(tau)


def method(preset: str, tau: int) -> Method:
    """One row of the comparison as `dpfl run` overrides."""
    params = {"fedavg": "{}", "fedprox": f"{{mu: {1.0 / ETA:g}}}"}.get(preset, f"{{eta: {ETA:g}}}")
    if tau:
        scope = "global" if preset in GLOBAL_SCOPE else "state"
        params = params[:-1] + (", " if params != "{}" else "") + f"anderson: {{memory: {tau}, scope: {scope}}}}}"
    return Method(method_name(preset, tau), preset, (f"algorithm={{name: {preset}, params: {params}}}",),
                  f"Anderson tau = {tau}" if tau else "")


def settings() -> list[Setting]:
    methods = tuple(method(p, tau) for p in PRESETS for tau in (0, TAU))
    return [Setting(name, config_dir("splitting") / base, (), methods, "fashion_mnist", describe)
            for name, (base, describe) in PARTITIONS.items()]


def grid(scale: str, *, seeds: int | None = None, rounds: int | None = None, settings_pattern: str | None = None,
         presets: Sequence[str] | None = None) -> Grid:
    """The CNN jobs of a scale; `presets` selects methods by preset name (every Anderson memory of it)."""
    spec = SCALES[scale]
    wanted = None if presets is None else [method_name(p, tau) for p in presets for tau in (0, TAU)]
    return build_grid(PAPER, scale, settings(), spec_rounds=spec["rounds"], spec_seeds=spec["seeds"], seeds=seeds,
                      rounds=spec["rounds"] if rounds is None else rounds, settings_pattern=settings_pattern,
                      methods=wanted, extra=spec["extra"])


class _Lines(Progress):
    """One line per finished CNN run through the study's `progress` callable."""

    def __init__(self, say: Callable[[str], None] | None) -> None:
        self.say = say

    def end(self, outcome: Outcome, index: int, total: int) -> None:
        if self.say is not None:
            job = outcome.job
            self.say(f"[cnn {index}/{total}] {job.setting} {job.method} seed{job.seed}: {outcome.status}"
                     + (f" ({outcome.message})" if outcome.message else ""))


def run(grid: Grid, out: Path, progress: Callable[[str], None] | None = None,
        compute: bool = True, workers: int = 1) -> list[dict[str, Any]]:
    """Run (or continue) the grid's jobs (compute=False: only collect the finished ones; workers > 1: in that many
    processes, `dpfl.reproduce.workers`); their results.csv rows in the study's columns."""
    from dpfl.reproduce.workers import run_jobs_in_workers

    if not compute:
        outcomes = collect_finished(grid.jobs, out)
    elif workers > 1:
        outcomes = run_jobs_in_workers(grid.jobs, out, workers)
    else:
        outcomes = run_jobs(grid.jobs, out, progress=_Lines(progress))
    return [row(o, grid.label, out) for o in outcomes]


def row(outcome: Outcome, label: str, out: Path) -> dict[str, Any]:
    """A CNN run as a study row: accuracies, and the last fixed-point residual the splitting server logged."""
    generic = job_row(outcome, label, out)
    preset, tau = parse_method(outcome.job.method)
    metrics = read_metrics(outcome.run_dir) if generic["status"] == OK else []
    residuals = [as_number(r.get("residual")) for r in metrics if r.get("residual") is not None]
    seconds, cpu = generic["seconds"], generic["cpu_seconds"]
    return {"setting": outcome.job.setting, "method": preset, "preset": preset, "anderson": tau,
            "seed": outcome.job.seed, "rounds": generic["rounds_run"], "final_accuracy": generic["final_accuracy"],
            "best_accuracy": generic["best_accuracy"], "final_residual": residuals[-1] if residuals else None,
            "stop_reason": generic["stop_reason"], "seconds": None if seconds is None else round(seconds, 2),
            "cpu_seconds": None if cpu is None else round(cpu, 2), "status": generic["status"]}


def markdown(grid: Grid, rows: Sequence[dict[str, Any]], out: Path) -> str:
    """The CNN section of results.md: per setting, accuracy mean ± std over seeds per method and memory, a plot."""
    lines = ["## Nonconvex: the reference CNN", "",
             f"Scale: {grid.label}. Fashion-MNIST (MNIST is not shipped here), {_cohort(grid)}, batch 20, "
             f"SGD lr 0.01 with momentum 0.5; eta = {ETA:g} for fedsplit / fedpi / fedrp, fedprox mu = {1 / ETA:g}; "
             f"Anderson tau = {TAU} (scope global for {', '.join(GLOBAL_SCOPE)}, state otherwise). Accuracy: the "
             "global model on the 10,000 test images; mean ± sample std over the seeds that finished. "
             f"'at chance' counts runs whose final accuracy is <= {CHANCE} (diverged or never learnt). "
             "These settings are nonconvex: no method has a convergence guarantee here.", "",
             f"Runs computed by: {computed_by(run_environments(j.run_dir(out) for j in grid.jobs))}.",
             ""]
    for setting in grid.settings:
        mine = [r for r in rows if r["setting"] == setting.name]
        if not mine:
            continue
        body = []
        for preset in PRESETS:
            for tau in (0, TAU):
                group = [r for r in mine if r["method"] == preset and r["anderson"] == tau]
                ok = [r for r in group if r["status"] == OK]
                if not group:
                    continue
                finals = [r["final_accuracy"] for r in ok]
                body.append([preset, tau, mean_std(finals), mean_std(r["best_accuracy"] for r in ok),
                             sum(1 for a in finals if a is not None and a <= CHANCE), f"{len(ok)}/{len(group)}"])
        lines += [f"### {setting.name}", "", setting.describe, ""]
        lines += md_table(["method", "Anderson tau", "final accuracy", "best accuracy", "at chance", "seeds ok"], body)
        plot = _plot(setting.name, [r for r in mine if r["status"] == OK], grid, out)
        if plot is not None:
            lines += ["", f"![test accuracy vs round]({plot.relative_to(out).as_posix()})"]
        lines.append("")
    return "\n".join(lines)


def _cohort(grid: Grid) -> str:
    """Who takes part in a round, as the jobs' configs say (every partition's config has the same population)."""
    config = grid.jobs[0].config
    n, selection = config.data.clients, config.training.selection
    if selection.kind == "all":
        return f"all {n} clients in every round"
    return f"{n} clients, " + (f"{selection.k} per round" if selection.kind == "fixed"
                               else f"each with probability {selection.rate:g} per round")


def _plot(setting: str, ok_rows: Sequence[dict[str, Any]], grid: Grid, out: Path) -> Path | None:
    """Test accuracy against the round, mean over the finished seeds, one line per method and memory."""
    from dpfl.results.plots import plot_compare

    curves: dict[str, dict[int, list[float]]] = {}
    for job in grid.jobs:
        if job.setting != setting:
            continue
        preset, tau = parse_method(job.method)
        if not any(r["method"] == preset and r["anderson"] == tau and r["seed"] == job.seed for r in ok_rows):
            continue
        for r in read_metrics(job.run_dir(out)):
            acc = as_number(r.get("test_accuracy"))
            if acc is not None and math.isfinite(acc):
                curves.setdefault(job.method, {}).setdefault(int(r["round"]), []).append(acc)
    series = {name: [{"round": k, "test_accuracy": statistics.fmean(v)} for k, v in sorted(per.items())]
              for name, per in curves.items()}
    return plot_compare(series, out / "plots" / f"accuracy_{setting}.png",
                        title=f"{setting}: test accuracy, mean over seeds")

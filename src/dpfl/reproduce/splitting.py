"""`dpfl reproduce splitting`: the operator-splitting family on the convex problems (operator_splitting.md §10-§12)
and on the reference CNN.

    dpfl reproduce splitting --scale ci --out OUT      # OUT/results.csv, results.md, plots/, runs/, logs/

Convex: each setting is a config of configs/splitting/convex/ (a problem, rounds, methods, Anderson memories); every
method runs once per Anderson memory and seed, through `dpfl.reproduce.splitting_solver.run_splitting` in float64. A
run's metrics (one row per round) go to OUT/runs/<setting>/<method>-aa<tau>-seed<s>.jsonl and its summary next to it;
a run whose summary exists is not run again, so re-running the command continues where it stopped. One failing run
is recorded (status "failed", its traceback in OUT/logs/) and the others go on.

Nonconvex (`dpfl.reproduce.splitting_cnn`): the CNN settings cnn-iid, cnn-shards6, cnn-shards2 are ordinary
`dpfl run` directories under OUT/runs/<setting>/<preset>-aa<tau>/seed<k>/, run and resumed by the reproduce runner.

Scales: ci is heterogeneous least squares (s = 1) and logistic regression with fedavg (k in {1, 5}), fedprox,
fedsplit, fedpi, fedrp, each with and without Anderson (tau = 2), one seed; reduced is the CNN comparison only, at
30 rounds of one local epoch (REDUCED), 4 seeds; full adds to ci the heterogeneity sweep, label noise, partial
participation, diminishing-step and DP (update_gaussian, calibrated from an epsilon budget) settings at three seeds,
and the CNN comparison at the configs' 100 rounds of 10 local epochs, 4 seeds.

results.csv columns: setting, method, preset, anderson, seed, rounds, final_gap, final_rel_dist, final_residual,
rounds_to_1e-8 (rounds until the fixed-point residual is below 1e-8 of its round-0 value, empty if never),
min_rel_dist, heterogeneity, noise_multiplier and epsilon_max (DP settings: the noise used and the largest epsilon any
client spent), final_accuracy and best_accuracy (CNN: the global model on the test set after the last round and at
the best evaluated round; the convex columns are empty there), stop_reason, seconds, cpu_seconds (wall and CPU
time), status.
"""

from __future__ import annotations

import hashlib
import json
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpfl.privacy.budgets import ClientBudget
from dpfl.reproduce import splitting_cnn
from dpfl.reproduce.jobs import Grid, GridError, Job, check_planned, config_dir, select_names, select_seeds
from dpfl.reproduce.runner import collect_finished, describe_jobs
from dpfl.reproduce.splitting_config import SettingConfig, load_setting
from dpfl.reproduce.tables import csv_text, md_table
from dpfl.results.environment import computed_by, describe_job, job_executions, provenance
from dpfl.results.run_files import write_json_atomic, write_text_atomic

SCALES = {  # convex settings per scale; the CNN settings are splitting_cnn.SCALES' (the reduced scales and full)
    "ci": {"settings": ("ls_heterogeneous", "lr_heterogeneous_ci"), "seeds": 1},
    "reduced": {"settings": (), "seeds": 1},
    "reduced-all-clients": {"settings": (), "seeds": 1},
    "full": {"settings": ("ls_heterogeneous", "lr_heterogeneous", "ls_homogeneous", "ls_shift2", "ls_noise10",
                          "ls_partial_p05", "lr_flip", "ls_diminishing", "ls_dp"), "seeds": 3},
}
COLUMNS = ["setting", "method", "preset", "anderson", "seed", "rounds", "final_gap", "final_rel_dist",
           "final_residual", "rounds_to_1e-8", "min_rel_dist", "heterogeneity", "noise_multiplier", "epsilon_max",
           "final_accuracy", "best_accuracy", "stop_reason", "seconds", "cpu_seconds", "status"]
RUNS, LOGS, PLOTS = "runs", "logs", "plots"
RESOLUTION = 2.2e-16  # float64 machine epsilon: the plots' floor for a gap, relative to the objective


@dataclass(frozen=True)
class SplittingJob:
    setting: SettingConfig
    method: str
    anderson: int
    seed: int

    @property
    def key(self) -> str:
        return f"{self.method}-aa{self.anderson}-seed{self.seed}"

    def fingerprint(self) -> str:
        """What the run is (its setting as validated, with any --rounds, and the job's method, tau and seed)."""
        text = json.dumps([self.setting.model_dump(mode="json"), self.method, self.anderson, self.seed], sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def paths(self, out: Path) -> tuple[Path, Path]:
        d = out / RUNS / self.setting.name
        return d / f"{self.key}.jsonl", d / f"{self.key}.json"


def settings(scale: str) -> list[SettingConfig]:
    """The convex settings of a scale (`plan` selects among them and the CNN partitions)."""
    if scale not in SCALES:
        raise ValueError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    return [load_setting(config_dir("splitting") / "convex" / f"{name}.yaml") for name in SCALES[scale]["settings"]]


@dataclass
class Plan:
    """The runs of one invocation: convex jobs and the CNN grid (None when the scale or selection has none). With
    --only-seeds, the selection's jobs of the other seeds are kept apart: not run, but read back for the tables if they
    finished under the same --out."""

    convex: list[SplittingJob]
    cnn: Grid | None
    convex_other_seeds: list[SplittingJob] = field(default_factory=list)
    cnn_other_seeds: list[Job] = field(default_factory=list)


def plan(scale: str, *, seeds: int | None = None, rounds: int | None = None, settings_pattern: str | None = None,
         methods: Sequence[str] | None = None, only_seeds: Sequence[int] | None = None) -> Plan:
    """Every (setting, method, Anderson memory, seed) of a scale, after the selections (`only_seeds`: run only these
    of the planned seeds); a bad selection is a ValueError naming the option."""
    if seeds is not None and seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    if rounds is not None and rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    every_convex = settings(scale)
    every_cnn = list(splitting_cnn.PARTITIONS) if scale in splitting_cnn.SCALES else []
    chosen = set(select_names([s.name for s in every_convex] + every_cnn, settings_pattern))
    convex = [s for s in every_convex if s.name in chosen]
    cnn_names = [n for n in every_cnn if n in chosen]
    names = list(dict.fromkeys([m.name for s in convex for m in s.methods]
                               + (list(splitting_cnn.PRESETS) if cnn_names else [])))
    for wanted in methods or ():
        if wanted not in names:
            raise ValueError(f"--methods: unknown method {wanted!r}; the settings have {', '.join(names)}")
    out = []
    for s in convex:
        if rounds is not None:
            s = s.model_copy(update={"rounds": rounds})
        for m in s.methods:
            if methods and m.name not in methods:
                continue
            for tau in s.anderson.memories:
                out.extend(SplittingJob(s, m.name, tau, seed) for seed in range(seeds or SCALES[scale]["seeds"]))
    presets = [m for m in methods if m in splitting_cnn.PRESETS] if methods else None
    cnn = None
    if cnn_names and presets != []:
        cnn = splitting_cnn.grid(scale, seeds=seeds, rounds=rounds, presets=presets,
                                 settings_pattern=",".join(cnn_names))
    convex_others, cnn_others = [], []
    if only_seeds:
        if cnn is not None:  # the CNN plans at least the convex seeds at every scale (full: 4 vs 3): one check
            cnn_others = [j for j in cnn.jobs if j.seed not in only_seeds]
            cnn = select_seeds(cnn, only_seeds)
        else:
            check_planned(only_seeds, sorted({j.seed for j in out}))
        convex_others = [j for j in out if j.seed not in only_seeds]
        out = [j for j in out if j.seed in only_seeds]
    if not out and (cnn is None or not cnn.jobs):
        raise ValueError("no job to run: the selection leaves nothing")
    return Plan(out, cnn, convex_others, cnn_others)


def describe(scale: str, out: Path, **selection: Any) -> Iterator[str]:
    """The --dry-run listing of `plan(scale, **selection)`, a line at a time: each convex job with its state
    (finished or new), then the CNN grid's jobs (`runner.describe_jobs`)."""
    todo = plan(scale, **selection)
    for job in todo.convex:
        done = job.paths(out)[1].is_file()
        yield f"{job.setting.name} {job.key} ({job.setting.rounds} rounds): {'finished' if done else 'new'}"
    if todo.cnn is not None:
        yield from describe_jobs(todo.cnn, out)


def jobs(scale: str, **selection: Any) -> list[SplittingJob]:
    """The convex jobs of `plan(scale, **selection)`."""
    return plan(scale, **selection).convex


def run_job(job: SplittingJob, out: Path) -> dict[str, Any]:
    """Run one job (or read its summary if it finished before) and return its results.csv row."""
    from dpfl.reproduce.splitting_solver import run_splitting

    metrics_path, summary_path = job.paths(out)
    fingerprint = job.fingerprint()
    if summary_path.is_file():
        done = json.loads(summary_path.read_text(encoding="utf-8"))
        if done.get("fingerprint") != fingerprint:  # same --out with other options would mix two experiments
            raise ValueError(f"{summary_path} holds a run of another setting (other --rounds, or an edited "
                             "config); use another --out or remove it")
        return done
    s = job.setting
    method = next(m for m in s.methods if m.name == job.method)
    row: dict[str, Any] = {"setting": s.name, "method": job.method, "preset": method.preset, "anderson": job.anderson,
                           "seed": job.seed}
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        problem = s.problem.build(job.seed)
        alg = method.build(s.participation.build(), s.anderson.build(job.anderson))
        budget = None if method.dp is None or method.dp.epsilon is None else ClientBudget(method.dp.epsilon, s.delta)
        result = run_splitting(problem, alg, s.rounds, seed=job.seed, delta=s.delta, budgets=budget)
    except Exception:  # noqa: BLE001 -- one failing run must not cost the others
        log = out / LOGS / f"{s.name}-{job.key}.txt"
        write_text_atomic(log, traceback.format_exc())
        return {**row, "status": "failed", "seconds": round(time.perf_counter() - t0, 2),
                "cpu_seconds": round(time.process_time() - cpu0, 2)}
    history = result.history
    last = history[-1] if history else {}  # empty: stopped by a budget before round 1
    row.update({"rounds": len(history), "final_gap": last.get("gap"), "final_rel_dist": last.get("rel_dist"),
                "final_residual": last.get("residual"), "rounds_to_1e-8": result.rounds_to(1e-8),
                "min_rel_dist": min((r["rel_dist"] for r in history), default=None),
                "heterogeneity": result.heterogeneity, "fingerprint": fingerprint,
                "stop_reason": result.stop_reason, "seconds": round(time.perf_counter() - t0, 2),
                "cpu_seconds": round(time.process_time() - cpu0, 2), "status": "ok",
                "noise_multiplier": result.noise_multiplier,
                "epsilon_max": max(result.ledger.spent_all().values()) if result.ledger is not None else None,
                "environment": describe_job()})
    write_text_atomic(metrics_path, "".join(json.dumps(r) + "\n" for r in history))
    write_json_atomic(summary_path, row)
    return row


def run_study(scale: str, out: Path, *, seeds: int | None = None, rounds: int | None = None,
              settings_pattern: str | None = None, methods: Sequence[str] | None = None,
              only_seeds: Sequence[int] | None = None, progress: Callable[[str], None] | None = None,
              command: str = "", compute: bool = True, workers: int = 1) -> tuple[Path, Path, list[dict]]:
    """Run (or continue) the study; write results.csv, results.md, one gap plot per convex setting and one accuracy
    plot per CNN setting. compute=False (--tables-only): only the jobs that finished before, nothing run. `workers`:
    processes sharing the CNN runs (the convex runs stay in this process, before them). `only_seeds`: run only these
    seeds; the tables also hold the other seeds' runs that finished under `out`."""
    todo = plan(scale, seeds=seeds, rounds=rounds, settings_pattern=settings_pattern, methods=methods,
                only_seeds=only_seeds)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n, job in enumerate(todo.convex, 1):
        if not compute and not job.paths(out)[1].is_file():
            continue
        row = run_job(job, out)
        rows.append(row)
        if progress is not None:
            progress(f"[{n}/{len(todo.convex)}] {job.setting.name} {job.key}: {row['status']}"
                     + (f", rel dist {row['final_rel_dist']:.2e}, rounds to 1e-8 {row['rounds_to_1e-8']}"
                        if row["status"] == "ok" and row["rounds"] else ""))
    rows += [run_job(job, out) for job in todo.convex_other_seeds if job.paths(out)[1].is_file()]  # read back
    cnn_rows = []
    if todo.cnn is not None:
        cnn_rows = splitting_cnn.run(todo.cnn, out, progress, compute=compute, workers=workers)
        cnn_rows += [splitting_cnn.row(o, todo.cnn.label, out) for o in collect_finished(todo.cnn_other_seeds, out)]
    if not compute and not rows + cnn_rows:
        raise GridError(f"--tables-only: no finished job of this selection under {out}")
    csv_path = write_text_atomic(out / "results.csv", csv_text(rows + cnn_rows, COLUMNS))
    planned = todo.convex + todo.convex_other_seeds  # the tables and plots are the grid's, not this selection's
    plots = {s.name: _plot(s.name, [j for j in planned if j.setting.name == s.name], out)
             for s in dict((j.setting.name, j.setting) for j in planned).values()}
    md = _markdown(scale, planned, rows, plots, command)
    if todo.cnn is not None:
        md += "\n" + splitting_cnn.markdown(todo.cnn, cnn_rows, out)
    md_path = write_text_atomic(out / "results.md", md)
    return csv_path, md_path, rows + cnn_rows


def _plot(setting: str, setting_jobs: Sequence[SplittingJob], out: Path) -> Path | None:
    """Gap f(xbar) - f(theta*) against the round, one line per method and Anderson memory (seed 0)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure  # not pyplot: the caller's backend is left alone

    from dpfl.results.plots import write_png

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    drawn = False
    methods = list(dict.fromkeys(j.method for j in setting_jobs))
    colours = colormaps["tab10" if len(methods) <= 10 else "tab20"]
    for job in setting_jobs:
        metrics_path, _ = job.paths(out)
        if job.seed != 0 or not metrics_path.is_file():
            continue
        history = [json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines()]
        # below the float64 resolution of f the difference of two objectives is rounding (it can be 0 or negative)
        gaps = [max(abs(r["gap"]), RESOLUTION * abs(r["objective"]), 1e-300) for r in history]
        ax.semilogy([r["round"] for r in history], gaps, ls="-" if job.anderson == 0 else "--",
                    color=colours(methods.index(job.method)),
                    label=f"{job.method}" + (f" AA{job.anderson}" if job.anderson else ""))
        drawn = True
    if not drawn:
        return None
    ax.set_xlabel("round")
    ax.set_ylabel("f(xbar) - f(theta*)  (floored at 2.2e-16 |f|)")
    ax.set_title(setting)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return write_png(fig, out / PLOTS / f"gap_{setting}.png", dpi=120)


def _fmt(v: Any, spec: str = ".2e") -> str:
    return "" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def _markdown(scale: str, todo: Sequence[SplittingJob], rows: Sequence[dict], plots: dict, command: str) -> str:
    lines = [f"# Operator splitting ({scale} scale)", ""]
    if command:
        lines += [f"Produced by `{command}`.", ""]
    lines += [f"Written by: {provenance()}.", ""]
    if not todo:
        return "\n".join(lines)
    done = [job_executions(r) for r in rows if r["status"] == "ok"]
    lines += [f"Convex jobs computed by: {computed_by(done, 'job')}.", ""]
    lines += ["## Convex problems", "",
              "Float64; gap = f(xbar) - f(theta*) (least squares: the exact quadratic form); rel dist = "
              "||xbar - theta*|| / ||theta*||; rounds to 1e-8 = rounds until the fixed-point residual ||u - T u|| is "
              "below 1e-8 of its round-0 value (empty: never). Values are the mean over seeds where several ran.", ""]
    for name in dict.fromkeys(j.setting.name for j in todo):
        setting = next(j.setting for j in todo if j.setting.name == name)
        mine = [r for r in rows if r["setting"] == name]
        het = next((r["heterogeneity"] for r in mine if r.get("status") == "ok"), None)
        lines += [f"### {name}", "", setting.describe or "", "",
                  f"Problem: {setting.problem.model_dump(exclude_none=True)}; {setting.rounds} rounds; "
                  f"participation {setting.participation.kind}; H = {_fmt(het, '.4g')}.", ""]
        body = []
        for method in setting.methods:
            for tau in setting.anderson.memories:
                group = [r for r in mine if r["method"] == method.name and r["anderson"] == tau]
                planned = sum(j.setting.name == name and j.method == method.name and j.anderson == tau for j in todo)
                ok = [r for r in group if r.get("status") == "ok"]
                if not group:
                    continue
                if not ok:
                    body.append([method.name, tau, "failed", "", "", "", ""])
                    continue
                reached = [r["rounds_to_1e-8"] for r in ok]
                body.append([method.name, tau, _fmt(_mean([r["final_rel_dist"] for r in ok])),
                             _fmt(_mean([r["final_gap"] for r in ok])), _fmt(_mean([r["final_residual"] for r in ok])),
                             "never" if all(v is None for v in reached) else
                             "/".join("never" if v is None else str(v) for v in reached),
                             f"{len(ok)}/{planned}"])
        if not body:
            lines += ["No job of this setting has finished yet.", ""]
            continue
        lines += md_table(["method", "Anderson tau", "final rel dist", "final gap", "final residual",
                           "rounds to 1e-8 (per seed)", "seeds ok"], body)
        if plots.get(name) is not None:
            lines += ["", f"![gap vs round]({Path(plots[name]).relative_to(plots[name].parent.parent)})"]
        lines.append("")
    return "\n".join(lines)


def _mean(values: Sequence[float | None]) -> float | None:
    """Mean of the values a run produced (None: a run stopped by its budget before round 1)."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None

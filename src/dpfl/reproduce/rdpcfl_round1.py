"""R-DPCFL's b^1 analysis (spec clustered_dpfl.md §7, §10): what the server's GMM sees after round 1, by b^1.

R-DPCFL clusters the clients once, on their round-1 updates, which it trains at full batch (b^1 = N_i). The spec
asks for MSS, the EM iterations and the mean pairwise distance between the GMM's cluster centres as functions of
`round1_batch`, and restates two claims: a full-batch first round plus a GMM detects the clusters more often,
especially at small ε; and very few EM iterations are needed at full batch.

Each point (setting, b^1, seed) builds the run at its full planned length, so every round's noise, round 1's
included, is calibrated for the whole two-stage schedule (E rounds, the scale's eps_total), trains round 1 once
and clusters the released updates exactly as R-DPCFL does (`ClusteredAggregator`'s PCA + GMM). Nothing else is
trained and nothing is charged to a ledger: a diagnostic of the clustering step, not a run. Shortening the run
instead would calibrate less noise and change what the GMM sees.

Per point: the clusters found, MSS, MPO, EM iterations and convergence, centre distance, whether the round-1
partition equals the planted one and whether the minority cluster is found exactly, the ARI, the noise
multiplier (one σ for every round of the run, calibrated for the schedule) and the seconds it took. Points are
saved one by one (OUT/round1/<setting>/b<b>/seed<k>.json, with their config), so an interrupted analysis
resumes; OUT/round1_analysis.{csv,md} and OUT/plots/round1_analysis.png summarise them.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.data.errors import DatasetNotFoundError
from dpfl.reproduce import rdpcfl
from dpfl.reproduce.jobs import Grid, GridError, Job, Method, Setting, build_grid
from dpfl.reproduce.tables import csv_text, md_table, mean_std
from dpfl.results.environment import computed_and_written, describe_job, job_executions
from dpfl.results.run_files import write_json_atomic, write_text_atomic

__all__ = ["BATCHES", "COLUMNS", "analysis_grid", "round1_point", "run_analysis"]

BATCHES = {"ci": ("32", "128", "512", "full"), "full": ("32", "128", "512", "2048", "full")}  # b^1 per scale
COLUMNS = ["setting", "epsilon", "round1_batch", "seed", "n_clusters", "recovered", "minority_recovered", "ari",
           "mss", "mpo", "em_iterations", "em_converged", "centre_distance", "noise_multiplier", "e_c", "seconds"]
POINTS_DIR = "round1"


def _method(batch: str) -> Method:
    override = f"algorithm={{name: rdpcfl, params: {{clusters: 4, round1_batch: {batch}}}}}"
    label = "full batch (R-DPCFL's round 1)" if batch == "full" else f"Poisson batches of expected size {batch}"
    return Method(f"b{batch}", "rdpcfl", (override,), label)


def analysis_grid(scale: str, *, datasets: Sequence[str] = ("fashion_mnist",), seeds: int | None = None,
                  settings_pattern: str | None = None, batches: Sequence[str] | None = None,
                  epsilons: str | Sequence[float] | None = None) -> Grid:
    """One job per (setting, b^1, seed): the comparison's settings with R-DPCFL only, b^1 from BATCHES[scale]."""
    if scale not in BATCHES:
        raise GridError(f"--scale must be 'ci' or 'full', got {scale!r}")
    chosen = tuple(BATCHES[scale] if batches is None else batches)
    for b in chosen:
        if b != "full" and not (b.isdigit() and int(b) >= 1):
            raise GridError(f"round-1 batches are 'full' or integers >= 1, got {b!r}")
    methods = tuple(_method(b) for b in chosen)
    base = [Setting(s.name, s.base, s.overrides, methods, s.dataset, s.describe, s.meta)
            for s in rdpcfl.settings(scale, datasets, rdpcfl.parse_epsilons(epsilons))]
    return build_grid("rdpcfl-round1", scale, base, spec_rounds=rdpcfl.SPEC[scale]["rounds"],
                      spec_seeds=rdpcfl.SPEC[scale]["seeds"], seeds=seeds, settings_pattern=settings_pattern)


def round1_point(job: Job) -> dict[str, Any]:
    """Round 1 of `job`'s run (calibrated for its planned length) and R-DPCFL's clustering of its updates."""
    from sklearn.metrics import adjusted_rand_score

    from dpfl.algorithms.stages import RoundInputs
    from dpfl.experiment.build import build_run

    start = time.perf_counter()
    run = build_run(job.config)
    w, local = run.first_round()
    aggregator = run.algorithm.aggregator
    starts, state = aggregator.start_points(aggregator.init(w), w, [int(c) for c in local.view.clients], 0)
    state = aggregator.update(state, w, local.uploads, RoundInputs(local.view, run.seed, 0, starts=starts)).state
    facts = state["facts"]
    truth = rdpcfl.planted_clusters(job.config)
    found = [int(c) for c in facts["round1_clusters"]]
    return {"setting": job.setting, "epsilon": job.config.privacy.budgets, "round1_batch": job.method[1:],
            "seed": job.seed, "n_clusters": len(set(found)), "recovered": rdpcfl.same_partition(found, truth),
            "minority_recovered": rdpcfl.finds_minority(found, truth), "ari": float(adjusted_rand_score(truth, found)),
            "mss": facts["mss"], "mpo": facts["mpo"], "em_iterations": facts["em_iterations"],
            "em_converged": bool(facts["em_converged"]), "centre_distance": facts["centre_distance"],
            "noise_multiplier": float(np.mean(run.noise)), "e_c": facts["e_c"],
            "seconds": round(time.perf_counter() - start, 1), "round1_clusters": found}


def _point_path(job: Job, out: Path) -> Path:
    return Path(out) / POINTS_DIR / job.setting / job.method / f"seed{job.seed}.json"


def _config_json(job: Job) -> Any:
    from dpfl.experiment.config import config_to_dict

    return json.loads(json.dumps(config_to_dict(job.config)))


def _saved(job: Job, out: Path) -> dict[str, Any] | None:
    """The file saved for exactly this job's config: its point and, since dpfl recorded it, the environment that
    computed it; None when absent, unreadable, of another config or without a point."""
    path = _point_path(job, out)
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return saved if saved.get("config") == _config_json(job) and saved.get("point") is not None else None


def run_analysis(grid: Grid, out: Path, *, command: str = "", on_point: Callable[[Job, str], None] | None = None,
                 point: Callable[[Job], dict[str, Any]] = round1_point,
                 compute: bool = True) -> tuple[Path, Path, list[dict[str, Any]]]:
    """Compute the missing points of `grid` (saved ones are reused; none with compute=False), then
    OUT/round1_analysis.{csv,md}.

    The tables show every setting of the scale at this invocation's b^1 values and seeds (`--settings` only
    chooses what is computed), so points saved by earlier invocations for other settings appear too.
    """
    out = Path(out)
    for job in grid.jobs:
        if _saved(job, out) is not None:
            if on_point:
                on_point(job, "saved before")
            continue
        if not compute:
            if on_point:
                on_point(job, "not computed (--tables-only)")
            continue
        try:
            result = point(job)
        except DatasetNotFoundError as err:  # e.g. MNIST at full scale without its files: skipped, like the comparison
            if on_point:
                on_point(job, f"skipped ({str(err).splitlines()[0]})")
            continue
        write_json_atomic(_point_path(job, out), {"config": _config_json(job), "point": result,
                                                  "environment": describe_job()})
        if on_point:
            on_point(job, f"{result['n_clusters']} clusters, recovered {result['recovered']}, MSS {result['mss']:.2f}, "
                          f"{result['em_iterations']} EM iterations, {result['seconds']:.0f} s")
    saved = [f for f in (_saved(j, out) for j in grid.all_jobs) if f is not None]
    if not compute and not saved:  # before writing: the tables of an earlier selection stay
        raise GridError(f"--tables-only: no saved point of this selection under {out / POINTS_DIR}")
    rows = [f["point"] for f in saved]
    line = computed_and_written((job_executions(f) for f in saved), "point")
    csv_path = write_text_atomic(out / "round1_analysis.csv", csv_text(rows, COLUMNS))
    md_path = write_text_atomic(out / "round1_analysis.md", _markdown(grid, rows, out, command, line))
    return csv_path, md_path, rows


def _markdown(grid: Grid, rows: Sequence[dict[str, Any]], out: Path, command: str, provenance_line: str) -> str:
    lines = [f"# R-DPCFL's b^1 analysis ({grid.label})", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [provenance_line, ""]
    lines += ["Round 1 of each run, calibrated for its planned length, then R-DPCFL's PCA + GMM on the released "
              "updates (a diagnostic: nothing else is trained). recovered: the round-1 partition equals the planted "
              "one; minority: the minority cluster is found exactly (k of S seeds). MSS: the GMM's minimum "
              "separation score; EM: iterations to convergence (mean, max); centre distance: the mean pairwise "
              "distance between the cluster centres. Cells: mean ± sample std over the seeds.", ""]
    lines += [f"- {note}" for note in [*grid.selection, *grid.notes]]
    for setting in grid.settings:
        mine = [r for r in rows if r["setting"] == setting.name]
        if not mine:
            continue
        body = []
        for m in setting.methods:
            pts = [r for r in mine if r["round1_batch"] == m.name[1:]]
            if not pts:
                continue
            em = [r["em_iterations"] for r in pts]
            body.append([m.name[1:], f"{sum(r['recovered'] for r in pts)}/{len(pts)}",
                         f"{sum(r['minority_recovered'] for r in pts)}/{len(pts)}",
                         mean_std((r["ari"] for r in pts), ".2f"),
                         mean_std((r["mss"] for r in pts), ".2f"), f"{statistics.fmean(em):.1f} ({max(em)})",
                         mean_std((r["centre_distance"] for r in pts), ".3f"), f"{pts[0]['noise_multiplier']:.3g}",
                         mean_std((r["seconds"] for r in pts), ".0f")])
        lines += ["", f"## {setting.name}", "", setting.describe, ""]
        lines += md_table(["b^1", "recovered", "minority", "ARI", "MSS", "EM", "centre distance", "σ (every round)",
                           "seconds"], body)
    plot = _plot(rows, out)
    if plot is not None:
        lines += ["", f"![b^1 analysis]({plot.relative_to(out).as_posix()})"]
    return "\n".join(lines).rstrip() + "\n"


def _plot(rows: Sequence[dict[str, Any]], out: Path) -> Path | None:
    """MSS and the share of seeds recovering the partition against b^1, one line per setting."""
    if not rows:
        return None
    import matplotlib
    from matplotlib.figure import Figure  # not pyplot: the caller's backend is left alone

    from dpfl.results.plots import write_png

    def order(b: str) -> float:
        return float("inf") if b == "full" else float(b)

    batches = sorted({r["round1_batch"] for r in rows}, key=order)
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    colours = matplotlib.colormaps["tab10" if len(settings) <= 10 else "tab20"]  # distinct up to 20 settings
    fig = Figure(figsize=(12, 4))
    axes = fig.subplots(1, 2)
    for n, setting in enumerate(settings):
        mine = [r for r in rows if r["setting"] == setting]
        xs = [i for i, b in enumerate(batches) if any(r["round1_batch"] == b for r in mine)]
        for ax, key in zip(axes, ("mss", "recovered"), strict=True):
            ys = [statistics.fmean(float(r[key]) for r in mine if r["round1_batch"] == batches[i]) for i in xs]
            ax.plot(xs, ys, marker="o", label=setting, color=colours(n % colours.N))
    for ax, title in zip(axes, ("MSS of the round-1 GMM", "share of seeds recovering the partition"), strict=True):
        ax.set_xticks(range(len(batches)), batches)
        ax.set_xlabel("round-1 batch b^1")
        ax.set_title(title)
    axes[1].set_ylim(-0.05, 1.05)
    axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))  # outside: it hid lines inside
    fig.tight_layout()
    return write_png(fig, out / "plots" / "round1_analysis.png", dpi=110)

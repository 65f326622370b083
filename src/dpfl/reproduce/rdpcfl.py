"""R-DPCFL's comparison (Malekmohammadi, Taik, Farnadi, TMLR 2025 / thesis ch. 4; spec clustered_dpfl.md §6-§8).

Methods, on the same data, seeds, clip, batch, rounds, delta and eps_total (§6):

| method | dpfl algorithm | the model a client uses |
|---|---|---|
| rdpcfl | rdpcfl (M given: the configs' 4) | its cluster's |
| ifca | ifca_dp (M = 4, random round-1 assignment, private selections) | its cluster's |
| global | dp_fedavg_local, uniform weights (DP-FedAvg) | the global model |
| local | clustered_local (no communication) | its own |
| mr_mtl | mr_mtl, lambda = 1 | its personal model |
| oracle | clustered_oracle (the true clusters) | its cluster's; a reference that knows the truth |
| fedavg | fedavg, no clipping, no noise | the global model; a non-private reference |

Settings: `<dataset>-<shift>-eps<e>`. `ci` is Fashion-MNIST rotation (configs/rdpcfl/ci_fmnist_rotation.yaml: 21
clients, 1,000 records each, 20 rounds; about 10 minutes per run on one core) at eps 5, 2 seeds. (500 records per
client was tried: the round-1 GMM then split the minority cluster, MSS 1.47 at seed 0.) `full` is the thesis grid:
Fashion-MNIST rotation, label flip and label shift (configs/rdpcfl/fmnist_*.yaml: N_i = 8000, E = 200) and MNIST
rotation where its files exist, at eps in {3, 4, 5, 10, 15}, 4 seeds: weeks on a CPU. Learning rates are the
configs' (one per setting, not tuned per method: the paper's per-method rates are not available).

results.csv (one row per run): setting, method, seed, epsilon, mean_acc (mean over clients of the accuracy of the
model the client uses on its own shifted test split), minority_acc (the same over the minority cluster's
clients), ari (adjusted Rand index of the final partition against the truth; global-model methods form one
cluster, Local one per client), clusters_found, recovered (the final partition equals the truth), minority_recovered
(some predicted cluster is exactly the minority), round1_recovered and round1_minority_recovered (the same for
R-DPCFL's GMM partition after round 1), mss,
e_c, selections, degraded_to_global (the GMM found one cluster: the run went on as Global), meets_budgets,
max_epsilon_spent, status, seconds, cpu_seconds (the rounds' wall and CPU time), run_dir.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.data.clustered import cluster_sizes
from dpfl.reproduce.jobs import Grid, GridError, Method, Setting, build_grid, config_dir
from dpfl.reproduce.runner import OK, Outcome
from dpfl.reproduce.tables import csv_text, md_table, mean_std
from dpfl.results.environment import computed_and_written, run_environments
from dpfl.results.run_files import (as_number, read_metrics, read_privacy, read_summary, training_time,
                                    write_text_atomic)

__all__ = ["COLUMNS", "EPSILONS", "SPEC", "finds_minority", "grid", "methods", "parse_epsilons", "planted_clusters",
           "row", "same_partition", "settings", "write_results"]

PAPER = "rdpcfl"
SPEC = {"ci": {"rounds": 20, "seeds": 2}, "full": {"rounds": 200, "seeds": 4}}
EPSILONS = {"ci": (5.0,), "full": (3.0, 4.0, 5.0, 10.0, 15.0)}
BASES = {"ci": (("fmnist-rotation", "ci_fmnist_rotation.yaml", "fashion_mnist"),),
         "full": (("fmnist-rotation", "fmnist_rotation.yaml", "fashion_mnist"),
                  ("fmnist-label_flip", "fmnist_label_flip.yaml", "fashion_mnist"),
                  ("fmnist-label_shift", "fmnist_label_shift.yaml", "fashion_mnist"),
                  ("mnist-rotation", "mnist_rotation.yaml", "mnist"))}
COLUMNS = ["setting", "method", "seed", "epsilon", "mean_acc", "minority_acc", "ari", "clusters_found", "recovered",
           "minority_recovered", "round1_recovered", "round1_minority_recovered", "mss", "e_c", "selections",
           "degraded_to_global", "meets_budgets", "max_epsilon_spent", "status", "seconds", "cpu_seconds", "run_dir"]
GLOBAL_MODEL = ("global", "fedavg")  # clients use the one global model


def methods() -> tuple[Method, ...]:
    return (
        Method("rdpcfl", "rdpcfl", ("algorithm={name: rdpcfl, params: {clusters: 4}}",)),
        Method("ifca", "ifca_dp", ("algorithm={name: ifca_dp, params: {clusters: 4}}",)),
        Method("global", "dp_fedavg_local", ("algorithm={name: dp_fedavg_local, params: {weighting: uniform}}",)),
        Method("local", "clustered_local", ("algorithm={name: clustered_local}",)),
        Method("mr_mtl", "mr_mtl", ("algorithm={name: mr_mtl, params: {lam: 1.0}}",)),
        Method("oracle", "clustered_oracle", ("algorithm={name: clustered_oracle}",), "reference: knows the clusters"),
        Method("fedavg", "fedavg", ("algorithm={name: fedavg}", "privacy={}"), "non-private reference (no DP)"),
    )


def settings(scale: str, datasets: Sequence[str] = ("fashion_mnist",),
             epsilons: Sequence[float] | None = None) -> list[Setting]:
    """One setting per (shift, eps_total); `epsilons` replaces the scale's (EPSILONS)."""
    if scale not in SPEC:
        raise GridError(f"--scale must be 'ci' or 'full', got {scale!r}")
    if epsilons is not None and (not epsilons or any(not (e > 0 and np.isfinite(e)) for e in epsilons)):
        raise GridError(f"--epsilons must be numbers > 0, got {list(epsilons)!r}")
    wanted = set(datasets) | ({"mnist"} if scale == "full" else set())
    out = []
    for prefix, base, dataset in BASES[scale]:
        if dataset not in wanted:
            continue
        for eps in (EPSILONS[scale] if epsilons is None else tuple(dict.fromkeys(float(e) for e in epsilons))):
            out.append(Setting(f"{prefix}-eps{eps:g}", config_dir("rdpcfl") / base, (f"privacy.budgets={eps}",),
                               methods(), dataset, f"{prefix} at eps_total {eps:g} (delta 1e-4) per client",
                               {"epsilon": f"{eps:g}"}))
    return out


def parse_epsilons(epsilons: str | Sequence[float] | None) -> Sequence[float] | None:
    """--epsilons as given ("3,5,10") or as numbers; None keeps the scale's."""
    if not isinstance(epsilons, str):
        return epsilons
    try:
        return [float(e) for e in epsilons.split(",") if e.strip()]
    except ValueError:
        raise GridError(f"--epsilons must be comma-separated numbers, got {epsilons!r}") from None


def grid(scale: str, *, datasets: Sequence[str] = ("fashion_mnist",), seeds: int | None = None,
         rounds: int | None = None, settings_pattern: str | None = None, methods: Sequence[str] | None = None,
         extra: Sequence[str] = (), epsilons: str | Sequence[float] | None = None) -> Grid:
    """The jobs of `dpfl reproduce rdpcfl` (see the module docstring); `epsilons` ("3,5,10" or numbers) replaces
    the scale's eps_total values."""
    return build_grid(PAPER, scale, settings(scale, datasets, parse_epsilons(epsilons)),
                      spec_rounds=SPEC[scale]["rounds"], spec_seeds=SPEC[scale]["seeds"], seeds=seeds, rounds=rounds,
                      settings_pattern=settings_pattern, methods=methods, extra=extra)


# ---- one row per run ------------------------------------------------------------------------------------
def planted_clusters(job_config: Any) -> list[int]:
    """The true cluster of each client, in client order (cluster 0 is the minority)."""
    c = job_config.data.clustered
    sizes = cluster_sizes(job_config.data.clients, c.clusters, c.minority_ratio)
    return [m for m, size in enumerate(sizes) for _ in range(size)]


def same_partition(a: Sequence[int], b: Sequence[int]) -> bool:
    """The two labelings split the clients into the same groups (cluster ids themselves do not matter)."""
    def blocks(x: Sequence[int]) -> set[frozenset[int]]:
        return {frozenset(i for i, v in enumerate(x) if v == k) for k in set(x)}
    return blocks(a) == blocks(b)


def finds_minority(found: Sequence[int], truth: Sequence[int]) -> bool:
    """Some predicted cluster is exactly the minority (true cluster 0)."""
    minority = {i for i, t in enumerate(truth) if t == 0}
    return any({i for i, v in enumerate(found) if v == k} == minority for k in set(found))


def row(outcome: Outcome, out: Path) -> dict[str, Any]:
    """The results.csv row of one run, read from its run directory."""
    from sklearn.metrics import adjusted_rand_score

    job, d = outcome.job, outcome.run_dir
    r: dict[str, Any] = {c: None for c in COLUMNS}
    r.update(setting=job.setting, method=job.method, seed=job.seed, status=outcome.status,
             epsilon=as_number(job.config.privacy.budgets) if job.method != "fedavg" else None)
    if outcome.status != OK or not (d / "metrics.jsonl").is_file():
        return r
    metrics, summary = read_metrics(d), read_summary(d)
    if summary is None:
        r["status"] = "incomplete"
        return r
    r["run_dir"] = d.relative_to(out).as_posix() if d.is_relative_to(out) else str(d)
    times = training_time(metrics)
    r["seconds"] = round(times["train_seconds"], 1)
    r["cpu_seconds"] = None if times["train_cpu_seconds"] is None else round(times["train_cpu_seconds"], 1)
    truth = planted_clusters(job.config)
    last = next((m for m in reversed(metrics) if "test_accuracy" in m), metrics[-1])
    if job.method in GLOBAL_MODEL:
        accs = last.get("test_acc_clients") or []
        r["mean_acc"] = last.get("test_acc_clients_mean")
        minority = [a for a, t in zip(accs, truth, strict=True) if t == 0] if accs else []
        r["minority_acc"] = statistics.fmean(minority) if minority else None
        final = [0] * len(truth)
    else:
        r["mean_acc"], r["minority_acc"] = last.get("acc_personal"), last.get("acc_personal_minority")
        final = metrics[-1].get("clusters") or (list(range(len(truth))) if job.method == "mr_mtl" else None)
    if final is not None:
        r["ari"] = float(adjusted_rand_score(truth, final))
        r["clusters_found"] = len(set(final))
        r["recovered"] = same_partition(final, truth)
        r["minority_recovered"] = finds_minority(final, truth)
    first = next((m for m in metrics if "round1_clusters" in m), None)
    if first is not None:
        r["round1_recovered"] = same_partition(first["round1_clusters"], truth)
        r["round1_minority_recovered"] = finds_minority(first["round1_clusters"], truth)
        r.update(mss=first.get("mss"), e_c=first.get("e_c"), degraded_to_global=bool(first.get("degraded_to_global")))
    r["selections"] = metrics[-1].get("selections_made")
    if job.method != "fedavg" and (d / "privacy.json").is_file():
        privacy = read_privacy(d)
        r["meets_budgets"] = privacy.get("meets_budgets")
        spent = [as_number(c.get("epsilon_spent")) for c in privacy.get("clients") or []]
        r["max_epsilon_spent"] = max((s for s in spent if s is not None), default=None)
    return r


# ---- the files ------------------------------------------------------------------------------------------
def write_results(grid: Grid, outcomes: Sequence[Outcome], out: Path, *, command: str = "") -> tuple[Path, Path]:
    """OUT/results.csv, OUT/results.md and OUT/plots/{accuracy,minority}_vs_eps_<shift>.png."""
    out = Path(out)
    by_key = {o.job.key: o for o in outcomes}
    ordered = [by_key[j.key] for j in grid.all_jobs if j.key in by_key]
    rows = [row(o, out) for o in ordered]
    csv_path = write_text_atomic(out / "results.csv", csv_text(rows, COLUMNS))
    lines = [f"# Reproduction: R-DPCFL ({grid.label})", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [computed_and_written(run_environments(o.run_dir for o in ordered)), ""]
    lines += ["mean acc: each client's accuracy with the model it uses, on its own shifted test split, averaged over "
              "clients; minority acc: the same over the minority cluster; ARI against the planted clusters "
              "(global-model methods: one cluster, local: one per client); recovered: the final partition equals the "
              "truth (k of S seeds). Cells: mean ± sample std over the seeds that finished. "
              "oracle knows the clusters; fedavg is not private.", ""]
    for note in [*grid.selection, *grid.notes]:
        lines.append(f"- {note}")
    for setting in grid.settings:
        mine = [r for r in rows if r["setting"] == setting.name]
        if not mine:
            continue
        body = []
        for m in setting.methods:
            ok = [r for r in mine if r["method"] == m.name and r["status"] == OK]
            if not ok:
                continue
            rec = [r["recovered"] for r in ok if r["recovered"] is not None]
            mino = [r["minority_recovered"] for r in ok if r["minority_recovered"] is not None]
            body.append([m.name, mean_std(r["mean_acc"] for r in ok), mean_std(r["minority_acc"] for r in ok),
                         mean_std((r["ari"] for r in ok), ".2f"),
                         f"{sum(rec)}/{len(rec)}" if rec else "", f"{sum(mino)}/{len(mino)}" if mino else "",
                         mean_std((r["mss"] for r in ok), ".2f")
                         if any(r["mss"] is not None for r in ok) else "",
                         "yes" if all(r["meets_budgets"] for r in ok) else
                         ("n/a" if m.name == "fedavg" else "NO"), len(ok)])
        lines += ["", f"## {setting.name}", "", setting.describe, ""]
        lines += md_table(["method", "mean acc", "minority acc", "ARI", "recovered", "minority recovered", "MSS",
                           "within budgets", "seeds"], body)
    for shift, path in _plots(rows, out).items():
        lines += ["", f"![{shift}]({path.relative_to(out).as_posix()})"]
    md_path = write_text_atomic(out / "results.md", "\n".join(lines).rstrip() + "\n")
    return csv_path, md_path


def _plots(rows: Sequence[Mapping[str, Any]], out: Path) -> dict[str, Path]:
    """Accuracy and minority accuracy against eps_total, one line per method, one pair of panels per setting family."""
    from matplotlib.figure import Figure  # not pyplot: the caller's backend is left alone

    from dpfl.results.plots import write_png

    families = sorted({r["setting"].rsplit("-eps", 1)[0] for r in rows if r["status"] == OK})
    made = {}
    for family in families:
        fig = Figure(figsize=(10, 4))
        axes = fig.subplots(1, 2)
        for m in dict.fromkeys(r["method"] for r in rows):
            mine = [r for r in rows
                    if r["status"] == OK and r["method"] == m and r["setting"].startswith(family + "-eps")]
            eps = sorted({float(r["setting"].rsplit("-eps", 1)[1]) for r in mine})
            if not eps:
                continue
            for ax, key in zip(axes, ("mean_acc", "minority_acc"), strict=True):
                ys = [np.mean([r[key] for r in mine if float(r["setting"].rsplit("-eps", 1)[1]) == e
                               and r[key] is not None] or [np.nan]) for e in eps]
                if m == "fedavg":  # not private: no epsilon; a level to compare with, not a point on the axis
                    ax.axhline(float(np.nanmean(ys)), color="grey", ls=":", label="fedavg (not private)")
                else:
                    ax.plot(eps, ys, marker="o", label=m, ls="--" if m == "oracle" else "-")
        for ax, title in zip(axes, ("mean client accuracy", "minority-cluster accuracy"), strict=True):
            ax.set_xlabel("ε budget per client (eps_total)")
            ax.set_title(f"{family}: {title}")
            ax.set_ylim(0, 1)
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        made[family] = write_png(fig, out / "plots" / f"accuracy_vs_eps_{family}.png", dpi=110)
    return made

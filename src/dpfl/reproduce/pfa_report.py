"""The PFA paper's two views that span settings: accuracy against the population M (its Figs. 3-4), and every
client whose heuristic-calibrated run spent more than its budget under the real accountant.

Both are regenerated from the run directories with the rest of results.md (`tables.write_results`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.reproduce.jobs import Grid
from dpfl.reproduce.runner import OK, Outcome
from dpfl.results.run_files import as_number, read_privacy

__all__ = ["accuracy_by_seed", "accuracy_vs_m", "clients_over_budget", "overspent_clients"]


def accuracy_vs_m(grid: Grid, rows: Sequence[Mapping[str, Any]], out: Path) -> list[str]:
    """results.md lines: per (model, budgets, calibration) with two or more M run, a plot of the final accuracy
    (mean ± sample std over seeds, ddof = 1) against M, one line per method, and its table; where the cells of a
    table average different numbers of seeds, each says its n (the line above the table names the seeds)."""
    from dpfl.results.plots import plot_errorbars

    groups: dict[tuple[str, str, str], dict[int, str]] = {}
    for s in grid.settings:
        meta = s.meta
        if "clients" in meta:
            groups.setdefault((meta["model"], meta["dist"], meta["calibration"]), {})[int(meta["clients"])] = s.name
    lines: list[str] = []
    for (model, dist, cal), by_m in groups.items():
        ms = sorted(m for m, name in by_m.items() if any(r["setting"] == name and r["status"] == OK for r in rows))
        if len(ms) < 2:
            continue
        methods = list(dict.fromkeys(r["method"] for r in rows if r["setting"] in by_m.values()))
        accs = {(method, m): [r["final_accuracy"] for r in rows if r["setting"] == by_m[m] and r["method"] == method
                              and r["status"] == OK and r["final_accuracy"] is not None]
                for method in methods for m in ms}
        mixed = len({len(a) for a in accs.values() if a}) > 1  # a grid's seeds run over sessions: say n per cell
        table, series = [], {}
        for method in methods:
            means, stds, cells = [], [], []
            for m in ms:
                acc = accs[(method, m)]
                means.append(float(np.mean(acc)) if acc else math.nan)
                stds.append(float(np.std(acc, ddof=1)) if len(acc) > 1 else math.nan)  # as results.md's other cells
                cells.append("—" if not acc else f"{means[-1]:.4f} ± " + ("n/a" if len(acc) < 2 else f"{stds[-1]:.4f}")
                             + (f" (n = {len(acc)})" if mixed else ""))
            series[method] = (ms, means, stds)
            table.append([method, *cells])
        path = plot_errorbars(series, out / "plots" / f"accuracy_vs_M-{model}-{dist}-{cal}.png",
                              xlabel="clients M (K = 0.8 M per round)", ylabel="final test accuracy",
                              title=f"{model}, {dist}, calibration {cal}")
        seeds = sorted({int(r["seed"]) for r in rows if r["setting"] in by_m.values() and r["status"] == OK})
        lines += [f"## Accuracy against M: {model}, {dist}, calibration {cal}", "",
                  f"Final test accuracy, mean ± sd over seeds {', '.join(map(str, seeds))}"
                  + ("; a cell with fewer says its n." if mixed else "."), "",
                  "| method | " + " | ".join(f"M = {m}" for m in ms) + " |", "|---" * (len(ms) + 1) + "|",
                  *("| " + " | ".join(row) + " |" for row in table), "",
                  f"![accuracy vs M]({path.relative_to(out).as_posix()})", ""]
    return lines


def accuracy_by_seed(grid: Grid, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per (model, M): one table of the final test accuracy of every seed, "seed 0 / seed 1 / ...", one column per
    (budgets, calibration), accountant first. The mean ± sd of `accuracy_vs_m` hides which seed did what; a seed
    that swings (PFA at M = 20 stops wherever its accuracy happens to be) is read here. "—" marks a missing run."""
    groups: dict[tuple[str, int], list[tuple[tuple[int, str], str, str]]] = {}
    for s in grid.settings:
        meta = s.meta
        if "clients" in meta:
            cal = "heuristic" if meta["calibration"] == "pfa-heuristic" else meta["calibration"]
            order = (meta["calibration"] != "accountant", meta["dist"])
            label = f"{meta['dist']}, {cal}"
            groups.setdefault((meta["model"], int(meta["clients"])), []).append((order, label, s.name))
    done = [r for r in rows if r["status"] == OK and r["final_accuracy"] is not None]
    lines: list[str] = []
    for (model, m), columns in groups.items():
        columns.sort()
        names = {name for _, _, name in columns}
        here = [r for r in done if r["setting"] in names]
        if not here:
            continue
        seeds = sorted({int(r["seed"]) for r in here})
        acc = {(r["setting"], r["method"], int(r["seed"])): float(r["final_accuracy"]) for r in here}
        header = "| method | " + " | ".join(label for _, label, _ in columns) + " |"
        lines += [f"## Final test accuracy by seed: {model}, M = {m} (seed {' / '.join(map(str, seeds))})", "",
                  header, "|---" * (len(columns) + 1) + "|"]
        for method in dict.fromkeys(r["method"] for r in here):
            cells = [" / ".join(f"{acc[(name, method, seed)]:.4f}" if (name, method, seed) in acc else "—"
                                for seed in seeds) for _, _, name in columns]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def clients_over_budget(privacy: Mapping[str, Any]) -> list[tuple[Any, float, float]]:
    """(client, spent, budget) of every client of a privacy.json whose accountant epsilon exceeds its budget (beyond
    float rounding: 1e-9 relative)."""
    over = []
    for c in privacy.get("clients") or []:
        spent, budget = as_number(c.get("epsilon_spent")), as_number(c.get("epsilon_budget"))
        if spent is not None and budget is not None and spent > budget * (1 + 1e-9):
            over.append((c["client"], spent, budget))
    return over


def overspent_clients(grid: Grid, outcomes: Sequence[Outcome]) -> list[str]:
    """results.md lines: every client of a heuristic-calibrated run (status ok) whose epsilon under the run's
    accountant exceeds its budget (the heuristic is not a guarantee), or the statement that none did."""
    heuristic = {s.name for s in grid.settings if s.meta.get("calibration") == "pfa-heuristic"}
    done = [o for o in outcomes if o.job.setting in heuristic and o.status == OK
            and not o.job.config.privacy.allow_budget_violation]  # max_eps overspends by design (labelled NOT private)
    if not done:
        return []
    found: list[list[str]] = []
    for o in done:
        try:
            privacy = read_privacy(o.run_dir)
        except ValueError:
            continue
        for client, spent, budget in clients_over_budget(privacy):
            found.append([o.job.setting, o.job.method, str(o.job.seed), str(client), f"{budget:.4g}", f"{spent:.4g}",
                          f"{spent / budget:.2f}"])
    lines = ["## Heuristic calibration: clients over budget under the real accountant", "",
             f"{len(done)} heuristic-calibrated runs read (PFA's formula is not a DP guarantee; dpfl reports the "
             f"accountant's ε of the noise it gave). "]
    if not found:
        lines[-1] += "No client spent more than its budget."
        return lines + [""]
    lines[-1] += (f"{len(found)} client-runs spent more than their budgets (max_eps, NOT private by design, is left "
                  "out). Per setting and method, then every one:")
    summary: dict[tuple[str, str], list[float]] = {}
    for row in found:
        summary.setdefault((row[0], row[1]), []).append(float(row[6]))
    runs = Counter((o.job.setting, o.job.method) for o in done)
    lines += ["", "| setting | method | client-runs over budget | runs | largest ratio |", "|---|---|---|---|---|",
              *(f"| {s} | {m} | {len(r)} | {runs[(s, m)]} | {max(r):.2f} |" for (s, m), r in summary.items()), ""]
    header = ["setting", "method", "seed", "client", "budget ε", "accountant ε", "ratio"]
    return lines + ["| " + " | ".join(header) + " |", "|---" * len(header) + "|",
                    *("| " + " | ".join(row) + " |" for row in found), ""]

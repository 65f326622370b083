"""results.csv, results.md and plots of a comparison, regenerated from its run directories.

Why from the directories: a re-run of the same command (or one with another --settings/--methods
selection) re-collects every finished run for free, and the tables can never disagree with the runs.
results.csv has one row per (method, setting, seed); results.md puts the methods of a setting side
by side as mean ± sample std (ddof = 1) over the seeds that finished, with the number of seeds shown
and "n/a" for the std of a single seed. Every output states the scale, including any reduction.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dpfl.reproduce.jobs import Grid, Setting
from dpfl.reproduce.pfa_report import accuracy_vs_m, overspent_clients
from dpfl.reproduce.runner import FAILED, OK, SKIPPED, Outcome
from dpfl.results.environment import computed_by, provenance, run_environments
from dpfl.results.run_files import (as_number, last_number, read_metrics, read_privacy, read_summary, training_time,
                                    write_text_atomic)

__all__ = ["COLUMNS", "columns", "csv_text", "job_row", "mean_std", "seeds_ok", "seeds_phrase", "write_results"]

COLUMNS = [
    "method", "setting", "seed", "scale", "status", "label", "algorithm",
    "final_accuracy", "best_accuracy", "test_acc_clients_mean_final",
    "rounds_run", "rounds_planned", "stop_reason", "meets_budgets", "max_epsilon_spent", "min_budget",
    "noise_stat_round1_analytic", "noise_stat_round1_empirical", "uplink_mib", "downlink_mib", "seconds",
    "cpu_seconds", "run_dir", "message",
]
# Columns only some papers' results.csv have: paper -> (column, the column it follows). Other papers' files
# are unchanged. acc_personal_final: the last logged acc_personal (clients' personal models on their own
# test splits), empty for methods without personal models; final_val_accuracy: the last logged val_accuracy
# (the global model on the clients' validation splits, what `--search` selects on); final_test_loss: the last
# logged test_loss (the global model's mean cross-entropy on the test split; Robust-HDP's falsified-budget table
# shows it because a lie's damage can show in the loss while the accuracy does not move).
PAPER_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "fedceo": (("acc_personal_final", "test_acc_clients_mean_final"),
               ("final_val_accuracy", "acc_personal_final")),
    "robust-hdp": (("final_test_loss", "test_acc_clients_mean_final"),),
}
NOT_RUN = "not run"
CI_SCALE = {"fedceo": "spec fedceo.md §9 CI scale"}  # what "ci" is, per paper (default: heterogeneous_dp.md §7.4)
REDUCED_SCALE = {"fedceo": "the full setting with T = 50 rounds (not 300) and E = 1 local epoch (not 30): REDUCED, "
                           "not the paper's setting"}
MIB = float(1 << 20)
PAPERS = {
    "pfa": "PFA: J. Liu, J. Lou, L. Xiong, J. Liu, X. Meng, \"Projected Federated Averaging with Heterogeneous "
           "Differential Privacy\", PVLDB 15(4), 2022",
    "robust-hdp": "Robust-HDP: \"Noise-Aware Algorithm for Heterogeneous Differentially Private Federated Learning\", "
                  "ICML 2024 (S. Malekmohammadi's PhD thesis, ch. 3)",
    "fedceo": "FedCEO: Y. Li, L. Fu, T. Wang, C. Chen, J. Lou, B. Chen, L. Yang, J. Shen, Z. Zheng, \"Clients "
              "Collaborate: Flexible Differentially Private Federated Learning with Guaranteed Improvement of "
              "Utility-Privacy Trade-off\", arXiv:2402.07002 (ICML 2025)",
}


def columns(paper: str) -> list[str]:
    """results.csv's columns for a paper: COLUMNS plus the paper's own (PAPER_COLUMNS)."""
    cols = list(COLUMNS)
    for name, after in PAPER_COLUMNS.get(paper, ()):
        cols.insert(cols.index(after) + 1, name)
    return cols


# ---- one row per run ----------------------------------------------------------------------------------
def job_row(outcome: Outcome, scale: str, out: Path, *, columns: Sequence[str] = COLUMNS) -> dict[str, Any]:
    """The results.csv row of one job, read from its run directory (what exists of it); keys: `columns`."""
    job, d = outcome.job, outcome.run_dir
    row: dict[str, Any] = {c: None for c in columns}
    row.update(method=job.method, setting=job.setting, seed=job.seed, scale=scale, status=outcome.status,
               label=job.label, algorithm=job.config.algorithm.name, message=outcome.message or None,
               rounds_planned=job.config.training.rounds)
    if not d.is_dir() or not (d / "metrics.jsonl").is_file():
        if outcome.status not in (FAILED, SKIPPED):
            row["status"] = NOT_RUN
        return row
    row["run_dir"] = d.relative_to(out).as_posix() if d.is_relative_to(out) else str(d)
    try:
        metrics = read_metrics(d)
        summary = read_summary(d)
        privacy = read_privacy(d) if (d / "privacy.json").is_file() else None
    except ValueError as err:  # a corrupt file: say so instead of failing the whole table
        row["message"] = f"{row['message'] or ''} unreadable run directory: {err}".strip()
        return row
    if summary is None and outcome.status == OK:
        row["status"] = "incomplete"
    row.update({k: v for k, v in _from_metrics(metrics).items() if k in row})
    if summary is not None:
        row.update(final_accuracy=as_number(summary.get("final_accuracy")),
                   best_accuracy=as_number(summary.get("best_accuracy")),
                   rounds_run=summary.get("rounds_done"), stop_reason=summary.get("stop_reason"))
    if job.config.privacy.mechanism == "none":
        row["meets_budgets"] = False  # not private: it meets no budget (privacy.json reports nothing to check)
    elif privacy is not None:
        row.update(_from_privacy(privacy))
    return row


def _from_metrics(metrics: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    first = next((r for r in metrics if r.get("round") == 1), {})
    up = sum(_bytes(r, "bytes_up", "uplink_bytes") for r in metrics)
    down = sum(_bytes(r, "bytes_down", "downlink_bytes") for r in metrics)
    times = training_time(metrics)
    acc = [a for a in (as_number(r.get("test_accuracy")) for r in metrics) if a is not None]
    return {
        "rounds_run": len(metrics),
        "final_accuracy": acc[-1] if acc else None,
        "best_accuracy": max(acc) if acc else None,
        "test_acc_clients_mean_final": last_number(metrics, "test_acc_clients_mean"),
        "acc_personal_final": last_number(metrics, "acc_personal"),
        "final_val_accuracy": last_number(metrics, "val_accuracy"),
        "final_test_loss": last_number(metrics, "test_loss"),
        "noise_stat_round1_analytic": as_number(first.get("noise_stat_analytic")),
        "noise_stat_round1_empirical": as_number(first.get("noise_stat_empirical")),
        "uplink_mib": up / MIB if metrics else None,
        "downlink_mib": down / MIB if metrics else None,
        "seconds": times["train_seconds"] if metrics else None,
        "cpu_seconds": times["train_cpu_seconds"],
    }


def _bytes(row: Mapping[str, Any], per_client: str, total: str) -> float:
    """A round's bytes: the per-client list when the row has one, else the round total."""
    values = row.get(per_client)
    if isinstance(values, list):
        return float(sum(as_number(v) or 0.0 for v in values))
    return as_number(row.get(total)) or 0.0


def _from_privacy(privacy: Mapping[str, Any]) -> dict[str, Any]:
    if not privacy.get("accounted"):  # a mechanism dpfl does not account: no claim either way
        return {}
    clients = privacy.get("clients") or []
    spent = [as_number(c.get("epsilon_spent")) for c in clients]
    budgets = [as_number(c.get("epsilon_budget")) for c in clients]
    spent = [s for s in spent if s is not None]
    budgets = [b for b in budgets if b is not None]
    return {"meets_budgets": privacy.get("meets_budgets"), "max_epsilon_spent": max(spent) if spent else None,
            "min_budget": min(budgets) if budgets else None}


# ---- formatting ---------------------------------------------------------------------------------------
def mean_std(values: Iterable[Any], fmt: str = ".4f") -> str:
    """``mean ± std`` (sample std, ddof = 1) of the finite values; ``± n/a`` for one value, ``n/a`` for none."""
    vals = [v for v in (as_number(x) for x in values) if v is not None and math.isfinite(v)]
    if not vals:
        return "n/a"
    mean = statistics.fmean(vals)
    if len(vals) == 1:
        return f"{mean:{fmt}} ± n/a"
    return f"{mean:{fmt}} ± {statistics.stdev(vals):{fmt.lstrip('+')}}"  # a signed mean, an unsigned spread


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("" if r.get(k) is None else r[k]) for k in columns})
    return buf.getvalue()


def md_table(header: Sequence[str], body: Sequence[Sequence[Any]]) -> list[str]:
    """A markdown table (cells as text, `|` escaped)."""
    esc = [[str(c).replace("|", "\\|") for c in row] for row in [list(header), *body]]
    return ["| " + " | ".join(esc[0]) + " |", "|" + "|".join("---" for _ in header) + "|",
            *["| " + " | ".join(r) + " |" for r in esc[1:]]]


def _method_cell(method: str, label: str) -> str:
    return f"{method} — **{label}**" if label else method


# ---- per-setting summary ------------------------------------------------------------------------------
def _ok(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if r["status"] == OK]


def seeds_ok(rows: Sequence[Mapping[str, Any]], planned_seeds: int) -> str:
    """The "seeds ok" cell of one configuration's runs, e.g. "1/3 (failed)": against the planned seeds, so a grid
    still running (or spread over machines with --only-seeds) shows what is missing."""
    cell = f"{len(_ok(rows))}/{max(planned_seeds, len(rows))}"
    bad = sorted({str(r["status"]) for r in rows if r["status"] != OK})
    return cell + (f" ({', '.join(bad)})" if bad else "")


def _span(values: Iterable[Any]) -> str:
    vals = sorted({v for v in values if v is not None})
    if not vals:
        return "n/a"
    return str(vals[0]) if len(vals) == 1 else f"{vals[0]}–{vals[-1]}"


def _meets(rows: Sequence[Mapping[str, Any]]) -> str:
    vals = [r["meets_budgets"] for r in rows if r["meets_budgets"] is not None]
    if not vals:
        return "n/a"
    if all(vals):
        return "yes"
    return "no" if not any(vals) else f"{sum(map(bool, vals))}/{len(vals)} yes"


_SETTING_COLUMNS: list[tuple[str, Callable[[Sequence[Mapping[str, Any]]], str]]] = [
    ("final acc", lambda rs: mean_std(r["final_accuracy"] for r in rs)),
    ("best acc", lambda rs: mean_std(r["best_accuracy"] for r in rs)),
    ("clients' mean acc (final)", lambda rs: mean_std(r["test_acc_clients_mean_final"] for r in rs)),
    ("personal acc (final)", lambda rs: mean_std(r.get("acc_personal_final") for r in rs)),
    ("rounds", lambda rs: _span(r["rounds_run"] for r in rs)),
    ("stop", lambda rs: ", ".join(sorted({str(r["stop_reason"]) for r in rs if r["stop_reason"]})) or "n/a"),
    ("meets budgets", _meets),
    ("max ε spent", lambda rs: mean_std((r["max_epsilon_spent"] for r in rs), ".3f")),
    ("noise stat r1 (analytic)", lambda rs: mean_std((r["noise_stat_round1_analytic"] for r in rs), ".3g")),
    ("noise stat r1 (empirical)", lambda rs: mean_std((r["noise_stat_round1_empirical"] for r in rs), ".3g")),
    ("uplink MiB", lambda rs: mean_std((r["uplink_mib"] for r in rs), ".2f")),
    ("downlink MiB", lambda rs: mean_std((r["downlink_mib"] for r in rs), ".2f")),
    ("train s", lambda rs: mean_std((r["seconds"] for r in rs), ".1f")),
    ("train CPU s", lambda rs: mean_std((r.get("cpu_seconds") for r in rs), ".1f")),
]


def _setting_section(setting: Setting, rows: Sequence[Mapping[str, Any]], plots: Mapping[str, Path],
                     out: Path, planned_seeds: int) -> list[str]:
    """One setting's table, one row per method; "seeds ok" counts against `planned_seeds` (see `seeds_ok`)."""
    lines = [f"## {setting.name}", ""]
    if setting.describe:
        lines += [setting.describe + ".", ""]
    budgets = [r["min_budget"] for r in _ok(rows) if r["min_budget"] is not None and math.isfinite(r["min_budget"])]
    if budgets:
        lo, hi = min(budgets), max(budgets)
        lines += [f"Smallest client budget ε: {lo:.3g}" + (f" to {hi:.3g} over seeds" if hi > lo else "") + ".", ""]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    body, labels = [], {}
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        ok = _ok(mine)
        labels[m] = mine[0]["label"] or ""
        body.append([_method_cell(m, labels[m]), seeds_ok(mine, planned_seeds),
                     *[fn(ok) for _, fn in _SETTING_COLUMNS]])
    header = ["method", "seeds ok", *[name for name, _ in _SETTING_COLUMNS]]
    keep = [i for i in range(len(header)) if i < 2 or any(row[i] != "n/a" for row in body)]
    lines += md_table([header[i] for i in keep], [[row[i] for i in keep] for row in body])
    for title, path in plots.items():
        lines += ["", f"![{title}]({path.relative_to(out).as_posix()})"]
    return lines + [""]


# ---- comparison tables --------------------------------------------------------------------------------
def _overview(grid: Grid, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    settings = [s.name for s in grid.settings if any(r["setting"] == s.name for r in rows)]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    body = []
    for s in settings:
        cells = []
        for m in methods:
            mine = [r for r in rows if r["setting"] == s and r["method"] == m]
            cells.append(mean_std(r["final_accuracy"] for r in _ok(mine)) if mine else "—")
        body.append([s, *cells])
    title = "## Overview: final test accuracy (mean ± std over seeds)"
    return [title, "", *md_table(["setting", *methods], body), ""]


def _noise_tables(grid: Grid, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Robust-HDP: round-1 noise statistic, budget distributions as rows, methods as columns (thesis Table 3.4)."""
    mains = [s for s in grid.settings if s.meta.get("kind") == "main" and any(r["setting"] == s.name for r in rows)]
    if not mains:
        return []
    out: list[str] = []
    for which in ("analytic", "empirical"):
        key = f"noise_stat_round1_{which}"
        methods = [m for m in dict.fromkeys(r["method"] for r in rows) if any(
            r["method"] == m and r[key] is not None for r in _ok(rows))]
        if not methods:
            continue
        body = [[s.name, *[mean_std((r[key] for r in _ok(rows) if r["setting"] == s.name and r["method"] == m),
                                    ".3g") for m in methods]] for s in mains]
        out += [f"## Round-1 noise statistic ({which})", "",
                "Σ_i w_i² σ_i² / (p η²), the per-parameter noise variance of the round-1 aggregate (spec §5; "
                + ("σ_i² from the formula T η² p C² z_i² / b_i²" if which == "analytic" else
                   "σ_i² = ‖n_i‖², the noise actually injected") + "). Lower is better; n/a where the method "
                "has no such statistic (PFA projects, np_fedavg adds no noise). It depends on the noise the "
                "clients were calibrated to, hence on the planned number of rounds: compare it only between "
                "runs of the same scale.", "",
                *md_table(["setting", *methods], body), ""]
    return out


def _misreport_tables(grid: Grid, rows: Sequence[Mapping[str, Any]], metrics: Mapping[tuple, list]) -> list[str]:
    """Robust-HDP: each method with and without the falsified budget (or one of its controls), paired by seed."""
    out: list[str] = []
    for s in grid.settings:
        kind = s.meta.get("kind")
        if kind not in ("misreport", "control") or not any(r["setting"] == s.name for r in rows):
            continue
        title, col = ("Falsified budget", "misreport") if kind == "misreport" else ("Control of the lie", "control")
        honest = s.meta["honest"]
        body = []
        for m in [m.name for m in s.methods if any(r["method"] == m.name and r["setting"] == s.name for r in rows)]:
            lie = {r["seed"]: r for r in _ok(rows) if r["setting"] == s.name and r["method"] == m}
            hon = {r["seed"]: r for r in _ok(rows) if r["setting"] == honest and r["method"] == m}
            both = sorted(set(lie) & set(hon))
            diffs = [lie[k]["final_accuracy"] - hon[k]["final_accuracy"] for k in both
                     if lie[k]["final_accuracy"] is not None and hon[k]["final_accuracy"] is not None]
            same = [metrics.get((honest, m, k)) == metrics.get((s.name, m, k)) for k in both]
            body.append([m, mean_std(r["final_accuracy"] for r in hon.values()),
                         mean_std(r["final_accuracy"] for r in lie.values()), mean_std(diffs, "+.4f"),
                         mean_std((r.get("final_test_loss") for r in hon.values()), ".3g"),
                         mean_std((r.get("final_test_loss") for r in lie.values()), ".3g"),
                         f"{len(both)}", "n/a" if not same else ("yes" if all(same) else "no")])
        out += [f"## {title}: {s.name} against {honest}", "",
                f"{s.describe}. Honest runs are the main setting {honest} (same data, "
                + ("budgets and seeds). " if kind == "misreport" else "seeds and model; the budgets are as stated). ")
                + f"Difference = {col} − honest final accuracy, paired by seed. Test loss: the global model's mean "
                "cross-entropy on the test split after the last round (a lie's damage can show there while the "
                "accuracy does not move). \"Same curve\": the accuracy of every evaluated round is identical "
                "with and without the lie.", "",
                *md_table(["method", "honest final acc", f"{col} final acc", "difference", "honest test loss",
                           f"{col} test loss", "paired seeds", "same curve"], body), ""]
    return out


def _fedceo_tables(grid: Grid, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """FedCEO: methods as rows, σ_g settings as columns; global accuracy, then the personal models' accuracy."""
    settings = [s for s in grid.settings if any(r["setting"] == s.name for r in rows)]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    labels = {r["method"]: r["label"] or "" for r in rows}
    header = ["method", *[f"σ_g = {s.meta.get('sigma', s.name)}" for s in settings]]

    def table(key: str, which: Sequence[str]) -> list[str]:
        body = []
        for m in which:
            cells = []
            for s in settings:
                mine = [r for r in rows if r["setting"] == s.name and r["method"] == m]
                cells.append(mean_std(r.get(key) for r in _ok(mine)) if mine else "—")
            body.append([_method_cell(m, labels[m]), *cells])
        return md_table(header, body)

    personal = [m for m in methods if any(r.get("acc_personal_final") is not None for r in rows if r["method"] == m)]
    params = "; ".join(f"{s.name}: λ = {s.meta['lam']}, ϑ = {s.meta['theta']}, I = {s.meta['interval']}"
                       + (f", the ϑ = 1 ablation's own λ = {s.meta['ablation_lam']}" if "ablation_lam" in s.meta
                          else "")
                       + f" ({s.meta.get('source', '')})" for s in settings if "sigma" in s.meta)
    out = ["## Overview: final global accuracy acc_global (mean ± std over seeds)", "",
           "The global model on the official test split after the last round. This is the primary metric of "
           "udp_fedavg, fedceo_theta1 and fedceo; ppsgd's and centaur's primary metric is acc_personal (next "
           "table; spec §10.9), their global model is a diagnostic (PPSGD: w alone; CENTAUR: φ with the mean of "
           f"the stored heads). FedCEO's parameters: {params}.", "", *table("final_accuracy", methods), ""]
    if personal:
        out += ["## Personalised accuracy acc_personal (final; mean ± std over seeds)", "",
                "Mean over the clients holding a personal model (PPSGD: w + u_k; CENTAUR: h_k∘φ; FedCEO: the "
                "smoothed ŵ_k of its last smoothing round) of its accuracy on the client's own local test split, "
                "at the last round that logged it (FedCEO logs it from its first smoothing round on). Primary "
                "for ppsgd and centaur.", "", *table("acc_personal_final", personal), ""]
    return out


def _fedceo_notes(grid: Grid, rates: Sequence[tuple[str, float]], labels: Sequence[tuple[str, str]]) -> list[str]:
    """FedCEO's header bullets: fixed noise, the untuned λ/ϑ/I, the metrics and which one is primary."""
    momentum = sorted({j.config.training.optimizer.momentum for j in grid.all_jobs})
    return [
        "- Hyperparameters: one learning rate for every method (" + ", ".join(f"{m} {lr:g}" for m, lr in rates)
        + ", momentum " + ", ".join(f"{m:g}" for m in momentum) + "), as in the paper (spec §4). FedCEO's λ, ϑ, "
        "I: " + "; ".join(f"**{src}**" for src in dict.fromkeys(s.meta.get("source", "") for s in grid.settings))
        + " (per setting in the next section).",
        _fedceo_privacy({j.config.privacy.mechanism for j in grid.all_jobs}),
        "- Accuracy: acc_global = the global model on the official test split, after the last round (final, "
        "the headline) and at the best evaluated round (best: selected on the test set, shown only for "
        "comparison with the authors' code, spec §3.6); personal acc = acc_personal, the clients' personal "
        "models on their own local test splits; clients' mean acc = the global model on each client's local "
        "test split, averaged. **Primary metric** (spec §10.9): acc_global for udp_fedavg, fedceo_theta1 and "
        "fedceo; acc_personal for ppsgd and centaur. Cells are mean ± sample std (ddof = 1) over the seeds that "
        "finished; ± n/a with one seed.",
        *(["- Labels: " + "; ".join(f"{m} — **{label}**" for m, label in labels) + "."] if labels else []),
        "- Diagnostics: uplink/downlink MiB cumulative over the run (CENTAUR uploads its representation only); "
        "train s = sum of the rounds' wall time (FedCEO's includes its T-tSVD; each run's metrics.jsonl has "
        "threshold, zeroed_fraction and prox_seconds at its smoothing rounds); columns without a value for any "
        "method are omitted.",
    ]


def _fedceo_privacy(mechanisms: set[str]) -> str:
    """The privacy bullet for the grid's client mechanism (spec §3.1: `dpsgd`, or `udp` under --mechanism udp)."""
    unlimited = ("Budgets are unlimited, so `meets_budgets` is vacuous; max ε spent is the largest client ε after the "
                 "run")
    if mechanisms == {"dpsgd"}:
        return ("- Privacy: every method runs the same DP-SGD clients at its setting's fixed noise multiplier σ_g "
                f"(sample-level, Poisson batches, clip 1, RDP, δ = 1e-5). {unlimited} (CENTAUR's head epochs are "
                "DP-SGD steps too and count, spec §6.3).")
    if mechanisms == {"udp"}:
        return ("- Privacy: every method runs the same client-level UDP clients at its setting's fixed σ_g (spec "
                "§3.1(b): non-private local SGD, the shared update clipped to 1, N(0, σ_g²/K) added per upload; "
                "each upload is one Gaussian mechanism at σ_g/√K against the server, no amplification by client "
                f"sampling; RDP, δ = 1e-5). {unlimited} (CENTAUR's heads and PPSGD's u_k never leave the client).")
    raise ValueError(f"a FedCEO grid runs one client mechanism, got {sorted(mechanisms)}")  # pragma: no cover


# ---- plots --------------------------------------------------------------------------------------------
def _mean_curves(rows: Sequence[Mapping[str, Any]], metrics: Mapping[tuple, list], key: str
                 ) -> dict[str, list[dict[str, Any]]]:
    """method -> metrics-like rows whose `test_accuracy` is the mean of `key` over the finished seeds."""
    curves: dict[str, list[dict[str, Any]]] = {}
    for m in dict.fromkeys(r["method"] for r in rows):
        per_round: dict[int, list[float]] = {}
        for r in _ok(rows):
            if r["method"] != m:
                continue
            for mr in metrics.get((r["setting"], m, r["seed"])) or []:
                v = as_number(mr.get(key))
                if v is not None:
                    per_round.setdefault(int(mr["round"]), []).append(v)
        if per_round:
            curves[m] = [{"round": k, "test_accuracy": statistics.fmean(v)} for k, v in sorted(per_round.items())]
    return curves


def _plots(setting: Setting, rows: Sequence[Mapping[str, Any]], metrics: Mapping[tuple, list], out: Path,
           seeds: int) -> dict[str, Path]:
    from dpfl.results.plots import plot_compare

    made = {}
    for key, suffix, what in (("test_accuracy", "", "test accuracy"),
                              ("test_acc_clients_mean", "-clients", "clients' mean held-out accuracy"),
                              ("acc_personal", "-personal", "personal models' accuracy on their own test splits")):
        curves = _mean_curves(rows, metrics, key)
        if not curves:
            continue
        title = f"{setting.name}: {what}, " + ("1 seed" if seeds == 1 else f"mean over up to {seeds} seeds")
        path = plot_compare(curves, out / "plots" / f"{setting.name}{suffix}.png", title=title)
        if path is not None:
            made[what] = path
    return made


# ---- the files ----------------------------------------------------------------------------------------
def write_results(grid: Grid, outcomes: Sequence[Outcome], out: Path, *, command: str = "") -> tuple[Path, Path]:
    """Write OUT/results.csv, OUT/results.md and OUT/plots/*.png (atomically); returns the two paths."""
    out = Path(out)
    by_key = {o.job.key: o for o in outcomes}
    ordered = [by_key[j.key] for j in grid.all_jobs if j.key in by_key]
    cols = columns(grid.paper)
    rows = [job_row(o, grid.label, out, columns=cols) for o in ordered]
    metrics: dict[tuple, list] = {}
    for o, r in zip(ordered, rows, strict=True):
        if r["status"] == OK:
            try:
                metrics[o.job.key] = read_metrics(o.run_dir)
            except ValueError:
                metrics[o.job.key] = []
    csv_path = write_text_atomic(out / "results.csv", csv_text(rows, cols))
    md = _header(grid, rows, command, [o.run_dir for o in ordered])
    md += _fedceo_tables(grid, rows) if grid.paper == "fedceo" else _overview(grid, rows)
    if grid.paper == "robust-hdp":
        md += _noise_tables(grid, rows) + _misreport_tables(grid, rows, _curves_by_key(metrics))
    if grid.paper == "pfa":
        md += accuracy_vs_m(grid, rows, out) + overspent_clients(grid, ordered)
    for s in grid.settings:
        mine = [r for r in rows if r["setting"] == s.name]
        if mine:
            md += _setting_section(s, mine, _plots(s, mine, metrics, out, len(grid.seeds)), out, len(grid.seeds))
    md_path = write_text_atomic(out / "results.md", "\n".join(md).rstrip() + "\n")
    return csv_path, md_path


def _curves_by_key(metrics: Mapping[tuple, list]) -> dict[tuple, list]:
    """(setting, method, seed) -> the accuracy of every evaluated round (for "same curve")."""
    return {k: [(r["round"], r.get("test_accuracy")) for r in v if r.get("test_accuracy") is not None]
            for k, v in metrics.items()}


def _seed_numbers(seeds: Sequence[int]) -> str:
    """"2", "0..2" (contiguous) or "0, 2"."""
    if len(seeds) > 1 and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}..{seeds[-1]}"
    return ", ".join(map(str, seeds))


def seeds_phrase(planned: Sequence[int], present: Sequence[int]) -> str:
    """The seeds the rows hold, and the planned ones when they differ (--only-seeds, or seeds not run yet): a
    results.md of seed 2 alone must not read as if its runs spanned seeds 0..2."""
    shown = present if present else planned
    text = f"seed{'s' * (len(shown) > 1)} {_seed_numbers(shown)}"
    return text if list(shown) == list(planned) else f"{text} of the planned {_seed_numbers(planned)}"


def _header(grid: Grid, rows: Sequence[Mapping[str, Any]], command: str, run_dirs: Sequence[Path]) -> list[str]:
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    rates = sorted({(j.config.model.name, j.config.training.optimizer.lr) for j in grid.all_jobs})
    labels = list(dict.fromkeys((j.method, j.label) for j in grid.all_jobs if j.label))
    lines = [f"# Reproduction: {grid.paper}", "",
             f"- **Scale: {grid.label}**" + (f" — {CI_SCALE.get(grid.paper, 'spec §7.4 CI scale')}, a smoke test of "
                                             "the comparison, not the paper's setting" if grid.scale == "ci" else "")
             + (f" — {REDUCED_SCALE[grid.paper]}" if grid.scale == "reduced" and grid.paper in REDUCED_SCALE else ""),
             f"- Paper: {PAPERS.get(grid.paper, grid.paper)}."]
    if command:
        lines.append(f"- Command: `{command}`")
    lines.append(f"- Runs computed by: {computed_by(run_environments(run_dirs))} (each run's in its "
                 "environment.jsonl).")
    lines.append(f"- Written by: {provenance()}.")
    lines.append(
        f"- Runs: {len(rows)} (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + "); "
        + seeds_phrase(grid.seeds, sorted({int(r["seed"]) for r in rows}))
        + f"; {grid.rounds} round{'s' * (grid.rounds != 1)} planned per run.")
    lines += _fedceo_notes(grid, rates, labels) if grid.paper == "fedceo" else [
        "- Learning rates were **fixed, not tuned**: one rate per model for every method ("
        + ", ".join(f"{m} {lr:g}" for m, lr in rates) + "), set in the base configs; the papers tune each method "
        "on a grid, so absolute accuracies (and possibly rankings) can differ from theirs.",
        "- Accuracy: the global model on the full test set, after the last round (final) and the best evaluated "
        "round (best); clients' mean acc: the global model on each client's held-out split, averaged. Cells are "
        "mean ± sample std (ddof = 1) over the seeds that finished; ± n/a with one seed.",
        *(["- Labels: " + "; ".join(f"{m} — **{label}**" for m, label in labels)
           + ". Methods labelled so are references, not private competitors; `meets_budgets` in results.csv says, "
           "per run, whether every client stayed within its budget."] if labels else []),
        "- Diagnostics: noise stat r1 = Σ w_i² σ_i² / (p η²) in round 1 (spec §5); uplink/downlink MiB "
        "cumulative over the run; train s = sum of the rounds' wall time (building and calibration excluded); "
        "columns without a value for any method are omitted.",
    ]
    lines.append("- Files: `results.csv` (one row per run), `runs/<setting>/<method>/seed<k>/` (each run's directory "
                 "with its own report.md), `plots/`, `logs/` (tracebacks of failed runs).")
    for note in [*grid.selection, *grid.notes]:
        lines.append(f"- Note: {note}.")
    problems: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r["status"] not in (OK, "not run"):
            problems.setdefault((r["status"], r["message"] or ""), []).append(r)
    if problems:
        lines += ["", "Runs without a result:", ""]
        for (status, message), rs in problems.items():
            which = (f"{rs[0]['setting']} / {rs[0]['method']} / seed {rs[0]['seed']}" if len(rs) == 1 else
                     f"{len(rs)} runs ({', '.join(dict.fromkeys(r['setting'] for r in rs))})")
            lines.append(f"- {which}: {status}" + (f": {message}" if message else ""))
    return lines + [""]

"""``report.md`` and ``plots/*.png`` of a run directory, rebuilt from the run's files.

The report restates what the run declared and measured; it computes no privacy quantity. Every
epsilon it shows is a number read from ``privacy.json`` or ``metrics.jsonl``; the only derived epsilon
figures are order statistics of those numbers (min, max and the *lower* median, which is always one of
the clients' own values, never an average of two).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpfl.results import plots as _plots
from dpfl.results.clip_plot import plot_clip
from dpfl.results.environment import ENVIRONMENT_FILE, changed_keys, read_environment, unrecorded_keys
from dpfl.results.formatting import format_epsilon
from dpfl.results.mpdp_outcome import stated_guarantee_lines
from dpfl.results.outcome import early_stop_hint
from dpfl.results.run_files import (
    CONFIG_FILE,
    PLOTS_DIR,
    PRIVACY_FILE,
    REPORT_FILE,
    RunDirError,
    as_float,
    as_number,
    read_config_text,
    read_metrics,
    read_privacy,
    read_summary,
    write_text_atomic,
)

__all__ = ["PLOT_FILES", "RESUME_HINT", "FULL_TABLE_MAX_CLIENTS", "TABLE_HEAD_ROWS", "write_report", "write_plots"]

PLOT_FILES = {"accuracy": "accuracy.png", "epsilon": "epsilon.png", "budget_vs_spent": "budget_vs_spent.png",
              "clip": "clip.png"}
RESUME_HINT = "incomplete: no summary.json; resume with `dpfl run CONFIG --resume --out DIR`"
FULL_TABLE_MAX_CLIENTS = 50  # more clients: min / median / max summary plus the first TABLE_HEAD_ROWS rows
TABLE_HEAD_ROWS = 20

_UNIT_WORDS = {
    "sample": ("sample-level", "any single record of a client's data: adding or removing one record changes "
               "the distribution of everything the observer sees by at most the client's (ε, δ)"),
    "client": ("client-level", "a whole client's participation (all of its records at once): adding or removing "
               "one client changes the distribution of everything the observer sees by at most (ε, δ)"),
}
_ACCOUNTANT_WORDS = {
    "rdp": "RDP (Rényi differential privacy), converted to (ε, δ)",
    "pld": "PLD (privacy loss distribution), giving (ε, δ) directly",
    "gdp": "GDP (Gaussian DP): exact composition of the Gaussian mechanisms and exact conversion to (ε, δ)",
    "prv": "PRV (privacy random variables, Gopi et al. 2021): numerical composition; every ε is the upper end of "
           "its error bars (a guarantee)",
}
_LOCAL_SAMPLING_WORDS = {
    "poisson": "Poisson sampling of records (each record joins each batch independently)",
    "fixed": "fixed-size batches drawn without replacement",
    "shuffle": "shuffled epochs (no privacy amplification by sampling)",
}
_STOP_WORDS = {
    "rounds": "all planned rounds ran",
    "budget": "too few clients remained within their privacy budget to continue",
}


# ---------------------------------------------------------------------------------------- formatting
def _fmt_eps(x: Any) -> str:
    try:
        v = as_float(x)
    except ValueError:
        return str(x)
    if v is None:
        return "—"
    return format_epsilon(v)


def _fmt_g(x: Any, digits: int = 4) -> str:
    try:
        v = as_float(x)
    except ValueError:
        return str(x)
    if v is None:
        return "—"
    if math.isinf(v) or math.isnan(v):
        return repr(v)
    return f"{v:.{digits}g}"


def _fmt_acc(x: Any) -> str:
    try:
        v = as_float(x)
    except ValueError:
        return str(x)
    return "—" if v is None else f"{v:.4f}"


def _fmt_int(x: Any) -> str:
    return "—" if x is None else str(x)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> list[str]:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if r else ":---" for r in right) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


# ---------------------------------------------------------------------------------------- plots
def write_plots(run_dir: str | os.PathLike[str], metrics: Sequence[Mapping[str, Any]],
                privacy: Mapping[str, Any] | None) -> dict[str, Path | None]:
    """(Re)write ``plots/accuracy.png``, ``plots/epsilon.png``, ``plots/budget_vs_spent.png`` and, for a run whose
    clip adapts, ``plots/clip.png``.

    A plot with nothing to show is not written, and a stale file of that name is removed, so the
    folder always matches the run's files. Returns name -> path or None.
    """
    pdir = Path(run_dir) / PLOTS_DIR
    made: dict[str, Path | None] = {
        "accuracy": _plots.plot_accuracy(metrics, pdir / PLOT_FILES["accuracy"]),
        "epsilon": _plots.plot_epsilon(metrics, privacy, pdir / PLOT_FILES["epsilon"]),
        "budget_vs_spent": (_plots.plot_budget_vs_spent(privacy, pdir / PLOT_FILES["budget_vs_spent"])
                            if privacy is not None else None),
        "clip": plot_clip(metrics, pdir / PLOT_FILES["clip"]),  # only runs whose clip adapts (the rows say so)
    }
    for key, path in made.items():
        if path is None:
            (pdir / PLOT_FILES[key]).unlink(missing_ok=True)
    return made


# ---------------------------------------------------------------------------------------- sections
def _status_lines(name: str, metrics: Sequence[Mapping[str, Any]], summary: Mapping[str, Any] | None,
                  privacy: Mapping[str, Any] | None) -> list[str]:
    out = [f"# Run report: {name}", ""]
    if privacy is not None and privacy.get("algorithm"):
        out.append(f"- **Algorithm:** `{privacy['algorithm']}`")
    evaluated = [(r["round"], r["test_accuracy"]) for r in metrics if as_number(r.get("test_accuracy")) is not None]
    if summary is not None:
        planned = summary.get("rounds_planned")
        done = summary.get("rounds_done", len(metrics))
        out.append(f"- **Status:** complete ({done} of {planned} planned rounds)" if planned is not None
                   else f"- **Status:** complete ({done} rounds)")
        reason = summary.get("stop_reason")
        words = _STOP_WORDS.get(str(reason))
        out.append(f"- **Stop reason:** `{reason}`" + (f" — {words}" if words else ""))
        personal = [r for r in metrics if as_number(r.get("acc_personal")) is not None]
        if personal:  # the method's metric first: its clients use their own models, not the server's
            out.append(f"- **Personalised accuracy (last):** {_fmt_acc(personal[-1]['acc_personal'])} — mean over the "
                       f"{personal[-1].get('acc_personal_clients')} clients holding a personal model, each on its own "
                       f"test split (round {personal[-1]['round']}); this method's metric")
        out.append(f"- **Final accuracy:** {_fmt_acc(summary.get('final_accuracy'))}"
                   + (" — the server's model alone (for clustered methods the mean of the cluster models), not the "
                      "models these clients use" if personal else ""))
        if summary.get("same_run_as"):
            out.append(f"- **Copied from** `{summary['same_run_as']}`: the same config but for its name, so the same "
                       "run; its files (times included) are that run's")
        best_round = summary.get("best_round")
        out.append(f"- **Best accuracy:** {_fmt_acc(summary.get('best_accuracy'))}"
                   + (f" (round {best_round})" if best_round is not None else "")
                   + (" — the server's model" if personal else ""))
        if personal:
            top = max(personal, key=lambda r: float(as_number(r["acc_personal"])))
            out.append(f"- **Best personalised accuracy:** {_fmt_acc(top['acc_personal'])} (round {top['round']})")
        seconds = summary.get("seconds")
    else:
        out.append(f"- **Status:** {RESUME_HINT} (DIR is this run directory). "
                   f"{len(metrics)} round(s) recorded in metrics.jsonl so far.")
        out.append("- **Stop reason:** — (the run has not finished)")
        if evaluated:
            last_r, last_a = evaluated[-1]
            best_r, best_a = max(evaluated, key=lambda t: float(as_float(t[1]) or 0.0))
            out.append(f"- **Last evaluated accuracy:** {_fmt_acc(last_a)} (round {last_r})")
            out.append(f"- **Best accuracy so far:** {_fmt_acc(best_a)} (round {best_r})")
        else:
            out.append("- **Accuracy:** no round evaluated yet")
        seconds = sum(float(r.get("seconds") or 0.0) for r in metrics) if metrics else None
    if seconds is not None:
        out.append(f"- **Wall time:** {float(seconds):.1f} s" + ("" if summary is None else
                   " (this execution: a resumed run's earlier executions are not in it)"))
    if summary is not None and summary.get("train_seconds") is not None:
        cpu = summary.get("train_cpu_seconds")
        out.append(f"- **Training time:** {float(summary['train_seconds']):.1f} s wall"
                   + (f", {float(cpu):.1f} s CPU (this process, all threads)" if cpu is not None else "")
                   + " over every round, evaluation excluded")
    if metrics:
        up = sum(int(r.get("uplink_bytes") or 0) for r in metrics)
        down = sum(int(r.get("downlink_bytes") or 0) for r in metrics)
        out.append(f"- **Communication:** {_fmt_bytes(up)} uplink, {_fmt_bytes(down)} downlink "
                   f"over {len(metrics)} round(s)")
    return out


def _privacy_lines(privacy: Mapping[str, Any] | None, metrics: Sequence[Mapping[str, Any]],
                   complete: bool) -> list[str]:
    out = ["", "## Privacy guarantee", ""]
    if privacy is not None and not complete:
        out += ["The run is incomplete: what follows is privacy.json as last written during the run.", ""]
    if privacy is None:
        out.append(f"`{PRIVACY_FILE}` has not been written yet, so the declared guarantee is unknown until the "
                   "run writes it.")
        rows = [r for r in metrics if r.get("epsilon_max") is not None]
        if rows:
            out.append(f"The largest spent epsilon recorded in metrics.jsonl so far is "
                       f"{_fmt_eps(rows[-1]['epsilon_max'])} (round {rows[-1]['round']}).")
        return out

    unit = privacy.get("unit")
    accounted = bool(privacy.get("accounted"))
    if accounted:
        level, what = _UNIT_WORDS.get(str(unit), (f"{unit}-level", f"one {unit}"))
        out.append(f"Each client *i* has its own (ε_i, δ_i)-differential-privacy guarantee, **{level}**: it "
                   f"protects {what}.")
    elif unit is None:
        out.append("**No privacy mechanism ran** (non-private run): no epsilon is reported.")
    elif "guarantee" in (privacy.get("stage") or {}):  # MP-DP's family: the method states its own, per round
        out.append("**Not in dpfl's per-client ledger: the method states its own guarantee** (privacy.json "
                   "`stage`):")
        out += [""] + [f"- {line}" for line in stated_guarantee_lines(privacy, len(metrics))]
    else:
        level, _ = _UNIT_WORDS.get(str(unit), (f"{unit}-level", ""))
        out.append(f"**Warning: this run is not accounted — no epsilon is reported.** A {level} privacy "
                   "mechanism ran, but dpfl computed no guarantee for it.")
    if privacy.get("warning"):
        out.append("")
        out.append(f"> **Warning:** {privacy['warning']}")
    out.append("")
    out.append(f"- **Unit protected:** {unit if unit is not None else 'none'}")
    out.append(f"- **Observer (who the guarantee holds against):** {privacy.get('observer', '—')}")
    out.append(f"- **Mechanism:** {privacy.get('mechanism', '—')}")
    if privacy.get("per_upload_amplification"):
        out.append(f"- **Per-upload amplification (the epsilons below depend on it):** "
                   f"{privacy['per_upload_amplification']}")
    sa = privacy.get("secure_aggregation")
    if isinstance(sa, dict):
        out.append(f"- **Secure aggregation:** {sa.get('protocol')}; threshold {sa.get('threshold')}, "
                   f"{sa.get('ring_bits')}-bit ring with {sa.get('frac_bits')} fractional bits, simulated dropout "
                   f"{sa.get('dropout')}. Threat model: {sa.get('threat_model')}. {sa.get('discretisation')}.")
    out += _adaptive_lines(privacy.get("adaptive_clipping"))
    acc = privacy.get("accountant")
    out.append(f"- **Accountant:** {_ACCOUNTANT_WORDS.get(str(acc), acc) if acc is not None else 'none'}")
    if isinstance(privacy.get("prv"), dict) and privacy["prv"].get("epsilon_lower") is not None:
        prv = privacy["prv"]
        out.append(f"- **PRV error bars:** the true ε lies in [lower, upper] with ε error {_fmt_eps(prv['eps_error'])} "
                   f"and δ error {prv['delta_error_fraction']:g} × δ; lower bounds {_fmt_eps(prv['epsilon_lower'][0])}"
                   f"–{_fmt_eps(prv['epsilon_lower'][1])}, estimates {_fmt_eps(prv['epsilon_estimate'][0])}–"
                   f"{_fmt_eps(prv['epsilon_estimate'][1])}, reported upper bounds {_fmt_eps(prv['epsilon_upper'][0])}–"
                   f"{_fmt_eps(prv['epsilon_upper'][1])}")
    out.append(f"- **Client sampling:** {_client_sampling_words(privacy.get('client_sampling'))}")
    ls = privacy.get("local_sampling")
    out.append(f"- **Local sampling:** {_LOCAL_SAMPLING_WORDS.get(str(ls), ls) if ls is not None else '—'}")
    out += _calibration_lines(privacy)
    if accounted:
        clients = privacy.get("clients") or []
        key = "epsilon_guarantee" if clients and "epsilon_guarantee" in clients[0] else "epsilon_spent"
        spent = [(c.get("client"), c.get(key), c.get("epsilon_budget"))
                 for c in clients if as_number(c.get(key)) is not None]
        if spent:
            cid, eps, budget = max(spent, key=lambda t: as_number(t[1]))  # type: ignore[arg-type,return-value]
            out.append(f"- **The run's guarantee (largest over clients):** ε = {_fmt_eps(eps)} (client {cid}, budget "
                       f"{_fmt_eps(budget)})")
        out += _guarantee_lines(privacy.get("guarantee"))
        if as_number(privacy.get("eps_per_participation")) is not None:
            out.append(f"- **One participation costs at most:** ε = {_fmt_eps(privacy['eps_per_participation'])}; "
                       f"composed over the run: mean {_fmt_eps(privacy.get('eps_total_mean'))}, "
                       f"max {_fmt_eps(privacy.get('eps_total_max'))}. "
                       "**No user-level guarantee** (sample-level DP only).")
        view = privacy.get("aggregate_view")
        if isinstance(view, Mapping):
            out.append(f"- **Aggregate view (NOT the guarantee against this run's server):** client-level "
                       f"ε = {_fmt_eps(view.get('epsilon'))} at δ = {_fmt_g(view.get('delta'))} "
                       f"({view.get('relation')}, multiplier {_fmt_g(view.get('noise_multiplier'))} on the sum, "
                       f"client rate {_fmt_g(view.get('sample_rate'))}, {view.get('rounds')} rounds), valid only for "
                       f"{view.get('valid_for')}" + (f". {view['population']}" if view.get("population") else ""))
        out += _fdp_lines(privacy.get("fdp"))
        out += _stage_lines(privacy.get("stage"))
        out.append("")
        out.append("Every spent epsilon and guarantee here is the one the accountant computed for the run as it ran "
                   "(privacy.json, metrics.jsonl); the values labelled as budgets, plans, heuristics or other "
                   "observers' views are what their labels say. Whatever the server does with the noisy uploads "
                   "(aggregation, projection, denoising) is post-processing and does not change the guarantee; "
                   "it is not re-accounted.")
    return out


def _adaptive_lines(block: Any) -> list[str]:
    """privacy.json's `adaptive_clipping` block (client level): the clip's settings and trajectory, and the noise
    split of Theorem 1 (the count's sigma_b and the sum's z_Delta, together the charged z)."""
    if not isinstance(block, Mapping) or block.get("level") != "client":
        return []
    b = {k: _fmt_g(v) for k, v in block.items() if not isinstance(v, str)}
    return [f"- **Adaptive clipping (client level, Andrew et al. 2021):** the clip starts at "
            f"{b.get('initial_clip')} and follows the {b.get('target_quantile')}-quantile of "
            f"the update norms (learning rate {b.get('learning_rate')}); it ranged over "
            f"[{b.get('clip_min')}, {b.get('clip_max')}], last {b.get('clip_last')}. "
            f"The count is noised with sigma_b = {b.get('count_noise')} and the sum with z_Delta = "
            f"{b.get('update_noise_multiplier')} times the clip: together one Gaussian mechanism with "
            f"z = {b.get('noise_multiplier')} (Theorem 1), which is what the accountant charges."]


def _guarantee_lines(guarantee: Any) -> list[str]:
    """Which epsilon is the guarantee, and why every other epsilon privacy.json holds differs from it."""
    if not isinstance(guarantee, Mapping):
        return []
    out = [f"  - it is {guarantee.get('source')}"]
    for other in guarantee.get("other_epsilons") or []:
        out.append(f"  - also computed, NOT the guarantee: `{other.get('field')}` (largest "
                   f"{_fmt_eps(other.get('epsilon_max'))}): {other.get('why_it_differs')}")
    return out


def _stage_lines(stage: Any) -> list[str]:
    """A stage with releases of its own (R-DPCFL's private selections): what is released, the adjacency, the plan."""
    if not isinstance(stage, Mapping):
        return []
    out = [f"- **Releases accounted (every one on the client's ledger):** {stage.get('releases')}",
           f"- **Adjacency:** {stage.get('adjacency')}; post-processing: {stage.get('post_processing')}"]
    plan = stage.get("plan")
    if isinstance(plan, Mapping):
        out.append(f"- **Plan:** eps_sel = {_fmt_g(plan.get('eps_sel'))} per selection, {plan.get('n_sel_planned')} "
                   f"planned ({stage.get('selections_made')} made), split {plan.get('split')}, conversion "
                   f"{plan.get('conversion')}, planned ε at most {_fmt_eps(plan.get('planned_epsilon_max'))}; "
                   f"{plan.get('noise_grid')}")
    if stage.get("degraded_to_global"):
        out.append(f"- **Note:** {stage['degraded_to_global']}")
    return out


def _fdp_lines(fdp: Any) -> list[str]:
    """Noisy-FedAvg/FedProx: the f-DP guarantee per bound for the worst client, the threat model, the paper's claim
    labelled as NOT a guarantee."""
    if not isinstance(fdp, Mapping) or not fdp.get("clients"):
        return []
    worst = max(fdp["clients"], key=lambda c: as_number(c.get("mu")) or 0.0)
    eps = ", ".join(f"ε = {_fmt_eps(v)} at δ = {_fmt_g(float(d))}" for d, v in (worst.get("epsilon") or {}).items())
    out = [f"- **f-DP guarantee (Gaussian DP, exact conversion):** μ = {_fmt_g(worst.get('mu'))}, {eps} "
           f"(bound: {worst.get('headline')}; client {worst.get('client')}, {worst.get('rounds_participated')} rounds "
           "taken part in)",
           f"- **f-DP view:** {fdp.get('view_meaning')}; release: {fdp.get('release_meaning')}"]
    for name, b in (worst.get("bounds") or {}).items():
        out.append(f"  - {(fdp.get('labels') or {}).get(name, name)}: μ = {_fmt_g(b.get('mu'))}")
    for a in fdp.get("assumptions") or []:
        out.append(f"  - assumption: {a}")
    for w in fdp.get("warnings") or []:
        out.append(f"  - warning: {w}")
    claimed = fdp.get("paper_claimed")
    if isinstance(claimed, Mapping):
        out.append(f"- **{claimed.get('label')}:** μ = {_fmt_g(claimed.get('mu'))} ({claimed.get('setting')}); shown "
                   "for comparison only, see docs/fdp.md for why it is not a valid guarantee")
    return out


def _calibration_lines(privacy: Mapping[str, Any]) -> list[str]:
    """How the noise was chosen, and who told the server what: heuristic and misreports are labelled."""
    out = []
    if privacy.get("oracle"):
        out.append("- **Oracle run:** the aggregator read the clients' true noise multipliers (privileged); it is an "
                   "upper reference, not a method a real server could run")
    calibration, target = privacy.get("calibration"), privacy.get("calibrated_to")
    planned = privacy.get("noise_calibration")
    if calibration == "pfa-heuristic":
        out.append("- **Noise calibration:** PFA's heuristic formula — **not a DP guarantee**. "
                   f"{privacy.get('heuristic', '')}")
    elif isinstance(planned, Mapping):
        out.append(f"- **Noise calibration:** {planned.get('what')}, by bisection against the "
                   f"{planned.get('accountant')} accountant (the target is never exceeded), planned for "
                   f"{planned.get('participation_meaning')}")
    elif calibration is not None:
        out.append("- **Noise calibration:** bisection against the accountant (the target is never exceeded)")
    elif privacy.get("accounted"):
        out.append("- **Noise:** given in the config, not calibrated from the budgets")
    if target not in (None, "own"):
        words = {"min": "the smallest reported epsilon (Minimum-ε)", "max": "the largest reported epsilon (Maximum-ε)"}
        out.append(f"- **Calibrated to:** {words.get(str(target), f'epsilon {target}')} for every client")
    hint = early_stop_hint(privacy.get("stop_reason"), dict(privacy))
    if hint:
        out.append(f"- **Early stop:** {hint}")
    if "meets_budgets" in privacy:
        out.append(f"- **Every client within its budget:** {'yes' if privacy['meets_budgets'] else '**no**'}")
    liars = [c for c in privacy.get("clients") or []
             if c.get("epsilon_reported") is not None and c.get("epsilon_reported") != c.get("epsilon_budget")]
    if liars:
        out.append("- **Misreported budgets** (the server saw the reported value; "
                   "noise and accounting use the true one): "
                   + ", ".join(f"client {c['client']} reported {_fmt_eps(c['epsilon_reported'])} "
                               f"(true {_fmt_eps(c['epsilon_budget'])})" for c in liars[:10]))
    return out


def _client_sampling_words(cs: Any) -> str:
    if not isinstance(cs, Mapping):
        return "—"
    kind = cs.get("kind")
    if kind == "all":
        return "all eligible clients take part in every round"
    if kind == "fixed":
        return (f"k = {cs.get('k')} clients per round, drawn uniformly without replacement among the clients "
                "still within budget")
    if kind == "poisson":
        return f"Poisson: each eligible client takes part independently with probability q = {cs.get('rate')}"
    return f"{kind} (k = {cs.get('k')}, rate = {cs.get('rate')})"


_CLIENT_HEADER = ["client", "ε budget", "δ", "noise multiplier", "spent ε", "records", "batch size"]
_CLIENT_RIGHT = [True] * len(_CLIENT_HEADER)


def _client_row(c: Mapping[str, Any]) -> list[str]:
    row = [_fmt_int(c.get("client")), _fmt_eps(c.get("epsilon_budget")), _fmt_g(c.get("delta"), 3),
           _fmt_g(c.get("noise_multiplier")), _fmt_eps(c.get("epsilon_spent")), _fmt_int(c.get("records")),
           _fmt_int(c.get("batch_size"))]
    if "epsilon_heuristic" in c:
        row.append(_fmt_eps(c["epsilon_heuristic"]))
    return row


def _client_header(clients: Sequence[Mapping[str, Any]]) -> list[str]:
    """The standard columns, plus the heuristic's claimed epsilon when the run used it (labelled)."""
    if clients and "epsilon_heuristic" in clients[0]:
        return [*_CLIENT_HEADER, "heuristic ε (not a guarantee)"]
    return list(_CLIENT_HEADER)


def _clients_lines(privacy: Mapping[str, Any] | None) -> list[str]:
    if privacy is None or not privacy.get("accounted"):
        return []
    clients = privacy.get("clients") or []
    out = ["", "## Per-client privacy", ""]
    population = privacy.get("clients_summary")
    if not clients and isinstance(population, Mapping):  # above PER_CLIENT_LIMIT clients (docs/scale.md)
        out.append(f"{population.get('clients')} clients in {population.get('classes_count')} classes of alike "
                   "clients (privacy.json `clients_summary`: each class once, with its size and first client).")
        classes = population.get("classes") or []
        if classes:
            out.append("")
            out += _table(["clients", "first client", *_CLIENT_HEADER[1:]],
                          [[str(c.get("clients")), *_client_row({k: v for k, v in c.items() if k != "epsilon_heuristic"}
                                                              | {"client": c.get("first_client")})]
                           for c in classes[:FULL_TABLE_MAX_CLIENTS]], [True] * (len(_CLIENT_HEADER) + 1))
        return out
    if not clients:
        out.append("privacy.json lists no clients.")
        return out
    header = _client_header(clients)
    right = [True] * len(header)
    if len(clients) <= FULL_TABLE_MAX_CLIENTS:
        out += _table(header, [_client_row(c) for c in clients], right)
        return out
    out.append(f"{len(clients)} clients: min / median / max over clients (the median is the lower median, "
               "one of the clients' own values), then the first "
               f"{TABLE_HEAD_ROWS} clients. The full table is in privacy.json.")
    out.append("")
    keys = [("epsilon_budget", _fmt_eps), ("delta", lambda v: _fmt_g(v, 3)), ("noise_multiplier", _fmt_g),
            ("epsilon_spent", _fmt_eps), ("records", _fmt_int), ("batch_size", _fmt_int)]
    stats_rows = []
    for label in ("min", "median", "max"):
        row = [label]
        for key, fmt in keys:
            vals = sorted((c.get(key) for c in clients if as_number(c.get(key)) is not None), key=as_number)
            if not vals:
                row.append("—")
                continue
            row.append(fmt(vals[0] if label == "min" else vals[-1] if label == "max" else vals[(len(vals) - 1) // 2]))
        stats_rows.append(row)
    out += _table(["", *_CLIENT_HEADER[1:]], stats_rows, [False] + _CLIENT_RIGHT[1:])
    out.append("")
    out.append(f"First {TABLE_HEAD_ROWS} of {len(clients)} clients:")
    out.append("")
    out += _table(header, [_client_row(c) for c in clients[:TABLE_HEAD_ROWS]], right)
    return out


def _plot_lines(made: Mapping[str, Path | None], metrics: Sequence[Mapping[str, Any]],
                privacy: Mapping[str, Any] | None) -> list[str]:
    out = ["", "## Plots", ""]
    unaccounted = privacy is not None and not privacy.get("accounted")
    if made.get("accuracy"):
        out += [f"![Test accuracy per round]({PLOTS_DIR}/{PLOT_FILES['accuracy']})", ""]
    else:
        out += ["No accuracy plot: no round has been evaluated (test_accuracy is null or absent in every row).", ""]
    if made.get("epsilon"):
        out += [f"![Spent epsilon per client vs round]({PLOTS_DIR}/{PLOT_FILES['epsilon']})", ""]
    elif unaccounted:
        out += ["No epsilon plot: the run is not accounted, so no epsilon is reported.", ""]
    else:
        out += ["No epsilon plot: no round with spent epsilon has been recorded in metrics.jsonl.", ""]
    if made.get("budget_vs_spent"):
        out += [f"![Epsilon budget vs spent epsilon per client]({PLOTS_DIR}/{PLOT_FILES['budget_vs_spent']})", ""]
    elif privacy is None:
        out += [f"No budget-vs-spent plot: {PRIVACY_FILE} has not been written yet.", ""]
    elif unaccounted:
        out += ["No budget-vs-spent plot: the run is not accounted, so no epsilon is reported.", ""]
    else:
        out += ["No budget-vs-spent plot: no client has both a finite budget and a finite spent epsilon.", ""]
    if made.get("clip"):  # no sentence otherwise: a fixed clip has no trajectory
        out += [f"![Adaptive clip per round]({PLOTS_DIR}/{PLOT_FILES['clip']})", ""]
    return out


def _config_lines(config_text: str | None) -> list[str]:
    out = ["## Configuration", ""]
    if config_text is None:
        out.append(f"`{CONFIG_FILE}` is missing from the run directory.")
        return out
    fence = "```"
    while fence in config_text:
        fence += "`"
    out += ["<details><summary>Resolved config (config.yaml)</summary>", "", f"{fence}yaml",
            config_text.rstrip("\n"), fence, "", "</details>"]
    return out


def _cpu(e: Mapping[str, Any]) -> str:
    """"model (AVX512)"; "n/a" for an execution recorded before dpfl noted the CPU."""
    model, kernels = e.get("cpu_model"), e.get("cpu_capability")
    if model is None and kernels is None:
        return "n/a"
    return f"{model or 'unknown model'}" + (f" ({kernels})" if kernels else "")


def _environment_lines(executions: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per execution (fresh start, then each resume), and a warning when what changes results changed."""
    out = ["## Environment", ""]
    if not executions:
        return out + [f"No `{ENVIRONMENT_FILE}`: this run was made by a dpfl version that did not record it.", ""]
    rows = [[str(e.get("started_round")), str(e.get("when")), str(e.get("dpfl")),
             "n/a" if e.get("source_commit") is None else
             str(e["source_commit"])[:10] + (" (modified)" if e.get("source_modified") else ""),
             str(e.get("torch")), str(e.get("numpy")), str(e.get("torch_threads")), _cpu(e)] for e in executions]
    out += ["| from round | started (UTC) | dpfl | source commit | torch | numpy | torch threads | CPU (kernels) |",
            "|---|---|---|---|---|---|---|---|"] + ["| " + " | ".join(r) + " |" for r in rows] + [""]
    first = executions[0].get("started_round")
    if isinstance(first, int) and first > 0:
        out += [f"Rounds 1-{first} were run by a dpfl version that did not record its environment.", ""]
    unknown = unrecorded_keys(list(executions))
    if unknown:
        out += [f"Not recorded by every execution (an older dpfl): {', '.join(unknown)}; whether they changed on "
                "resume is unknown.", ""]
    changed = changed_keys(list(executions))
    if changed:
        out += [f"**Resumed under another {', '.join(changed)}**: the rounds after the change may differ (at least in "
                "float rounding) from one uninterrupted execution.", ""]
    return out


# ---------------------------------------------------------------------------------------- entry point
def write_report(run_dir: str | os.PathLike[str]) -> Path:
    """Rewrite ``plots/*.png`` and ``report.md`` of ``run_dir`` from its files; returns the report path.

    Needs ``metrics.jsonl``; a complete run (``summary.json`` present) also needs ``privacy.json``. An
    incomplete run without ``privacy.json`` yet gets a report that says so. Raises :class:`RunDirError`
    for a directory that is not a dpfl run or a corrupt file.
    """
    d = Path(run_dir)
    metrics = read_metrics(d)
    summary = read_summary(d)
    if (d / PRIVACY_FILE).exists() or summary is not None:
        privacy: dict[str, Any] | None = read_privacy(d)
    else:
        privacy = None
    try:
        config_text: str | None = read_config_text(d)
    except RunDirError:
        if (d / CONFIG_FILE).exists():
            raise
        config_text = None
    executions = read_environment(d)  # read (and checked) before anything is written
    name = str(summary.get("name")) if summary is not None and summary.get("name") else d.resolve().name

    made = write_plots(d, metrics, privacy)
    lines = _status_lines(name, metrics, summary, privacy)
    lines += _privacy_lines(privacy, metrics, summary is not None)
    lines += _clients_lines(privacy)
    lines += _plot_lines(made, metrics, privacy)
    lines += _environment_lines(executions)
    lines += _config_lines(config_text)
    return write_text_atomic(d / REPORT_FILE, "\n".join(lines) + "\n")

"""What a finished run prints: its summary line, then the guarantee and a per-client privacy table.

Kept out of the CLI so that any front end (``dpfl run``, ``dpfl demo``, a notebook, a script) shows a run
the same way, from the run directory's own files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from rich.console import Console
from rich.table import Table

from dpfl.results.mpdp_outcome import stated_guarantee_lines
from dpfl.results.formatting import format_epsilon
from dpfl.results.run_files import PRIVACY_FILE, REPORT_FILE, RunDirError, read_privacy, read_summary

__all__ = ["MAX_CLIENT_ROWS", "early_stop_hint", "print_outcome"]

MAX_CLIENT_ROWS = 50  # the rest is in privacy.json: a terminal is no place for 10,000 rows


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def early_stop_hint(stop_reason: Any, privacy: dict[str, Any]) -> str | None:
    """Why a run stopped before its last round (budgets, divergence), and the setting that avoids it (if there is
    one)."""
    if stop_reason == "diverged":
        return ("stopped: the model's parameters or its test loss became NaN or infinite (the row marked `diverged` "
                "in metrics.jsonl); lower training.optimizer.lr or privacy.clip")
    if stop_reason != "budget":
        return None
    planned = privacy.get("noise_calibration") or {}
    if planned.get("participation") == "expected":
        return ("stopped early on budgets: the noise was planned for the expected participation, and clients drawn "
                "more often reached their budgets; privacy.participation: worst_case plans for every round (more "
                "noise, no early stop)")
    return "stopped early on budgets: too few clients could afford another round"


def _print_classes(summary: dict[str, Any], console: Console) -> None:
    """privacy.json's `clients_summary`: one row per class of alike clients (its size and first client), or each
    field's range where the classes are too many to list."""
    console.print(f"{summary.get('clients', '?')} clients in {summary.get('classes_count', '?')} classes of alike "
                  f"clients (privacy.json `clients_summary`)", markup=False, highlight=False)
    classes = summary.get("classes")
    if classes is None:
        for field, span in (summary.get("range") or {}).items():
            if span is not None:  # None: a field without values (no noise in a non-private run)
                console.print(f"  {field}: {span[0]:.4g} to {span[1]:.4g}", markup=False, highlight=False)
        return
    table = Table("clients", "first client", "records", "budget ε", "δ", "noise z", "spent ε")
    for c in classes[:MAX_CLIENT_ROWS]:
        z = c.get("noise_multiplier")
        table.add_row(str(c["clients"]), str(c["first_client"]), str(c["records"]), format_epsilon(c["epsilon_budget"]),
                      f"{c['delta']:.0e}", "-" if z is None else f"{z:.3f}", format_epsilon(c["epsilon_spent"]))
    console.print(table)
    if len(classes) > MAX_CLIENT_ROWS:
        console.print(f"... {len(classes) - MAX_CLIENT_ROWS} more classes in {PRIVACY_FILE}")


def print_outcome(run_dir: str | os.PathLike[str], console: Console,
                  summary: Optional[dict[str, Any]] = None) -> None:
    """Print a finished run to ``console``: name, rounds, stop reason and accuracy; then, for an accounted run,
    the guarantee (unit, observer, mechanism, accountant), each client's budget and spend and the f-DP headline;
    for a non-private run, its warning; then where the run directory and report are.

    ``summary`` is the run's summary (what ``execute`` returned); by default it is read from summary.json.
    """
    out = Path(run_dir)
    if summary is None:
        summary = read_summary(out)
        if summary is None:
            raise RunDirError(out, "has no summary.json: the run did not finish")
    privacy = read_privacy(out)
    console.print(f"\n[bold]{summary.get('name', out.name)}[/]: {summary['rounds_done']} rounds "
                  f"(stop: {summary['stop_reason']}), final accuracy {_fmt(summary.get('final_accuracy'))}, "
                  f"best {_fmt(summary.get('best_accuracy'))}")
    if summary.get("final_personal_accuracy") is not None:  # the method's metric: say which number is which
        console.print(f"personalised accuracy {_fmt(summary['final_personal_accuracy'])}: each client's own model on "
                      "its own test split (this method's metric); the accuracies above are the server's model's",
                      markup=False, highlight=False)
    hint = early_stop_hint(summary.get("stop_reason"), privacy)
    if hint:
        console.print(hint, markup=False, highlight=False)
    if privacy.get("accounted"):
        if privacy.get("warning"):  # e.g. NOT PRIVATE AS PROMISED: shown before any epsilon
            console.print(f"WARNING: {privacy['warning']}", markup=False, highlight=False)
        console.print(f"guarantee: {privacy['unit']}-level DP against {privacy['observer']}; "
                      f"{privacy['mechanism']}; accountant {privacy['accountant']}", highlight=False)
        if privacy.get("heuristic"):
            console.print(f"calibration: {privacy['heuristic']}", markup=False, highlight=False)
        if privacy.get("per_upload_amplification"):
            console.print(f"  per-upload amplification {privacy['per_upload_amplification']}", markup=False,
                          highlight=False)
        clients = privacy.get("clients")
        if clients is None:  # a population (docs/scale.md): its classes of alike clients
            _print_classes(privacy.get("clients_summary") or {}, console)
            clients = []
        # the guarantee column only where it is not the ledger's spent epsilon (Noisy-FedAvg/FedProx's f-DP bound)
        both = any(c.get("epsilon_guarantee", c["epsilon_spent"]) != c["epsilon_spent"] for c in clients)
        table = Table("client", "records", "budget ε", "δ", "noise z", "spent ε", *(["guarantee ε"] if both else []))
        for c in clients[:MAX_CLIENT_ROWS]:
            z = c.get("noise_multiplier")
            table.add_row(str(c["client"]), str(c["records"]), format_epsilon(c["epsilon_budget"]), f"{c['delta']:.0e}",
                          "-" if z is None else f"{z:.3f}", format_epsilon(c["epsilon_spent"]),
                          *([format_epsilon(c["epsilon_guarantee"])] if both else []))
        if clients:
            console.print(table)
        guarantee = privacy.get("guarantee")
        if guarantee:
            console.print(f"the run's guarantee: epsilon <= {guarantee['epsilon_max']:.4g} for every client (each at "
                          f"its own budget's delta); it is {guarantee['source']}", markup=False, highlight=False)
            for other in guarantee.get("other_epsilons") or []:
                console.print(f"  also computed, not the guarantee: {other['field']} (largest "
                              f"{other['epsilon_max']:.4g}): {other['why_it_differs']}", markup=False, highlight=False)
        if len(clients) > MAX_CLIENT_ROWS:
            console.print(f"... {len(clients) - MAX_CLIENT_ROWS} more clients in {PRIVACY_FILE}")
        fdp = privacy.get("fdp")
        if fdp and fdp.get("clients"):
            eps = ", ".join(f"epsilon {v:.4g} at delta {d}" for d, v in fdp["epsilon_max"].items())
            assumed = (f"; holds only if the loss is L-smooth with the ASSUMED L = {fdp['params']['smoothness_L']:g}"
                       if fdp["headline"] == "shifted-interpolation" else "")
            console.print(f"f-DP ({fdp['view']} view, release {fdp['release']}): largest mu {fdp['mu_max']:.4g}, "
                          f"{eps} (bound: {fdp['headline']}, exact GDP conversion{assumed})", markup=False,
                          highlight=False)
            if fdp.get("paper_claimed"):
                console.print(f"{fdp['paper_claimed']['label']}: mu {fdp['paper_claimed']['mu']:.4g}", markup=False,
                              highlight=False)
    else:
        stated = stated_guarantee_lines(privacy, summary["rounds_done"])  # MP-DP's family: the method's statement
        for line in stated or [f"privacy: {privacy.get('warning', 'not private: no epsilon is reported')}"]:
            console.print(line, markup=False, highlight=False)
    if summary.get("backend"):
        console.print(backend_line(summary["backend"]), markup=False, highlight=False)
    console.print(f"run directory: {out}  (report: {out / REPORT_FILE})")


def backend_line(backend: dict[str, Any]) -> str:
    """Where the run's local training ran (summary.json `backend`), e.g. `backend: ray, 2 actors x 1 thread on a Ray
    this run started on 127.0.0.1 (usage statistics off)`."""
    name = backend.get("name", "?")
    if name == "local":
        return "backend: local (the whole cohort in this process)"
    if name != "ray":
        return f"backend: {name}"
    actors, threads = backend.get("actors"), backend.get("threads_per_actor")
    text = f"backend: ray, {actors} actor{'s' * (actors != 1)} x {threads} thread{'s' * (threads != 1)}"
    where = {"started": f"on a Ray this run started on {backend.get('node_address')}",
             "joined": f"on the Ray cluster at {backend.get('address')} (node {backend.get('node_address')})",
             "running": f"on the Ray already running in this process (node {backend.get('node_address')})"}
    if backend.get("ray") in where:
        text += f" {where[backend['ray']]} (usage statistics {'on' if backend.get('usage_stats') else 'off'})"
    if backend.get("actor_restarts"):
        text += f"; {backend['actor_restarts']} shard(s) retried on a new actor"
    return text

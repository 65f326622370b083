"""Compare several run directories: one summary row per run and an accuracy-vs-round plot.

Where the comparison plot goes: ``out/compare_accuracy.png`` when ``out`` is given, otherwise in the
parent directory of the first run (runs of one study usually sit side by side, e.g. ``runs/a``,
``runs/b`` -> ``runs/compare_accuracy.png``). Never the current working directory implicitly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpfl.results.formatting import format_epsilon
from dpfl.results.plots import plot_compare
from dpfl.results.run_files import (CONFIG_FILE, PRIVACY_FILE, as_float, as_number, last_number, read_config_text,
                                    read_metrics, read_privacy, read_summary)

__all__ = ["COMPARE_PLOT", "COLUMNS", "compare_runs", "run_row", "format_table", "table_columns"]

COMPARE_PLOT = "compare_accuracy.png"
COLUMNS = ["name", "algorithm", "unit", "final_accuracy", "best_accuracy", "rounds_done", "stop_reason",
           "epsilon_max"]
INCOMPLETE = "incomplete"
PERSONAL = "personal_accuracy"  # the last acc_personal: the metric of methods whose clients use personal models


def table_columns(rows: Sequence[Mapping[str, Any]], labelled: bool = False) -> list[str]:
    """The columns of a comparison table: COLUMNS, with `personal_accuracy` after best_accuracy when a run has one
    (its final_accuracy is then the server's model's, which its clients do not use), and `label` first if given."""
    cols = list(COLUMNS)
    if any(r.get(PERSONAL) is not None for r in rows):
        cols.insert(cols.index("best_accuracy") + 1, PERSONAL)
    return ["label", *cols] if labelled else cols


def run_row(run_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The comparison row of one run and its metrics rows.

    Row keys: :data:`COLUMNS` plus ``personal_accuracy`` (the last ``acc_personal`` in metrics.jsonl, None
    for methods without personal models), ``complete`` (bool) and ``run_dir`` (str). A complete run's values
    come from summary.json (epsilon_max: summary, else the largest ``epsilon_spent`` in privacy.json);
    an incomplete run's from what is there: last evaluated and best accuracy in metrics.jsonl, rounds
    recorded, stop_reason ``"incomplete"``, epsilon_max of the last metrics row.

    A damaged file of the run (``config.yaml`` included, although no column comes from it) is a
    :class:`~dpfl.results.run_files.RunDirError` naming it: a damaged run is reported, never compared.
    """
    d = Path(run_dir)
    metrics = read_metrics(d)
    summary = read_summary(d)
    privacy = read_privacy(d) if (d / PRIVACY_FILE).exists() or summary is not None else None
    if (d / CONFIG_FILE).exists():
        read_config_text(d)  # checked only: a cut or garbled config.yaml means the directory is damaged
    evaluated = [(r["round"], as_number(r.get("test_accuracy"))) for r in metrics]
    evaluated = [(r, a) for r, a in evaluated if a is not None]
    row: dict[str, Any] = {
        "name": (summary or {}).get("name") or d.resolve().name,
        "algorithm": (privacy or {}).get("algorithm"),
        "unit": (privacy or {}).get("unit"),
        "complete": summary is not None,
        "run_dir": str(d),
        PERSONAL: last_number(metrics, "acc_personal"),
    }
    if summary is not None:
        row["final_accuracy"] = summary.get("final_accuracy")
        row["best_accuracy"] = summary.get("best_accuracy")
        row["rounds_done"] = summary.get("rounds_done", len(metrics))
        row["stop_reason"] = summary.get("stop_reason")
        eps = summary.get("epsilon_max")
        if eps is None and privacy is not None and privacy.get("accounted"):
            spent = [c.get("epsilon_spent") for c in privacy.get("clients") or []
                     if as_number(c.get("epsilon_spent")) is not None]
            eps = max(spent, key=as_number) if spent else None  # type: ignore[arg-type]
    else:
        row["final_accuracy"] = evaluated[-1][1] if evaluated else None
        row["best_accuracy"] = max(a for _, a in evaluated) if evaluated else None
        row["rounds_done"] = len(metrics)
        row["stop_reason"] = INCOMPLETE
        eps_rows = [r for r in metrics if r.get("epsilon_max") is not None]
        eps = eps_rows[-1]["epsilon_max"] if eps_rows else None
    if privacy is not None and not privacy.get("accounted"):
        eps = None  # an unaccounted run reports no epsilon, whatever a file says
    row["epsilon_max"] = eps
    return row, metrics


def compare_runs(run_dirs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str] | None = None, *,
                 labels: Sequence[str] | None = None, title: str | None = None
                 ) -> tuple[list[dict[str, Any]], Path | None]:
    """One row per run (see :func:`run_row`) and the accuracy comparison plot.

    The plot is written to ``out/compare_accuracy.png``; ``out`` defaults to the parent directory of
    the first run. Returns ``(rows, plot_path)``; ``plot_path`` is None (nothing written) when no run
    has an evaluated round. `labels` (one per run, in order, distinct) name the runs in the legend and
    in each row's ``label``. Without them the legend drops what long names share at both ends (grid runs
    differ in the middle) and runs sharing a name are told apart by their directory.
    `title` replaces the plot's default title.
    """
    dirs = [Path(p) for p in run_dirs]
    if not dirs:
        raise ValueError("compare_runs needs at least one run directory")
    if labels is not None:
        labels = [str(x) for x in labels]
        if len(labels) != len(dirs):
            raise ValueError(f"{len(labels)} label(s) for {len(dirs)} run directories: give one label per run")
        if any(not x.strip() for x in labels) or len(set(labels)) != len(labels):
            raise ValueError(f"labels must be non-empty and distinct, got {labels}")
    loaded = [run_row(d) for d in dirs]
    if labels is None:
        rows = [row for row, _ in loaded]
        names = _legend_names([str(row["name"]) for row in rows], dirs)
    else:
        rows = [{"label": label, **row} for label, (row, _) in zip(labels, loaded, strict=True)]
        names = labels
    runs = {name: _plotted(metrics) for name, (_, metrics) in zip(names, loaded, strict=True)}
    personal = any(row.get(PERSONAL) is not None for row in rows)
    out_dir = Path(out) if out is not None else dirs[0].resolve().parent
    out_dir.mkdir(parents=True, exist_ok=True)
    default = f"{'Accuracy' if personal else 'Test accuracy'} per round ({len(dirs)} runs" + (
        ", personal where a method has it)" if personal else ")")  # short: a longer title is cut at the sides
    plot = plot_compare(runs, out_dir / COMPARE_PLOT, title=title or default)
    return rows, plot


def _plotted(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run's rows as the plot reads them (`test_accuracy` per round): its `acc_personal` when it has one, the
    metric of a method whose clients use personal models (the server's model may sit near chance)."""
    if all(as_number(r.get("acc_personal")) is None for r in metrics):
        return metrics
    return [{"round": r["round"], "test_accuracy": r.get("acc_personal")} for r in metrics]


def _legend_names(names: Sequence[str], dirs: Sequence[Path]) -> list[str]:
    """The runs' names, those shared by several runs followed by their directory (and primes if still equal)."""
    out: list[str] = []
    for name, d in zip(names, dirs, strict=True):
        label = name if names.count(name) == 1 else f"{name} ({d.name})"
        while label in out:
            label += "'"
        out.append(label)
    return out


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in ("final_accuracy", "best_accuracy", PERSONAL):
        v = as_number(value)
        return "-" if v is None else f"{v:.4f}"
    if key == "epsilon_max":
        try:
            v = as_float(value)
        except ValueError:
            return str(value)
        return "-" if v is None else format_epsilon(v)
    return str(value)


_NUMERIC = {"final_accuracy", "best_accuracy", PERSONAL, "rounds_done", "epsilon_max"}


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    """A plain aligned text table (header, dashes, one line per row): text left-aligned, numbers
    right-aligned, missing values as ``-``, accuracies to 4 decimals and epsilon to 3."""
    cells = [[_cell(c, r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if c in _NUMERIC else v.ljust(w) for v, w, c in zip(values, widths, columns, strict=True)]
        return "  ".join(parts).rstrip()

    out = [line(list(columns)), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in cells]
    return "\n".join(out)

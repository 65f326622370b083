"""Plots of a run: accuracy, spent epsilon per client, budget vs spent, and a comparison of runs.

Every function takes the data as read by :mod:`dpfl.results.run_files` and a target path, writes an
800 x 500 px PNG (figsize (8, 5), dpi 100) atomically, and returns the path, or returns ``None``
without writing anything when there is nothing to plot (no evaluated round, a run that is not
accounted, no finite budget...). The caller says so in words.

Figures are built with ``matplotlib.figure.Figure`` directly, not pyplot: no GUI backend is ever
touched (the PNG is rendered by Agg), no global figure registry keeps them alive, and importing this
module does not change the backend of a user who also plots interactively.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from dpfl.results.run_files import as_float, write_bytes_atomic

__all__ = [
    "FIGSIZE",
    "DPI",
    "MAX_CLIENT_LINES",
    "plot_accuracy",
    "plot_epsilon",
    "plot_budget_vs_spent",
    "plot_compare",
    "plot_errorbars",
    "write_png",
]

FIGSIZE = (8, 5)
DPI = 100
MAX_CLIENT_LINES = 20  # above this, per-client plots show min / median / max instead of one line each
_ANNOTATE_MAX = 20
_LABEL_MAX = 25  # longer legend labels are shortened (the legend sits beside the axes)
_SEPARATORS = "-._/ "  # where a shared part of several run names may be cut


# ---------------------------------------------------------------------------------------- helpers
def _new_figure() -> tuple[Figure, Any]:
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_subplot(1, 1, 1)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    return fig, ax


def write_png(fig: Figure, path: str | os.PathLike[str], dpi: int = DPI) -> Path:
    """`fig` as a PNG at `path`, written atomically (no bbox_inches="tight": the size stays figsize x dpi); the
    figure is cleared. For figures built with ``Figure`` directly, which never touch pyplot's backend."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    fig.clear()
    return write_bytes_atomic(path, buf.getvalue())


def _save(fig: Figure, path: str | os.PathLike[str]) -> Path:
    return write_png(fig, path)


def _shared_prefix(names: Sequence[str]) -> int:
    """Length of the names' common prefix, cut back to just after a separator (so no token is split; a "."
    between two digits is a decimal point, not a separator)."""
    first = names[0]
    n = len(os.path.commonprefix(list(names)))
    while n > 0 and not _is_separator(first, n - 1):
        n -= 1
    return n


def _is_separator(text: str, i: int) -> bool:
    if text[i] not in _SEPARATORS:
        return False
    return not (text[i] == "." and 0 < i < len(text) - 1 and text[i - 1].isdigit() and text[i + 1].isdigit())


def _legend_labels(names: Sequence[str], max_len: int = _LABEL_MAX) -> list[str]:
    """Legend labels for `names` (distinct): when some are longer than `max_len` and there are several, the
    parts every name shares at its start and end (whole tokens) become "…", since grid runs differ in the
    middle ("fmnist-lenet5-m20-K10-T600-sg0.01.noisy_fedavg.seed0" and the same with sg0.1 become "…sg0.01…" and
    "…sg0.1…"); a label still too long is shortened in the middle."""
    labels = list(names)
    if len(labels) > 1 and any(len(x) > max_len for x in labels):
        head = _shared_prefix(labels)
        rest = [x[head:] for x in labels]
        tail = _shared_prefix([x[::-1] for x in rest])
        if head or tail:
            labels = [("…" if head else "") + x[: len(x) - tail] + ("…" if tail else "") for x in rest]
    half = max_len // 2
    return [x if len(x) <= max_len else x[: half - 1] + "…" + x[-half:] for x in labels]


def _nan(x: Any) -> float:
    """A plottable float: None, non-numbers and +-inf become NaN (matplotlib leaves a gap)."""
    try:
        v = as_float(x)
    except ValueError:
        return math.nan
    return v if v is not None and math.isfinite(v) else math.nan


def _colours(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _lower_median(a: np.ndarray, axis: int) -> np.ndarray:
    """The lower median (an actual value, never an average of two) ignoring NaN."""
    s = np.sort(a, axis=axis)  # NaN sorts last
    count = np.sum(~np.isnan(a), axis=axis)
    idx = np.clip((count - 1) // 2, 0, None)
    out = np.take_along_axis(s, np.expand_dims(idx, axis), axis=axis).squeeze(axis)
    return np.where(count > 0, out, np.nan)


def _accuracy_series(metrics: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[float]]:
    rounds, acc = [], []
    for row in metrics:
        a = _nan(row.get("test_accuracy"))
        if not math.isnan(a):
            rounds.append(int(row["round"]))
            acc.append(a)
    return rounds, acc


def _legend_outside(fig: Figure, ax: Any, handles: list[Any] | None = None, labels: list[str] | None = None) -> None:
    fig.subplots_adjust(left=0.08, right=0.71, top=0.9, bottom=0.11)
    kwargs: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "fontsize": "small",
                              "borderaxespad": 0.0}
    if handles is not None:
        ax.legend(handles, labels, **kwargs)
    else:
        ax.legend(**kwargs)


# ---------------------------------------------------------------------------------------- plots
def plot_accuracy(metrics: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *,
                  title: str | None = None) -> Path | None:
    """Test accuracy vs round (evaluated rounds only); the best round is marked. ``None`` if no round
    was evaluated."""
    rounds, acc = _accuracy_series(metrics)
    if not rounds:
        return None
    fig, ax = _new_figure()
    ax.plot(rounds, acc, marker="o" if len(rounds) <= 50 else None, markersize=4, label="test accuracy")
    best = int(np.argmax(acc))
    ax.plot([rounds[best]], [acc[best]], marker="*", markersize=14, color="tab:red", linestyle="none",
            label=f"best: {acc[best]:.4f} (round {rounds[best]})")
    if all(0.0 <= a <= 1.0 for a in acc):
        ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(title or "Test accuracy per round")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    return _save(fig, path)


def plot_epsilon(metrics: Sequence[Mapping[str, Any]], privacy: Mapping[str, Any] | None,
                 path: str | os.PathLike[str], *, title: str | None = None) -> Path | None:
    """Spent epsilon vs round, from the ``epsilon`` lists of ``metrics.jsonl``.

    Up to :data:`MAX_CLIENT_LINES` clients: one line per client, and the client's budget (from
    ``privacy["clients"]``) as a dotted level in the same colour. More clients: the min-max band and
    the (lower) median across clients, with the budget levels in grey. ``None`` when the run is not
    accounted (no ``epsilon`` in any row, or ``privacy["accounted"]`` is false).
    """
    if privacy is not None and not privacy.get("accounted", False):
        return None
    rows = [r for r in metrics if isinstance(r.get("epsilon"), list) and r["epsilon"]]
    if not rows:
        return None
    n = max(len(r["epsilon"]) for r in rows)
    rounds = np.array([int(r["round"]) for r in rows])
    eps = np.full((len(rows), n), np.nan)
    for i, r in enumerate(rows):
        eps[i, : len(r["epsilon"])] = [_nan(e) for e in r["epsilon"]]
    if np.all(np.isnan(eps)):
        return None
    budgets: dict[int, float] = {}
    for c in (privacy or {}).get("clients") or []:
        b = _nan(c.get("epsilon_budget"))
        if isinstance(c.get("client"), int) and not math.isnan(b):
            budgets[c["client"]] = b

    fig, ax = _new_figure()
    marker = "o" if len(rounds) <= 30 else None
    if n <= MAX_CLIENT_LINES:
        colours = _colours(n)
        for c in range(n):
            ax.plot(rounds, eps[:, c], color=colours[c], marker=marker, markersize=3, label=f"client {c}")
            if c in budgets:
                ax.axhline(budgets[c], color=colours[c], linestyle=":", linewidth=1.2)
        handles, labels = ax.get_legend_handles_labels()
        if budgets:
            handles.append(Line2D([], [], color="black", linestyle=":"))
            labels.append("budget (dotted)")
        _legend_outside(fig, ax, handles, labels)
        default_title = f"Spent epsilon per client ({n} clients)"
    else:
        lo, hi = np.nanmin(eps, axis=1), np.nanmax(eps, axis=1)
        med = _lower_median(eps, axis=1)
        ax.fill_between(rounds, lo, hi, alpha=0.25, color="tab:blue", label="min - max")
        ax.plot(rounds, hi, color="tab:blue", linewidth=0.8)
        ax.plot(rounds, lo, color="tab:blue", linewidth=0.8)
        ax.plot(rounds, med, color="tab:blue", linewidth=2.0, marker=marker, markersize=3, label="median client")
        levels = sorted(set(budgets.values()))
        if len(levels) > 5:
            levels = [levels[0], levels[-1]]
        for b in levels:
            ax.axhline(b, color="grey", linestyle=":", linewidth=1.2)
        handles, labels = ax.get_legend_handles_labels()
        if levels:
            handles.append(Line2D([], [], color="grey", linestyle=":"))
            labels.append("budget level(s)" if len(set(budgets.values())) <= 5 else "min / max budget")
        _legend_outside(fig, ax, handles, labels)
        default_title = f"Spent epsilon over {n} clients (min / median / max)"
    ax.set_ylim(bottom=0.0)
    ax.set_xlabel("round")
    ax.set_ylabel("spent epsilon")
    ax.set_title(title or default_title)
    return _save(fig, path)


def plot_budget_vs_spent(privacy: Mapping[str, Any], path: str | os.PathLike[str], *,
                         title: str | None = None) -> Path | None:
    """Scatter of each client's spent epsilon against its budget, with the line y = x (spent =
    budget). Client ids are annotated up to 20 clients. ``None`` when the run is not accounted or no
    client has a finite budget and spent epsilon."""
    if not privacy.get("accounted", False):
        return None
    pts = []
    for c in privacy.get("clients") or []:
        b, s = _nan(c.get("epsilon_budget")), _nan(c.get("epsilon_spent"))
        if not (math.isnan(b) or math.isnan(s)):
            pts.append((c.get("client"), b, s))
    if not pts:
        return None
    ids = [p[0] for p in pts]
    x = np.array([p[1] for p in pts])
    y = np.array([p[2] for p in pts])
    top = float(max(x.max(), y.max())) * 1.08 or 1.0
    fig, ax = _new_figure()
    ax.plot([0.0, top], [0.0, top], color="grey", linestyle="--", linewidth=1.0, label="y = x (spent = budget)")
    ax.scatter(x, y, s=28, color="tab:blue", alpha=0.8 if len(pts) <= 200 else 0.4, zorder=3,
               label=f"client ({len(pts)})")
    if len(pts) <= _ANNOTATE_MAX:
        for cid, xi, yi in zip(ids, x, y, strict=True):
            ax.annotate(str(cid), (xi, yi), textcoords="offset points", xytext=(4, 3), fontsize="x-small")
    ax.set_xlim(0.0, top)
    ax.set_ylim(0.0, top)
    ax.set_xlabel("epsilon budget")
    ax.set_ylabel("spent epsilon")
    ax.set_title(title or "Privacy budget vs spent epsilon per client")
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    return _save(fig, path)


def plot_compare(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: str | os.PathLike[str], *,
                 title: str | None = None) -> Path | None:
    """Test accuracy vs round of several runs (name -> metrics rows), one line each. Runs without an
    evaluated round are left out; ``None`` when no run has one."""
    series = {name: _accuracy_series(rows) for name, rows in runs.items()}
    series = {name: s for name, s in series.items() if s[0]}
    if not series:
        return None
    fig, ax = _new_figure()
    colours = _colours(len(series))
    longest = max(len(s[0]) for s in series.values())
    labels = _legend_labels(list(series))
    for (rounds, acc), colour, label in zip(series.values(), colours, labels, strict=True):
        ax.plot(rounds, acc, color=colour, marker="o" if longest <= 30 else None, markersize=3, label=label)
    if all(0.0 <= a <= 1.0 for _, acc in series.values() for a in acc):
        ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_title(title or f"Test accuracy per round ({len(series)} runs)")
    _legend_outside(fig, ax)
    return _save(fig, path)


def plot_errorbars(series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]],
                   path: str | os.PathLike[str], *, xlabel: str, ylabel: str, title: str) -> Path:
    """One line per name through (x, mean) with ± std bars (NaN std: no bar), e.g. accuracy against a grid
    parameter over seeds; the x ticks are the union of the xs."""
    fig, ax = _new_figure()
    for name, (xs, means, stds) in series.items():
        ax.errorbar(list(xs), list(means), yerr=[0.0 if math.isnan(s) else s for s in stds], marker="o",
                    capsize=3, label=name)
    ax.set_xticks(sorted({x for xs, _, _ in series.values() for x in xs}))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _legend_outside(fig, ax)
    return _save(fig, path)

"""Plot of an f-DP report (`dpfl privacy fdp --out`): μ and ε(δ) against the number of rounds T.

Built on ``matplotlib.figure.Figure`` (Agg, no pyplot), like :mod:`dpfl.results.plots`, so plotting never touches
a GUI backend. Rigorous bounds are solid lines; the paper-claimed curve is dashed and its legend carries
"paper-claimed (NOT a guarantee)", so a reader of the PNG alone cannot mistake it for a guarantee (spec §4.5).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from dpfl.privacy.fdp import PAPER_LABEL, FdpReport
from dpfl.results.run_files import write_bytes_atomic

__all__ = ["FIGSIZE", "DPI", "fdp_figure", "plot_fdp"]

FIGSIZE = (12, 5)  # two panels side by side
DPI = 100
_STYLE = {"composition": {"color": "tab:blue", "linewidth": 3.0, "alpha": 0.6},  # wide, so an equal shifted
          "shifted-interpolation": {"color": "tab:green", "linewidth": 1.5},  # curve drawn on top stays visible
          "paper-claimed": {"color": "tab:red", "linewidth": 1.5}}


def _legend_label(report: FdpReport, curve: Any) -> str:
    if not curve.is_guarantee:
        variant = report.params.get("paper_variant")
        return PAPER_LABEL + (f" [{variant}]" if variant else "")
    return curve.label + (" - headline" if curve.name == report.headline else "")


def fdp_figure(report: FdpReport, delta: float | None = None) -> Figure:
    """The two-panel figure (μ vs T, ε(δ) vs T, both log-x); `delta` defaults to the report's first δ."""
    delta = report.deltas[0] if delta is None else float(delta)
    if delta not in report.deltas:
        raise ValueError(f"δ = {delta:g} is not in the report (it has {', '.join(f'{d:g}' for d in report.deltas)})")
    rounds = np.asarray(report.rounds, dtype=np.float64)
    marker = "o" if rounds.size <= 30 else None
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax_mu, ax_eps = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for curve in report.curves:
        style = dict(_STYLE.get(curve.name, {"linewidth": 1.5}))
        style["linestyle"] = "-" if curve.is_guarantee else "--"  # the flag, not the name, decides
        label = _legend_label(report, curve)
        ax_mu.plot(rounds, curve.mu, marker=marker, markersize=3, label=label, **style)
        ax_eps.plot(rounds, curve.eps[delta], marker=marker, markersize=3, label=label, **style)
    for ax, ylabel in ((ax_mu, "μ (Gaussian DP)"), (ax_eps, f"ε at δ = {delta:g}")):
        ax.set_xscale("log")
        ax.set_xlabel("rounds T")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0.0)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
    p = report.params
    fig.suptitle(f"f-DP of noisy {p.get('algo')} ({p.get('schedule')} steps): view {report.view}, "
                 f"release {report.release}", fontsize="medium")
    fig.tight_layout()
    return fig


def plot_fdp(report: FdpReport, path: str | os.PathLike[str], delta: float | None = None) -> Path:
    """Write the figure of :func:`fdp_figure` as a PNG, atomically, and return its path."""
    fig = fdp_figure(report, delta)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    fig.clear()
    return write_bytes_atomic(path, buf.getvalue())

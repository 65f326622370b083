"""Plot of the empirical sensitivity experiment (`dpfl.reproduce.fdp_sensitivity`, spec fdp_accounting.md §7).

‖w_t − w′_t‖₂ against the round t on a log-y axis, one line per setting (algorithm / α, or a one-factor sweep),
averaged over seeds. Left panel: coupled runs (common random numbers), with the worst-case recursion
d_{t+1} = ρ_t d_t + γ_t dashed in the same colour where L was given. Right panel: independent noise (the recursion
does not bound it, so it is not drawn there). A bound that grows beyond 10³ × the largest measured distance leaves the
chart (a note gives its largest value), so the measured curves stay readable. Rounds at which the distance is exactly
0 (the changed record not yet sampled) have no point on a log axis; the control pair (𝒞 = 𝒞′), 0 at every round, is
stated in the caller's title.

Built on ``matplotlib.figure.Figure`` (Agg, no pyplot), like :mod:`dpfl.results.fdp_plot`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from dpfl.results.run_files import write_bytes_atomic

__all__ = ["DPI", "FIGSIZE", "mean_curves", "plot_sensitivity", "sensitivity_figure"]

FIGSIZE = (13, 5)
DPI = 100
BOUND_HEADROOM = 1e3  # the y axis stops at this multiple of the largest distance when a bound goes beyond it
PANELS = (("coupled", "coupled: common random numbers (bound dashed)"), ("independent", "independent noise"))


def _number(value: Any) -> float | None:
    if value is None or value == "":
        return None
    return float(value)


def mean_curves(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, np.ndarray | None]]:
    """{(setting, coupling): {"round", "distance", "bound"}}: per-round means over seeds, settings in first-seen order.

    `rows` are the experiment's CSV rows (keys setting, coupling, seed, round, distance, bound; numbers or strings).
    "bound" is None when no row of the curve has one.
    """
    acc: dict[tuple[str, str], dict[int, list[tuple[float, float | None]]]] = {}
    for row in rows:
        key = (str(row["setting"]), str(row["coupling"]))
        acc.setdefault(key, {}).setdefault(int(row["round"]), []).append(
            (float(row["distance"]), _number(row.get("bound"))))
    out: dict[tuple[str, str], dict[str, np.ndarray | None]] = {}
    for key, by_round in acc.items():
        rounds = np.array(sorted(by_round), dtype=np.int64)
        dist = np.array([np.mean([d for d, _ in by_round[r]]) for r in rounds])
        bounds = [[b for _, b in by_round[r]] for r in rounds]
        has_bound = all(b is not None for per in bounds for b in per)
        bound = np.array([np.mean(per) for per in bounds], dtype=np.float64) if has_bound else None
        out[key] = {"round": rounds, "distance": dist, "bound": bound}
    return out


def sensitivity_figure(rows: Iterable[Mapping[str, Any]], title: str | None = None) -> Figure:
    """The two-panel figure (coupled with bounds, independent) of the experiment's rows."""
    curves = mean_curves(rows)
    settings = list(dict.fromkeys(s for s, _ in curves))
    palette, size = ("tab10", 10) if len(settings) <= 10 else ("tab20", 20)
    colours = {s: colormaps[palette](i % size) for i, s in enumerate(settings)}
    couplings = [c for c, _ in PANELS if any(k[1] == c for k in curves)]
    fig = Figure(figsize=FIGSIZE if len(couplings) > 1 else (7, 5), dpi=DPI)
    for index, coupling in enumerate(couplings):
        ax = fig.add_subplot(1, len(couplings), index + 1)
        drawn, measured_max, bound_max = False, 0.0, 0.0
        for setting in settings:
            curve = curves.get((setting, coupling))
            if curve is None:
                continue
            rounds, dist = curve["round"], curve["distance"]
            assert rounds is not None and dist is not None
            positive = dist > 0
            if positive.any():
                ax.plot(rounds[positive], dist[positive], color=colours[setting], linewidth=1.5, label=setting)
                drawn, measured_max = True, max(measured_max, float(dist.max()))
            bound = curve["bound"]
            if coupling == "coupled" and bound is not None:
                ax.plot(rounds, bound, color=colours[setting], linewidth=1.0, linestyle="--",
                        label=f"{setting}: bound d_t")
                drawn, bound_max = True, max(bound_max, float(np.nanmax(bound)))
        if drawn:
            ax.set_yscale("log")
            if measured_max > 0 and bound_max > BOUND_HEADROOM * measured_max:  # keep the measured curves readable
                ax.set_ylim(top=BOUND_HEADROOM * measured_max)
                ax.text(0.02, 0.02, f"the bounds leave the chart (they reach {bound_max:.3g})", transform=ax.transAxes,
                        fontsize="small")
            ax.legend(loc="best", fontsize="x-small", ncol=2 if len(settings) > 6 else 1)
        ax.set_xlabel("round t")
        ax.set_ylabel("‖w_t − w′_t‖₂ (mean over seeds)")
        ax.set_title(dict(PANELS)[coupling], fontsize="medium")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title or "Empirical sensitivity: distance between models trained on neighbouring datasets",
                 fontsize="medium")
    fig.tight_layout()
    return fig


def plot_sensitivity(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str], title: str | None = None) -> Path:
    """Write the figure of :func:`sensitivity_figure` as a PNG, atomically, and return its path."""
    fig = sensitivity_figure(rows, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    fig.clear()
    return write_bytes_atomic(path, buf.getvalue())

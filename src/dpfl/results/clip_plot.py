"""The adaptive clip's trajectory (Andrew et al. 2021), from ``metrics.jsonl``: one figure, ``plots/clip.png``.

Client level: ``adaptive_clip``, the clip C_t the server step used in round t. Sample level: ``sample_clip_mean``,
``sample_clip_min`` and ``sample_clip_max``, the per-sample clips of the round's clients (their mean and range). A
run that has both gets both in the same figure; a run with neither gets no figure (``None``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from dpfl.results.plots import DPI, FIGSIZE, write_png
from dpfl.results.run_files import as_float

__all__ = ["CLIP_COLUMNS", "plot_clip"]

CLIP_COLUMNS = ("adaptive_clip", "sample_clip_mean", "sample_clip_min", "sample_clip_max")  # what the plot reads


def _series(metrics: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(rounds, values) of the rows where `key` is a finite number."""
    rounds, values = [], []
    for row in metrics:
        try:
            v = as_float(row.get(key))
        except ValueError:
            continue
        if v is not None and math.isfinite(v):
            rounds.append(int(row["round"]))
            values.append(v)
    return rounds, values


def plot_clip(metrics: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path | None:
    """The clip per round: the client-level adaptive clip, and the sample-level clips' mean with their min-max band,
    on a log axis (the clip moves geometrically). ``None`` without writing when no row has a clip column."""
    client = _series(metrics, "adaptive_clip")
    mean, low, high = (_series(metrics, k) for k in CLIP_COLUMNS[1:])
    if not client[0] and not mean[0]:
        return None
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_subplot(1, 1, 1)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if client[0]:
        ax.plot(*client, color="tab:blue", marker="o" if len(client[0]) <= 50 else None, markersize=3,
                label="client-level clip C_t (adaptive_clip)")
    if mean[0]:
        ax.plot(*mean, color="tab:orange", label="sample-level clip, mean over the round's clients")
        if low[0] and low[0] == high[0]:
            ax.fill_between(low[0], low[1], high[1], color="tab:orange", alpha=0.2, label="sample-level clip, min-max")
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("clip norm")
    ax.set_title("Adaptive clip per round")
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    return write_png(fig, path)

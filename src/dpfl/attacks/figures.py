"""The picture of a gradient inversion: the client's records in the first row, each attack's reconstructions below,
so a person sees at a glance what a mechanism let through (FedAvg next to a DP run)."""

from __future__ import annotations

import io
import os
import textwrap
from collections.abc import Mapping
from pathlib import Path

import torch

from dpfl.results.run_files import write_bytes_atomic


def reconstruction_grid(truth: torch.Tensor, rows: Mapping[str, torch.Tensor], path: str | os.PathLike[str],
                        title: str = "") -> Path:
    """A PNG grid: one column per record, rows 'original' then one per attack; images [B, C, H, W] in [0, 1]."""
    from matplotlib.figure import Figure

    all_rows = {"original": truth, **rows}
    batch = truth.shape[0]
    width = 1.2 * batch + 1.4
    fig = Figure(figsize=(width, 1.2 * len(all_rows) + 0.5), dpi=100)
    if title:  # wrapped to the figure's width (about 15 characters per inch at this size), so a batch of 1 shows it
        fig.suptitle("\n".join(textwrap.wrap(title, max(20, int(15 * width)))), fontsize=9)
    for r, (name, images) in enumerate(all_rows.items()):
        for b in range(batch):
            ax = fig.add_subplot(len(all_rows), batch, r * batch + b + 1)
            img = images[b].detach().clamp(0, 1).to(torch.float32)
            pixels = (img[0] if img.shape[0] == 1 else img.permute(1, 2, 0)).numpy()
            ax.imshow(pixels, cmap="gray" if img.shape[0] == 1 else None, vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if b == 0:
                ax.set_ylabel(name.replace("_", "\n"), fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return write_bytes_atomic(path, buf.getvalue())

"""plots/clip.png: the adaptive clip's trajectory, written when metrics.jsonl has a clip column and only then."""

from __future__ import annotations

import pytest
from matplotlib.image import imread

from dpfl.results.clip_plot import plot_clip
from dpfl.results.report import PLOT_FILES, write_plots


def _rows(**columns):
    n = len(next(iter(columns.values())))
    return [{"round": r + 1, **{k: v[r] for k, v in columns.items()}} for r in range(n)]


@pytest.mark.parametrize("columns", [
    {"adaptive_clip": [0.1, 0.11, 0.13]},  # client level
    {"sample_clip_mean": [1.0, 0.9, 0.8], "sample_clip_min": [0.9, 0.8, 0.7], "sample_clip_max": [1.1, 1.0, 0.9]},
    {"adaptive_clip": [0.1, 0.11, 0.13], "sample_clip_mean": [1.0, 0.9, 0.8]},  # both: one figure
])
def test_a_run_whose_clip_adapts_gets_one_clip_figure(tmp_path, columns):
    path = plot_clip(_rows(**columns), tmp_path / "clip.png")
    assert path is not None and imread(path).shape[:2] == (500, 800)


def test_a_fixed_clip_gets_no_figure_and_a_stale_one_is_removed(tmp_path):
    assert plot_clip(_rows(test_accuracy=[0.1, 0.2]), tmp_path / "clip.png") is None
    assert plot_clip(_rows(adaptive_clip=[None, float("nan")]), tmp_path / "clip.png") is None
    stale = tmp_path / "plots" / PLOT_FILES["clip"]
    stale.parent.mkdir()
    stale.write_bytes(b"old")
    made = write_plots(tmp_path, _rows(test_accuracy=[0.1, 0.2]), None)
    assert made["clip"] is None and not stale.exists()
    made = write_plots(tmp_path, _rows(adaptive_clip=[0.1, 0.2]), None)
    assert made["clip"] == stale and stale.is_file()

from __future__ import annotations

import matplotlib.image as mpimg
import pytest

from dpfl.results import (plot_accuracy, plot_budget_vs_spent, plot_compare, plot_epsilon, plot_errorbars,
                          read_metrics, read_privacy)

from .fakes import make_accounted_run, make_unaccounted_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path, size=(500, 800)):
    assert path is not None and path.is_file()
    assert path.read_bytes()[:8] == PNG_MAGIC
    image = mpimg.imread(path)
    assert image.shape[:2] == size


@pytest.fixture(scope="module")
def accounted(tmp_path_factory):
    run = make_accounted_run(tmp_path_factory.mktemp("plots") / "run")
    return read_metrics(run), read_privacy(run)


def test_accounted_plots_are_800_by_500(tmp_path, accounted):
    metrics, privacy = accounted
    assert_png(plot_accuracy(metrics, tmp_path / "accuracy.png"))
    assert_png(plot_epsilon(metrics, privacy, tmp_path / "epsilon.png"))
    assert_png(plot_budget_vs_spent(privacy, tmp_path / "budget.png"))
    assert_png(plot_compare({"a": metrics, "b": metrics[:3]}, tmp_path / "cmp.png"))
    series = {"a": ([20, 30], [0.5, 0.6], [0.01, float("nan")]), "b": ([30, 40], [0.4, 0.45], [0.02, 0.03])}
    assert_png(plot_errorbars(series, tmp_path / "bars.png", xlabel="M", ylabel="accuracy", title="t"))


def test_many_clients_use_bands(tmp_path):
    run = make_accounted_run(tmp_path / "big", n_clients=60, rounds=3)
    assert_png(plot_epsilon(read_metrics(run), read_privacy(run), tmp_path / "epsilon.png"))
    assert_png(plot_budget_vs_spent(read_privacy(run), tmp_path / "budget.png"))


def test_nothing_to_plot_writes_nothing(tmp_path):
    run = make_unaccounted_run(tmp_path / "run")
    metrics, privacy = read_metrics(run), read_privacy(run)
    assert plot_epsilon(metrics, privacy, tmp_path / "epsilon.png") is None
    assert plot_epsilon(metrics, None, tmp_path / "epsilon.png") is None  # no epsilon in the rows
    assert plot_budget_vs_spent(privacy, tmp_path / "budget.png") is None
    no_eval = [{**m, "test_accuracy": None} for m in metrics]
    assert plot_accuracy(no_eval, tmp_path / "accuracy.png") is None
    assert plot_compare({"x": no_eval}, tmp_path / "cmp.png") is None
    assert list(tmp_path.glob("*.png")) == []


def _legend_texts(monkeypatch, runs, tmp_path):
    """The legend's texts of plot_compare's figure, read before the figure is written and cleared."""
    seen: list[str] = []

    def spy(fig, path):
        seen.extend(t.get_text() for t in fig.axes[0].get_legend().get_texts())
        return path

    monkeypatch.setattr("dpfl.results.plots._save", spy)
    plot_compare(runs, tmp_path / "cmp.png")
    return seen


def test_compare_legend_keeps_where_grid_names_differ(tmp_path, monkeypatch, accounted):
    # grid runs differ in the middle: what every name shares at both ends (whole tokens; "sg0." is part of a
    # number, not a token) is dropped, so the legend shows the sigma of each run
    metrics, _ = accounted
    names = [f"fmnist-lenet5-m20-K10-T600-sg{s}.noisy_fedavg.seed0" for s in ("0.001", "0.01", "0.1")]
    texts = _legend_texts(monkeypatch, {n: metrics for n in names}, tmp_path)
    assert texts == ["…sg0.001…", "…sg0.01…", "…sg0.1…"]


@pytest.mark.parametrize("names, expected", [
    (["short", "other"], ["short", "other"]),                       # short names are kept whole
    (["fmnist-Dist1.robust_hdp.seed0", "fmnist-Dist1.weiavg.seed0"], ["…robust_hdp…", "…weiavg…"]),
    (["x" * 30], ["x" * 11 + "…" + "x" * 12]),                       # one run: nothing shared, middle cut to 25
    (["fdp-full-m20-clip-only", "fmnist-lenet5-m20-K50-T600-sg0.01"],  # no shared token: only the long one cut
     ["fdp-full-m20-clip-only", "fmnist-lene…-T600-sg0.01"]),
    (["fixed_c0.1_fedadam_lr0.03", "adaptive"], ["fixed_c0.1_fedadam_lr0.03", "adaptive"]),  # 25 fit whole
])
def test_legend_labels(names, expected):
    from dpfl.results.plots import _legend_labels

    assert _legend_labels(names) == expected

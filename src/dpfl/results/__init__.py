"""Results of a run: the run-directory files (read and crash-safe write), plots, report and comparison.

File formats: ``FORMATS.md`` in this folder. The readers and writers (``run_files``) import nothing
heavy; the plotting names (plots, report, compare) load matplotlib on first use, so the experiment
layer can write its files without importing matplotlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dpfl.results.run_files import (
    RunDirError,
    append_jsonl,
    as_float,
    is_run_dir,
    read_config_text,
    read_metrics,
    read_privacy,
    read_summary,
    truncate_jsonl,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)

if TYPE_CHECKING:
    from dpfl.results.compare import compare_runs, format_table, run_row
    from dpfl.results.plots import plot_accuracy, plot_budget_vs_spent, plot_compare, plot_epsilon, plot_errorbars
    from dpfl.results.report import write_plots, write_report

_LAZY = {
    "compare_runs": "compare", "format_table": "compare", "run_row": "compare",
    "plot_accuracy": "plots", "plot_budget_vs_spent": "plots", "plot_compare": "plots", "plot_epsilon": "plots",
    "plot_errorbars": "plots",
    "write_plots": "report", "write_report": "report",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"dpfl.results.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dpfl.results' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "RunDirError",
    "append_jsonl",
    "as_float",
    "compare_runs",
    "format_table",
    "is_run_dir",
    "plot_accuracy",
    "plot_budget_vs_spent",
    "plot_compare",
    "plot_epsilon",
    "plot_errorbars",
    "read_config_text",
    "read_metrics",
    "read_privacy",
    "read_summary",
    "run_row",
    "truncate_jsonl",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_plots",
    "write_report",
    "write_text_atomic",
]

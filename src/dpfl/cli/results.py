"""`dpfl report`, `dpfl compare` and `dpfl confidence`: read finished run directories back (their report and plots,
a table of several runs, why a run's test loss is large)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dpfl.cli.common import console, fail, user_errors
from dpfl.results.json_output import emit_json


def report(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """Rewrite a run's plots and report.md from its files."""
    from dpfl.results.report import write_report

    try:
        path = write_report(run_dir)
    except user_errors() as e:
        fail(str(e).splitlines()[0])
    console.print(f"report: {path}")


def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories to compare.")],
    out: Annotated[Optional[Path], typer.Option(help="Where to write compare_accuracy.png.")] = None,
    label: Annotated[Optional[list[str]], typer.Option(
        "--label", help="A name for each run in the table and the plot's legend: once per run, in order.")] = None,
    title: Annotated[Optional[str], typer.Option(help="The plot's title.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """A table of several runs and an accuracy-vs-round plot."""
    from dpfl.results.compare import compare_runs, format_table, table_columns

    try:
        rows, plot = compare_runs(list(run_dirs), out, labels=label or None, title=title)
    except user_errors() as e:
        fail(str(e).splitlines()[0])
    if as_json:
        emit_json({"runs": rows, "plot": None if plot is None else str(plot)})
        return
    console.print(format_table(rows, table_columns(rows, bool(label))), highlight=False, markup=False)
    if plot is not None:
        console.print(f"plot: {plot}")


def confidence(
    run_dirs: Annotated[list[Path], typer.Argument(help="Finished run directories (dpfl run) of classifiers.")],
    seed: Annotated[int, typer.Option(help="Seed of the test set's split into the temperature's two halves.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Why a run's test loss can be huge while its accuracy holds: the final model's test loss split into right and
    wrong predictions, its parameter norm, and the loss at a fitted temperature (accuracy unchanged)."""
    from dpfl.evaluate.confidence import confidence as measure
    from dpfl.evaluate.confidence import format_confidence

    try:
        rows = [measure(d, seed) for d in run_dirs]
    except user_errors() as e:
        fail(str(e).splitlines()[0])
    if as_json:
        emit_json({"runs": rows})
        return
    console.print(format_confidence(rows), highlight=False, markup=False)

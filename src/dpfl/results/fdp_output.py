"""The outputs of an f-DP report (``dpfl privacy fdp``): a CSV and a JSON file, a plot, and a terminal table.

An :class:`dpfl.privacy.fdp.FdpReport` is a set of curves (one per bound) of mu and epsilon(delta) over the
rounds T. Every output names each curve by its bound, and a paper-claimed curve (NOT a guarantee) by its full
label, so a number is never read without what it is. The table prints the threat model, inputs and
assumptions before any number, so no number is read without the setting it holds in.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from rich.console import Console

from dpfl.results.json_output import emit_json, strict_json

__all__ = ["FDP_FILES", "FDP_FORMATS", "FROM_RUN_BASIS", "fdp_column", "fdp_csv", "fdp_json_text", "print_fdp",
           "print_fdp_table", "write_fdp_files"]

FDP_FORMATS = ("table", "csv", "json")  # what --format accepts
# what `--from-run` computes: the plan (for a run that stopped early, more rounds than ran)
FROM_RUN_BASIS = ("computed from the run's config: its planned cohort in every planned round, not what the run spent "
                  "(per-client values of what ran are in its privacy.json)")
FDP_FILES = ("fdp_curves.csv", "fdp_curves.json", "fdp_curves.png")  # what write_fdp_files writes, in order


def fdp_column(curve: Any) -> str:
    """A curve's column name: the bound for guarantees, the full paper-claimed label otherwise (never bare)."""
    return curve.name if curve.is_guarantee else curve.label


def fdp_csv(report: Any) -> str:
    """The curves as CSV: a row per T; per curve a ``mu[NAME]`` column, then ``eps[NAME,delta=D]`` per delta.
    Numbers are written with ``repr`` so they read back exactly."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    header, columns = ["T"], []
    for c in report.curves:
        header.append(f"mu[{fdp_column(c)}]")
        columns.append(c.mu)
        for d in report.deltas:
            header.append(f"eps[{fdp_column(c)},delta={d}]")
            columns.append(c.eps[d])
    writer.writerow(header)
    for i, t in enumerate(report.rounds):
        writer.writerow([int(t)] + [repr(float(col[i])) for col in columns])
    return buf.getvalue()


def fdp_json_text(report: Any) -> str:
    """``report.to_dict()`` as indented strict JSON (non-finite numbers as "inf"/"nan" strings)."""
    return strict_json(report.to_dict(), indent=2, ensure_ascii=False) + "\n"


def write_fdp_files(report: Any, out: str | os.PathLike[str]) -> list[Path]:
    """Write ``FDP_FILES`` (CSV, JSON, plot) into the directory ``out``, each atomically; their paths."""
    from dpfl.results.fdp_plot import plot_fdp
    from dpfl.results.run_files import write_text_atomic

    out = Path(out)
    csv_name, json_name, png_name = FDP_FILES
    return [write_text_atomic(out / csv_name, fdp_csv(report)),
            write_text_atomic(out / json_name, fdp_json_text(report)), plot_fdp(report, out / png_name)]


def print_fdp_table(report: Any, console: Console, view_requested: Optional[str] = None) -> None:
    """Threat model, inputs and assumptions first, then the table of mu and epsilon per T, then the headline.

    ``view_requested`` is the view the user asked for (``auto`` is shown as resolved to ``report.view``)."""
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    from dpfl.privacy.fdp import RELEASE_TEXT, SHIFTED, VIEW_TEXT

    p = report.params
    view_requested = report.view if view_requested is None else view_requested

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)

    def num(v: Any) -> str:
        return "-" if v is None else f"{v:g}" if isinstance(v, (int, float)) else str(v)

    say(f"f-DP accounting of noisy {p['algo']} (Gaussian DP, record-level; dpfl privacy fdp)")
    resolved = "" if view_requested == report.view else f" (resolved from --view {view_requested})"
    say(f"view:    {report.view}{resolved}: {VIEW_TEXT[report.view].split(': ', 1)[1]}")
    say(f"release: {report.release}: {RELEASE_TEXT[report.release]}")
    say("delta:   " + ", ".join(f"{d:g}" for d in report.deltas))
    say(f"hyperparameters: algo {p['algo']}, schedule {p['schedule']}, eta {num(p['eta'])}, K {p['K']}, "
        f"V {num(p['V'])}, sigma {num(p['sigma'])}, m {p['m']}, honest clients {p['honest_clients']}, "
        f"L {num(p['L'])}{' (ASSUMPTION)' if p['L'] is not None else ''}, alpha {num(p['alpha'])}, "
        f"sensitivity {p['sensitivity']}, c {num(p['c'])}, z {num(p['z'])}, "
        f"secure aggregation {'yes' if p['secure_aggregation'] else 'no'}"
        + (f", paper variant {p['paper_variant']}" if p["paper_variant"] else ""))
    say("bounds:  " + ", ".join(c.label for c in report.curves) + f"; headline guarantee: {report.headline}")
    if SHIFTED not in {c.name for c in report.curves}:
        say(f"         ({SHIFTED} applies only with the aggregate view, --release final and --L)")
    say("assumptions:")
    for a in report.assumptions:
        say(f"  - {a}")
    say("warnings:" + ("" if report.warnings else " none"))
    for w in report.warnings:
        say(f"  - {w}")

    table = Table()
    table.add_column(Text("T"), justify="right", no_wrap=True)
    for c in report.curves:
        style = "red" if not c.is_guarantee else None
        table.add_column(Text(f"{fdp_column(c)}\nμ"), justify="right", no_wrap=True, style=style)
        for d in report.deltas:
            table.add_column(Text(f"{fdp_column(c)}\nε(δ={d:g})"), justify="right", no_wrap=True, style=style)
    for i, t in enumerate(report.rounds):
        cells = [str(int(t))]
        for c in report.curves:
            cells.append(f"{c.mu[i]:.6g}")
            cells += [f"{c.eps[d][i]:.6g}" for d in report.deltas]
        table.add_row(*cells)
    # headers must not wrap (the paper label has to read whole): render wider than a narrow or piped console
    need = Measurement.get(console, console.options.update_width(10_000), table).maximum
    Console(file=console.file, width=max(console.width, need)).print(table)

    head = report.curve(report.headline)
    at_t = int(report.rounds[-1])
    say(f"headline guarantee: {report.headline} at T = {at_t}: mu = {head.mu[-1]:.6g}, "
        + ", ".join(f"epsilon = {head.eps[d][-1]:.6g} at delta = {d:g}" for d in report.deltas))
    if any(not c.is_guarantee for c in report.curves):
        say(f"the paper-claimed (NOT a guarantee) columns evaluate the paper's theorems (variant "
            f"{p['paper_variant']}) for comparison only: they are not privacy guarantees "
            "(spec fdp_accounting.md §4.4)")


def print_fdp(report: Any, fmt: str, console: Console, view_requested: Optional[str] = None,
              written: Sequence[Path] = (), run_dir: Optional[Path] = None) -> None:
    """``report`` in the format ``fmt`` (one of ``FDP_FORMATS``) on ``console``: json and csv go verbatim to its
    file (for scripts); the table also says which run it came from (``run_dir``) and which files were written."""
    if fmt not in FDP_FORMATS:
        raise ValueError(f"format must be one of {', '.join(FDP_FORMATS)}, got {fmt!r}")
    if fmt == "json":
        emit_json({**report.to_dict(), **({"run": str(run_dir), "basis": FROM_RUN_BASIS} if run_dir is not None
                                          else {})}, console.file)
    elif fmt == "csv":
        if run_dir is not None:  # a comment line: the numbers are the plan's, not what the run spent
            console.file.write(f"# run {run_dir}: {FROM_RUN_BASIS}\n")
        console.file.write(fdp_csv(report))
    else:
        if run_dir is not None:
            console.print(f"from the config of run {run_dir} ({FROM_RUN_BASIS})", markup=False, highlight=False)
        print_fdp_table(report, console, view_requested)
        if written:
            console.print("files: " + "  ".join(str(p) for p in written), markup=False, highlight=False)

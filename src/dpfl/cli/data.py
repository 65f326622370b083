"""`dpfl data`: the datasets dpfl knows (what is available locally, fetching one into the user cache) and the
statistics of the splitting spec's convex problems."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from dpfl.cli.common import console, fail, user_errors
from dpfl.results.json_output import emit_json

data_app = typer.Typer(no_args_is_help=True, help="Datasets: what is available locally, and fetching.")


@data_app.command("list")
def data_list(as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False) -> None:
    """Datasets dpfl knows, whether each is available locally, and where."""
    from dpfl.data import available

    rows = available()
    if as_json:
        emit_json({"datasets": [{k: (str(v) if isinstance(v, Path) else v) for k, v in r.items()} for r in rows]})
        return
    table = Table("dataset", "available", "where", "fetchable")
    for r in rows:
        table.add_row(r["name"], "no" if r.get("source") == "missing" else "yes",
                      str(r.get("path") or r.get("source") or "-"), "yes" if r.get("fetchable") else "no")
    console.print(table)


@data_app.command("fetch")
def data_fetch(name: Annotated[str, typer.Argument(help="Dataset name, e.g. fashion_mnist.")]) -> None:
    """Download a dataset into the user cache (checksums verified)."""
    from dpfl.data import fetch

    try:
        path = fetch(name)
    except user_errors() as e:
        fail(str(e).splitlines()[0])
    except OSError as e:  # network failures
        fail(f"could not fetch {name}: {e}")
    console.print(f"{name}: {path}")


@data_app.command("convex")
def data_convex(
    kind: Annotated[str, typer.Option("--kind", help="least_squares or logistic.")] = "least_squares",
    shift_scale: Annotated[float, typer.Option("--shift-scale", help="Client truths x0 + s xi_i "
                                                                     "(0: homogeneous).")] = 0.0,
    preset: Annotated[Optional[str], typer.Option("--preset", help="small: 5 clients, d = 20, N_i = 200.")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Statistics of a convex problem of the splitting spec: sizes, ||theta*||, f(theta*) and the heterogeneity
    H = (1/n) sum_i ||grad f_i(theta*)||^2 (also per sample: the gradients of the mean losses)."""
    from dpfl.reproduce.splitting_config import problem_spec, problem_statistics

    try:
        problem = problem_spec(kind=kind, shift_scale=shift_scale, preset=preset).build(seed)
    except user_errors() as e:
        fail(str(e).splitlines()[0])
    out = problem_statistics(problem, kind=kind, shift_scale=shift_scale, seed=seed)
    if as_json:
        emit_json(out)
        return
    for key, value in out.items():
        console.print(f"{key}: {value:.6g}" if isinstance(value, float) else f"{key}: {value}", highlight=False)

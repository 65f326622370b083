"""`dpfl data`: the datasets dpfl knows (what is available locally, fetching one into the user cache), what a config's
data section gives each client (`inspect`: the user's own silos, or a split dataset) and the statistics of the
splitting spec's convex problems."""

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


@data_app.command("inspect")
def data_inspect(
    config: Annotated[Path, typer.Argument(help="A run config (YAML).")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a field: a.b=value.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    import_: Annotated[Optional[list[str]], typer.Option(
        "--import", help="Import this Python module first (repeatable), e.g. one that registers the dataset.")] = None,
) -> None:
    """Each client's records (train, test, validation) and label counts, as the config's data section gives them:
    the user's silos read and checked against the declared schema, or a dataset split with the run seed."""
    from dpfl.cli.run import _import_plugins
    from dpfl.experiment.build import build_data
    from dpfl.experiment.config import load_config

    try:
        _import_plugins(import_ or [])
        cfg = load_config(config, list(set_ or []))
        data = build_data(cfg)
    except user_errors() as e:
        fail(str(e).splitlines()[0])
    names = data.info.get("silos") or [str(i) for i in range(data.n_clients)]
    counts = data.label_counts().tolist() if data.n_classes > 0 else [[] for _ in data.clients]
    rows = [{"client": i, "name": names[i], "train": c.n_train, "test": c.n_test, "val": c.n_val,
             "labels": counts[i]} for i, c in enumerate(data.clients)]
    test_counts = (torch_bincount(data.y_test, data.n_classes) if data.n_classes > 0 else [])
    summary = {"dataset": data.info.get("dataset", cfg.data.dataset), "clients": data.n_clients,
               "n_classes": data.n_classes, "record_shape": list(data.input_shape),
               "test": {"records": int(len(data.y_test)), "labels": test_counts}, "per_client": rows}
    if as_json:
        emit_json(summary)
        return
    console.print(f"{summary['dataset']}: {data.n_clients} clients, {data.n_classes} classes, records of shape "
                  f"{list(data.input_shape)}", markup=False, highlight=False)
    table = Table("client", "name", "train", "test", "val", "train labels (count per class 0, 1, ...)")
    for r in rows:
        table.add_row(str(r["client"]), r["name"], str(r["train"]), str(r["test"]), str(r["val"]),
                      " ".join(map(str, r["labels"])))
    table.add_row("global test", "", "", str(summary["test"]["records"]), "", " ".join(map(str, test_counts)))
    console.print(table)


def torch_bincount(y, n_classes: int) -> list[int]:  # noqa: ANN001 - a torch tensor of labels
    """Counts of each class 0..n_classes-1 in `y`."""
    import numpy as np

    return np.bincount(y.numpy(), minlength=n_classes).astype(int).tolist()


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

"""`dpfl run` and `dpfl demo`: train one federated experiment into a run directory, with a progress bar, then print
its outcome (`dpfl.results.outcome`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dpfl.cli.common import RUN_FAILED, UserError, console, errors, fail, user_errors
from dpfl.engine.backends.errors import BackendError
from dpfl.results.formatting import accuracy_words, format_epsilon, round_accuracy


def _run_with_progress(cfg, out: Path, resume: bool) -> dict[str, Any]:
    """`execute` with a progress bar on a terminal; without one (a log file), a line about the pace every
    `pace.PACE_EVERY` seconds (`dpfl.reproduce.pace`)."""
    from dpfl.experiment.run_directory import execute
    from dpfl.reproduce.pace import RoundPace

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=errors,
                  disable=not errors.is_terminal and "DPFL_PROGRESS" not in __import__("os").environ) as progress:
        task = progress.add_task(cfg.name, total=cfg.training.rounds, status="preparing (data, calibration)")
        accuracy: list[Optional[tuple[str, float]]] = [None]  # the last round_accuracy
        pace = RoundPace(cfg.training.rounds) if progress.disable else None

        def on_start(run, done: int) -> None:
            progress.update(task, completed=done, status="training")

        def on_round(row: dict[str, Any]) -> None:
            accuracy[0] = round_accuracy(row) or accuracy[0]
            acc = accuracy_words(accuracy[0])
            eps = f"  eps max {format_epsilon(row['epsilon_max'])}" if "epsilon_max" in row else ""
            progress.update(task, completed=row["round"], status=f"{acc}{eps}")
            if pace is not None and (line := pace.line(row)):
                errors.print(f"{cfg.name}: {line}, {acc}{eps}", markup=False, highlight=False)

        return execute(cfg, out, resume=resume, on_round=on_round, on_start=on_start, measure=_measure(cfg))


def _measure(cfg) -> Any:  # noqa: ANN001
    """What is measured on a finished run for privacy.json: a curious client's attacks on MP-DP's family (spec
    bidirectional.md §10); nothing for the others."""
    from dpfl.algorithms.catalog.mpdp import METHODS
    from dpfl.evaluate.mpdp_attacks import measure_client_attacks

    return measure_client_attacks if cfg.algorithm.name in METHODS else None


def _import_plugins(modules: list[str]) -> None:
    """Import the user's registration modules (`dpfl.register_*` calls) before the config is validated."""
    import importlib
    import os

    if modules and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - any failure of the user's module is theirs to fix: one line
            raise UserError(f"--import {name}: {type(err).__name__}: {err}".splitlines()[0]) from None


def run(
    config: Annotated[Path, typer.Argument(help="YAML config of the run.")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a field: --set training.rounds=5 "
                                                                    "(repeatable).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Run directory (default runs/<name>).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue a killed run from its last checkpoint.")] = False,
    import_: Annotated[Optional[list[str]], typer.Option(
        "--import", help="Import this Python module first (repeatable; the current directory is searched), so the "
                         "datasets, models, losses, aggregators and local programs it registers can be named in the "
                         "config.")] = None,
    device: Annotated[Optional[str], typer.Option(
        "--device", help="Where to train: cpu, cuda or cuda:N (the config's `device`; the same as --set "
                         "device=...).")] = None,
) -> None:
    """Run a federated experiment described by a YAML config (an MP-DP config in the old flat schema, `scheme: mpdp`,
    is converted, with a one-line note)."""
    from dpfl.experiment.config import device_override, load_config
    from dpfl.results.outcome import print_outcome

    try:
        _import_plugins(import_ or [])
        cfg = load_config(config, [*(set_ or []), *device_override(device)],
                          notice=lambda line: errors.print(line, markup=False, highlight=False))
        out = out or Path("runs") / cfg.name
        summary = _run_with_progress(cfg, out, resume)
        print_outcome(out, console, summary)
        if summary["stop_reason"] == "diverged":
            raise typer.Exit(RUN_FAILED)  # the outcome above says why
    except user_errors() as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except BackendError as e:  # workers lost twice in a round: the run keeps its last checkpoint
        fail(f"{e}; continue from the last checkpoint with: dpfl run {config} --resume"
             + (f" --out {out}" if out is not None else ""))


def demo(out: Annotated[Optional[Path], typer.Option(help="Run directory (default runs/demo-<time>).")] = None) -> None:
    """A short private run on scikit-learn's bundled digits with a different budget per client."""
    from dpfl.experiment.build import build_demo_config
    from dpfl.results.outcome import print_outcome

    try:
        cfg = build_demo_config()
        out = out or Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
        summary = _run_with_progress(cfg, out, resume=False)
        print_outcome(out, console, summary)
    except user_errors() as e:
        fail(str(e).splitlines()[0])

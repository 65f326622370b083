"""The options the `dpfl reproduce` commands share (--out, --scale, --seeds, --only-seeds, --workers, ...) and the
checks of their combinations."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dpfl.cli.common import fail, user_errors

Scale = Annotated[str, typer.Option("--scale", help="ci (minutes on a CPU: checks that it runs) or full (the "
                                                    "paper's grid: hours to days).")]
Out = Annotated[Path, typer.Option("--out", help="Output directory: runs/, results.csv, results.md, plots/.")]
Seeds = Annotated[Optional[int], typer.Option("--seeds", help="Number of seeds (0..N-1) instead of the spec's.")]
OnlySeeds = Annotated[Optional[str], typer.Option(
    "--only-seeds", help="Run only these of the planned seeds (comma-separated, e.g. 2 or 1,2): a grid's seeds "
                         "spread over machines or sessions. The tables still collect every finished seed under "
                         "--out and count against all planned ones.")]
Rounds = Annotated[Optional[int], typer.Option("--rounds", help="Rounds per run instead of the spec's.")]
Settings = Annotated[Optional[str], typer.Option("--settings", help="Only settings matching this fnmatch pattern "
                                                                    "(commas: alternatives).")]
Methods = Annotated[Optional[str], typer.Option("--methods", help="Only these methods, e.g. robust_hdp,weiavg.")]
Datasets = Annotated[Optional[list[str]], typer.Option("--dataset", help="fashion_mnist (default) or mnist; "
                                                                         "repeatable or comma-separated.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="List the jobs and their state; run nothing.")]
Overrides = Annotated[Optional[list[str]], typer.Option(
    "--set", help="Override a field of every run's config (repeatable), e.g. --set training.optimizer.lr=0.05. "
                  "The grid is then not the paper's: every output's scale says \"overrides ...\". Not seed, name "
                  "or training.rounds (the grid sets them; use --seeds, --rounds).")]
Workers = Annotated[int, typer.Option(
    "--workers", help="Worker processes sharing the grid's jobs (each job runs once, in one of them), each with "
                      "this process's torch threads divided among them: on C cores, --workers C runs C jobs at "
                      "once with one thread each.")]
TablesOnly = Annotated[bool, typer.Option(
    "--tables-only", help="Write results.csv, results.md and plots/ from the runs already finished under --out; "
                          "train nothing (a long grid's tables while it runs elsewhere). The tables' command line "
                          "is the one that computes them, without this option.")]


def one_of_dry_run_and_tables_only(dry_run: bool, tables_only: bool) -> None:
    if dry_run and tables_only:
        fail("--dry-run and --tables-only: choose one (--dry-run lists what would run, --tables-only writes the "
             "tables of what finished)")


def check_workers(workers: int, dry_run: bool, tables_only: bool) -> None:
    if workers < 1:
        fail(f"--workers must be at least 1, got {workers}")
    if workers > 1 and (dry_run or tables_only):
        fail(f"--workers shares the runs among processes; {'--dry-run' if dry_run else '--tables-only'} runs none")


def method_list(methods: Optional[str]) -> Optional[list[str]]:
    """--methods as names (None when not given)."""
    return [m.strip() for m in methods.split(",") if m.strip()] if methods else None


def seed_list(only_seeds: Optional[str], tables_only: bool = False, work: str = "train") -> Optional[list[int]]:
    """--only-seeds as integers (None when not given); refused with --tables-only, which does no `work` at all."""
    if only_seeds is None:
        return None
    if tables_only:
        fail(f"--only-seeds chooses the seeds to {work}; --tables-only {work}s none (its tables collect every "
             f"{'saved' if work == 'compute' else 'finished'} seed)")
    try:
        seeds = [int(s) for s in only_seeds.split(",") if s.strip()]
    except ValueError:
        fail(f"--only-seeds takes comma-separated seed numbers, e.g. 2 or 1,2 (got {only_seeds!r})")
    if not seeds:
        fail("--only-seeds: no seed given")
    return seeds


def grid_overrides(set_: Optional[list[str]]) -> tuple[str, ...]:
    """--set values for every job of a grid (`dpfl.reproduce.families.grid_overrides`), a problem as one line."""
    from dpfl.reproduce.families import grid_overrides as checked

    try:
        return checked(set_)
    except user_errors() as e:
        fail(str(e).splitlines()[0])


def command_line(words: list[str], options: tuple[tuple[str, object], ...]) -> str:
    """`words`, then `--name value` for each option given (not None): the command line a study's tables state."""
    return " ".join(words + [f"--{k} {v}" for k, v in options if v is not None])

"""The grid families of `dpfl reproduce`: pfa, robust-hdp, fedceo, fdp-accuracy, rdpcfl and mechanisms, each a module
whose `grid(scale, ...)` plans (setting, method, seed) jobs. Here what one invocation does with any of them: the grid
after the selections (`plan`), its jobs run in this process, in worker processes or only collected, then its results
tables (`run`: the family's own `write_results` if it has one, else `tables.write_results`).

    grid = plan("pfa", "ci", datasets=["fashion_mnist"])
    outcomes, csv_path, md_path = run("pfa", grid, out, command="dpfl reproduce pfa --scale ci --out OUT")

The other studies (splitting, mpdp, attacks, fdp-sensitivity) are not grids of run directories: each module has its
own `run_study`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from dpfl.reproduce.jobs import Grid, GridError, select_seeds
from dpfl.reproduce.runner import Outcome

FAMILIES = ("pfa", "robust-hdp", "fedceo", "fdp-accuracy", "rdpcfl", "mechanisms")  # as the commands name them
GRID_FIELDS = ("seed", "name", "training.rounds")  # set per job by the grid: an override would break it


def family(name: str) -> ModuleType:
    """The module of a family (one of FAMILIES)."""
    from dpfl.reproduce import fdp_accuracy, fedceo, mechanisms, pfa, rdpcfl, robust_hdp

    return {"pfa": pfa, "robust-hdp": robust_hdp, "fedceo": fedceo, "fdp-accuracy": fdp_accuracy,
            "rdpcfl": rdpcfl, "mechanisms": mechanisms}[name]


def dataset_names(datasets: Sequence[str] | None) -> list[str]:
    """--dataset values (repeatable or comma-separated, `fmnist` for short), in order, without repeats."""
    names = [d.strip() for item in (datasets or ["fashion_mnist"]) for d in item.split(",") if d.strip()]
    return list(dict.fromkeys({"fmnist": "fashion_mnist"}.get(d, d) for d in names))


def grid_overrides(items: Sequence[str] | None) -> tuple[str, ...]:
    """--set values for every job of a grid, read as `dpfl run --set` reads them (a ConfigError if one does not
    parse); a GridError for a field the grid sets per job (GRID_FIELDS)."""
    from dpfl.experiment.config.overrides import parse_override

    for item in items or ():
        field = ".".join(parse_override(item)[0])
        if field in GRID_FIELDS:
            instead = {"seed": "use --seeds", "training.rounds": "use --rounds"}.get(field, "its setting, method, seed")
            raise GridError(f"--set {field}: the grid sets {field} for each run ({instead})")
    return tuple(items or ())


def plan(paper: str, scale: str, *, datasets: Sequence[str], seeds: int | None = None, rounds: int | None = None,
         settings_pattern: str | None = None, methods: Sequence[str] | None = None, extra: Sequence[str] = (),
         only_seeds: Sequence[int] | None = None, **grid_options: Any) -> Grid:
    """The family's grid of one invocation: its `grid` with the selections and options (`extra`: overrides for every
    job), then only the `only_seeds` to run; a GridError when the selection leaves no job."""
    grid = family(paper).grid(scale, datasets=datasets, seeds=seeds, rounds=rounds, settings_pattern=settings_pattern,
                              methods=methods, extra=extra, **grid_options)
    grid = select_seeds(grid, only_seeds)
    if not grid.jobs:
        raise GridError("no job to run: the selection leaves nothing (see --dry-run)")
    return grid


def run(paper: str, grid: Grid, out: Path, *, command: str = "", tables_only: bool = False, workers: int = 1,
        progress_console: Any = None) -> tuple[list[Outcome], Path, Path]:
    """Run the grid's jobs (in `workers` processes when more than one; else here, with a `runner.RichProgress` on
    `progress_console` when given), add the finished runs of its other jobs under `out`, then write the results
    tables; with `tables_only`, collect the finished runs only (a GridError if there is none). Returns every outcome
    and the results' CSV and Markdown paths (`command` is the command line the tables state)."""
    from dpfl.reproduce.runner import RichProgress, collect_finished, run_jobs
    from dpfl.reproduce.tables import write_results as generic_results
    from dpfl.reproduce.workers import run_jobs_in_workers

    if tables_only:
        outcomes = collect_finished(grid.all_jobs, out)
        if not outcomes:
            raise GridError(f"--tables-only: no finished run of this selection under {out / 'runs'}")
    elif workers > 1:
        outcomes = run_jobs_in_workers(grid.jobs, out, workers)
    elif progress_console is None:
        outcomes = run_jobs(grid.jobs, out)
    else:
        with RichProgress(progress_console) as progress:
            outcomes = run_jobs(grid.jobs, out, progress=progress)
    if not tables_only:
        selected = {j.key for j in grid.jobs}
        outcomes += collect_finished([j for j in grid.all_jobs if j.key not in selected], out)
    write_results = getattr(family(paper), "write_results", generic_results)  # a study's own tables, if it has them
    csv_path, md_path = write_results(grid, outcomes, out, command=command)
    return outcomes, csv_path, md_path


def status_counts(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """How many outcomes have each status, in the order the statuses first appear."""
    return {s: sum(o.status == s for o in outcomes) for s in dict.fromkeys(o.status for o in outcomes)}

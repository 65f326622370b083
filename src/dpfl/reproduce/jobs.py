"""A paper's comparison as a list of jobs: every method on the same data, budgets and seeds.

A `Setting` is one column of a paper's table (dataset, model, budgets, ...): a base config file plus
overrides. A `Method` is one row (algorithm and its parameters), also as overrides. A `Job` is one run:
(setting, method, seed) with its validated `RunConfig`. Methods of a setting differ ONLY in their own
overrides, applied after the setting's, so they share the data split, the budgets and the initial model
(all derived from `seed`); `tests/reproduce/test_jobs.py` checks that.

Overrides are the `--set` strings of `dpfl run` ("a.b=value"), so every job can be re-run by hand:
`dpfl run BASE --set ... --set ...` gives the same config.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from dpfl.algorithms.registry import algorithm_names
from dpfl.experiment.config import RunConfig, apply_overrides, load_config, parse_yaml, validate_config

__all__ = [
    "Grid",
    "GridError",
    "build_grid",
    "check_planned",
    "Job",
    "Method",
    "Setting",
    "config_dir",
    "expand",
    "scale_label",
    "select_methods",
    "select_names",
    "select_seeds",
    "select_settings",
]

RUNS_DIR = "runs"


class GridError(ValueError):
    """A selection that matches nothing or names an unknown method (a user error)."""


@dataclass(frozen=True)
class Method:
    """One compared method: the paper's name, the overrides that make it, and a label shown with its results.

    `algorithm` is the dpfl algorithm the overrides select; a method whose algorithm this dpfl build does
    not have (e.g. one being added) is left out of the grid with a note instead of failing it.
    """

    name: str
    algorithm: str
    overrides: tuple[str, ...]
    label: str = ""

    @property
    def available(self) -> bool:
        return self.algorithm in algorithm_names()  # dpfl's own and the user's registered ones


@dataclass(frozen=True)
class Setting:
    """One experimental setting: a base config plus overrides, and the methods compared in it.

    `meta` carries what the tables need to know about the setting (e.g. {"dist": "Dist5"}, or for the
    falsified-budget setting {"honest": "fmnist-Dist5"}); `describe` is one line for results.md.
    """

    name: str
    base: Path
    overrides: tuple[str, ...]
    methods: tuple[Method, ...]
    dataset: str
    describe: str = ""
    meta: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """One run of a comparison: `config` is validated and carries `seed`."""

    setting: str
    method: str
    seed: int
    config: RunConfig
    label: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.setting, self.method, self.seed)

    def run_dir(self, out: Path) -> Path:
        """OUT/runs/<setting>/<method>/seed<k>: one directory per run, as `dpfl run` writes it."""
        return Path(out) / RUNS_DIR / self.setting / self.method / f"seed{self.seed}"


@dataclass
class Grid:
    """The jobs of one invocation.

    `jobs` are the selected ones (to run); `all_jobs` ignore --settings/--methods, so runs finished by
    earlier invocations with other selections are collected into the same results. `label` is the scale
    as every output states it; `notes` are things the user must know (methods left out, ...).
    """

    paper: str
    scale: str
    label: str
    settings: list[Setting]
    jobs: list[Job]
    all_jobs: list[Job]
    seeds: list[int]
    rounds: int
    notes: list[str] = field(default_factory=list)
    selection: list[str] = field(default_factory=list)

    def setting(self, name: str) -> Setting:
        return next(s for s in self.settings if s.name == name)


def config_dir(family: str = "hdp") -> Path:
    """The repository's `configs/<family>` (base configs of the grids): source checkout or current directory."""
    candidates = [Path(__file__).resolve().parents[3] / "configs" / family, Path.cwd() / "configs" / family]
    for c in candidates:
        if c.is_dir():
            return c
    raise FileNotFoundError(f"the reproduction base configs (configs/{family}/) were not found: run from a dpfl "
                            "source checkout")


DATASET_SHORT = {"fashion_mnist": "fmnist", "mnist": "mnist"}  # the datasets both grids ship, as setting names say them


def dataset_short(dataset: str, scale: str, paper: str) -> str:
    """The short name of a dataset a grid ships (`fmnist`), or a GridError; ci runs on Fashion-MNIST only."""
    if dataset not in DATASET_SHORT:
        raise GridError(f"--dataset: the {paper} grid ships fashion_mnist and mnist (got {dataset!r})")
    if scale == "ci" and dataset != "fashion_mnist":
        raise GridError("--scale ci is defined on fashion_mnist only (spec §7.4)")
    return DATASET_SHORT[dataset]


def select_names(names: Sequence[str], pattern: str | None) -> list[str]:
    """The names matching the fnmatch `pattern` (comma-separated patterns are alternatives), in their order; a
    GridError listing every name when none matches."""
    if not pattern:
        return list(names)
    patterns = [p.strip() for p in pattern.split(",") if p.strip()]
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not chosen:
        raise GridError(f"--settings {pattern!r} matches no setting (settings: {', '.join(names)})")
    return chosen


def select_settings(settings: Sequence[Setting], pattern: str | None) -> list[Setting]:
    """Settings whose name matches the fnmatch `pattern` (`select_names`)."""
    chosen = set(select_names([s.name for s in settings], pattern))
    return [s for s in settings if s.name in chosen]


def select_methods(settings: Sequence[Setting], methods: Sequence[str] | None) -> list[str] | None:
    """Check a --methods subset against the grid's methods; None means all."""
    if not methods:
        return None
    known = list(dict.fromkeys(m.name for s in settings for m in s.methods))
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise GridError(f"--methods: unknown method {unknown[0]!r} (methods of this grid: {', '.join(known)})")
    for s in settings:
        for m in s.methods:
            if m.name in methods and not m.available:
                raise GridError(f"--methods: {m.name!r} needs algorithm {m.algorithm!r}, which this dpfl build does "
                                "not have yet")
    return list(methods)


def expand(settings: Sequence[Setting], seeds: Iterable[int], *, rounds: int | None = None,
           methods: Sequence[str] | None = None, extra: Sequence[str] = ()) -> list[Job]:
    """Every (setting, method, seed) job, configs validated; order: setting, seed, method.

    Overrides apply in this order: the setting's, the method's, then `seed`, `--rounds` and `extra`
    (so a reduction applies to every method alike). Methods whose algorithm is not available are left out.
    """
    jobs = []
    seeds = list(seeds)
    for s in settings:
        load_config(s.base)  # a missing or invalid base file fails here, named
        base = parse_yaml(s.base.read_text(encoding="utf-8"), str(s.base))  # = load_config's reading, once per setting
        for seed in seeds:
            for m in s.methods:
                if not m.available or (methods is not None and m.name not in methods):
                    continue
                overrides = [*s.overrides, *m.overrides, f"seed={seed}", f"name={s.name}.{m.name}.seed{seed}"]
                if rounds is not None:
                    overrides.append(f"training.rounds={rounds}")
                overrides.extend(extra)
                cfg = validate_config(apply_overrides(base, overrides))
                jobs.append(Job(s.name, m.name, seed, cfg, m.label))
    return jobs


def check_planned(only: Sequence[int], planned: Sequence[int]) -> None:
    """--only-seeds may name only seeds the grid plans (`planned`, ascending)."""
    unplanned = [s for s in only if s not in planned]
    if unplanned:
        raise GridError(f"--only-seeds: seed {unplanned[0]} is not among the planned seeds {planned[0]}.."
                        f"{planned[-1]} (raise --seeds to plan it)")


def select_seeds(grid: Grid, only: Sequence[int] | None) -> Grid:
    """The grid with only these seeds' jobs to run (--only-seeds: one grid's seeds spread over machines or
    sessions). The planned seeds, `all_jobs` and so the tables stay the grid's: runs of other seeds finished
    under the same --out are still collected, and "seeds ok" still counts against every planned seed."""
    if not only:
        return grid
    check_planned(only, grid.seeds)
    chosen = sorted(set(only))
    return replace(grid, jobs=[j for j in grid.jobs if j.seed in chosen],
                   selection=[*grid.selection, f"seeds selected with --only-seeds {','.join(map(str, chosen))}"])


def scale_label(scale: str, *, spec_rounds: int, spec_seeds: int, rounds: int | None, seeds: int,
                extra: Sequence[str] = ()) -> str:
    """The scale as every output states it, e.g. ``full (reduced: 30 rounds instead of 100, 2 seeds instead of 5)``.

    Anything that differs from the spec's grid at this scale is listed; "reduced" when something is
    smaller than the spec, "changed" otherwise.
    """
    changes, smaller = [], False
    if rounds is not None and rounds != spec_rounds:
        changes.append(f"{rounds} round{'s' * (rounds != 1)} instead of {spec_rounds}")
        smaller |= rounds < spec_rounds
    if seeds != spec_seeds:
        changes.append(f"{seeds} seed{'s' * (seeds != 1)} instead of {spec_seeds}")
        smaller |= seeds < spec_seeds
    if extra:
        changes.append("overrides " + " ".join(extra))
        smaller = True  # an override is not the spec's setting: never present it as the full one
    if not changes:
        return scale
    return f"{scale} ({'reduced' if smaller else 'changed'}: {', '.join(changes)})"


def build_grid(paper: str, scale: str, all_settings: Sequence[Setting], *, spec_rounds: int, spec_seeds: int,
               seeds: int | None = None, rounds: int | None = None, settings_pattern: str | None = None,
               methods: Sequence[str] | None = None, extra: Sequence[str] = (),
               selection: Sequence[str] = ()) -> Grid:
    """The Grid of one invocation: select settings and methods, expand every job, label the scale.

    `seeds` is a count (seeds 0..N-1; default the spec's), `rounds` replaces the spec's rounds, `extra`
    are overrides applied to every job (they make the label say so), `selection` notes for results.md.
    """
    chosen = select_settings(all_settings, settings_pattern)
    wanted = select_methods(chosen, methods)
    n_seeds = spec_seeds if seeds is None else seeds
    if n_seeds < 1:
        raise GridError(f"--seeds must be >= 1, got {n_seeds}")
    if rounds is not None and rounds < 1:
        raise GridError(f"--rounds must be >= 1, got {rounds}")
    seed_list = list(range(n_seeds))
    label = scale_label(scale, spec_rounds=spec_rounds, spec_seeds=spec_seeds, rounds=rounds, seeds=n_seeds,
                        extra=extra)
    jobs = expand(chosen, seed_list, rounds=rounds, methods=wanted, extra=extra)
    everything = len(chosen) == len(all_settings) and wanted is None
    all_jobs = jobs if everything else expand(all_settings, seed_list, rounds=rounds, extra=extra)
    missing = {m.name: m.algorithm for s in all_settings for m in s.methods if not m.available}
    notes = [f"method {name} left out: this dpfl build has no algorithm {alg!r} yet" for name, alg in missing.items()]
    chosen_notes = list(selection)
    if settings_pattern:
        chosen_notes.append(f"settings selected with --settings {settings_pattern!r}")
    if wanted:
        chosen_notes.append(f"methods selected with --methods {','.join(wanted)}")
    return Grid(paper, scale, label, list(all_settings), jobs, all_jobs, seed_list,
                rounds if rounds is not None else spec_rounds, notes, chosen_notes)

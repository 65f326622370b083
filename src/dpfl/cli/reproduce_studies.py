"""The `dpfl reproduce` studies that are not grids of run directories: the operator-splitting family, MP-DP, the
attacks study and the f-DP empirical sensitivity (each module's `run_study` or `run_sensitivity` in
`dpfl.reproduce`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dpfl.cli.common import console, errors, fail, say, user_errors
from dpfl.cli.reproduce_options import (DryRun, Methods, OnlySeeds, Out, Rounds, Seeds, Settings, TablesOnly, Workers,
                                        check_workers, command_line, method_list, one_of_dry_run_and_tables_only,
                                        seed_list)


def reproduce_splitting(
    out: Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (heterogeneous least squares and logistic regression, 6 methods with and without Anderson, 1 seed; "
        "about 5 minutes), reduced (the CNN comparison only: 3 partitions x 5 methods x (tau 0, 10) x 4 seeds at 30 "
        "rounds of ONE local epoch; about 50 s per run), reduced-all-clients (the same with all 100 clients in every "
        "round instead of 10, the reference code's setting for its splitting methods; about 10x the cost) or full "
        "(convex: adds the heterogeneity, noise, partial-participation, diminishing-step and DP settings, 3 seeds, "
        "about 1.5 hours per seed at one thread (measured: least squares 11 min, logistic 75 min, two runs side by "
        "side on 2 cores); CNN: 100 rounds of 10 local epochs, 4 seeds, about 10 s per round: days)."))],
    seeds: Seeds = None, only_seeds: OnlySeeds = None, rounds: Rounds = None, settings: Settings = None,
    methods: Methods = None, dry_run: DryRun = False, tables_only: TablesOnly = False,
    workers: Annotated[int, typer.Option(
        "--workers", help="Worker processes sharing the CNN runs (each runs once, in one of them; the convex runs "
                          "stay in this process), each with this process's torch threads divided among them.")] = 1,
) -> None:
    """The operator-splitting family (FedAvg, FedProx, FedSplit, FedPi, FedRP, Anderson) on the convex problems of
    specs/operator_splitting.md in float64, and on the reference CNN. Writes OUT/results.csv, results.md, plots/,
    runs/."""
    from dpfl.reproduce.splitting import describe, run_study

    wanted = method_list(methods)
    command = command_line(["dpfl reproduce splitting --scale", scale, "--out", str(out)],
                           (("seeds", seeds), ("rounds", rounds), ("settings", settings), ("methods", methods),
                            ("only-seeds", only_seeds)))
    one_of_dry_run_and_tables_only(dry_run, tables_only)
    only = seed_list(only_seeds, tables_only)
    check_workers(workers, dry_run, tables_only)
    if dry_run:
        with _study_errors(out):
            for line in describe(scale, out, seeds=seeds, rounds=rounds, settings_pattern=settings, methods=wanted,
                                 only_seeds=only):
                say(line)
        return
    _run_study("splitting", scale, out, f"in {out / 'logs'}",
               lambda progress: run_study(scale, out, seeds=seeds, rounds=rounds, settings_pattern=settings,
                                          methods=wanted, only_seeds=only, progress=progress, command=command,
                                          compute=not tables_only, workers=workers))


def _study_outcome(name: str, scale: str, rows: list[dict[str, Any]], md_path: Path, csv_path: Path,
                   tracebacks: str) -> None:
    """Counts of a study's runs and where its results are; exit code 1 if any run failed."""
    failed = [r for r in rows if r["status"] != "ok"]
    console.print(f"{name} ({scale}): {len(rows) - len(failed)} ok, {len(failed)} failed", highlight=False)
    console.print(f"results: {md_path}  {csv_path}", highlight=False)
    if failed:
        errors.print(f"error: {len(failed)} run(s) failed (tracebacks {tracebacks})", markup=False)
        raise typer.Exit(1)


def _run_study(name: str, scale: str, out: Path, tracebacks: str, study: Any) -> None:
    """`study(progress)` -> (csv path, md path, rows), its problems as one line (user errors, an unwritable --out),
    then the study's outcome."""
    with _study_errors(out):
        csv_path, md_path, rows = study(lambda m: errors.print(m, markup=False, highlight=False))
    _study_outcome(name, scale, rows, md_path, csv_path, tracebacks)


@contextmanager
def _study_errors(out: Path) -> Iterator[None]:
    """A study's problems as one line and exit code 2: user errors (bad scale, pattern, ...), an unwritable --out and
    a worker process that died (--workers)."""
    from dpfl.reproduce.workers import WorkerDied

    try:
        yield
    except (*user_errors(), WorkerDied) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except OSError as e:
        fail(f"could not write to {out}: {e}")


def reproduce_mpdp(
    out: Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (digits MLP at nominal per-round epsilon 3, 30 and 300; K = 100 on an n-out graph; Fashion-MNIST when "
        "found; 2 seeds; a few minutes) or full (CIFAR-10/100 with norm-free tied-residual ResNets at epsilon 1 and "
        "3, 3 seeds, when the files are found locally: days of CPU; BreakHis listed as skipped) or overfit (a "
        "Fashion-MNIST MLP on 100 records per client for 400 full-batch rounds, so FedAvg overfits and membership "
        "inference has something to find; epsilon 3, 30 and 300, 3 seeds; about an hour)."))],
    seeds: Seeds = None, only_seeds: OnlySeeds = None, rounds: Rounds = None, settings: Settings = None,
    methods: Methods = None,
    inversion_steps: Annotated[Optional[int], typer.Option("--inversion-steps", help=(
        "Steps of each gradient-inversion attack on client 0's probe upload (default 200, as `reproduce attacks`; "
        "0 skips the inversion)."))] = None,
    dry_run: DryRun = False, tables_only: TablesOnly = False, workers: Workers = 1,
) -> None:
    """MP-DP (bidirectional privacy) against MP-DP with an oracle clip, MP-DP-Naive, MP-CDP and FedAvg on the same
    FedSGD rounds, with the attacks of spec §10 on each run; TP-SMC (threshold Paillier, slow) only when --methods
    names tp_smc. Writes OUT/results.csv, results.md and runs/."""
    from dpfl.reproduce.mpdp import INVERSION_STEPS, describe, run_study

    one_of_dry_run_and_tables_only(dry_run, tables_only)
    only = seed_list(only_seeds, tables_only)
    check_workers(workers, dry_run, tables_only)
    wanted = method_list(methods)
    command = command_line(["dpfl reproduce mpdp --scale", scale, "--out", str(out)],
                           (("seeds", seeds), ("rounds", rounds), ("settings", settings), ("methods", methods),
                            ("inversion-steps", inversion_steps), ("only-seeds", only_seeds)))
    steps = INVERSION_STEPS if inversion_steps is None else inversion_steps
    grid = {"seeds": seeds, "methods": wanted, "rounds": rounds, "settings_pattern": settings, "inversion_steps": steps}
    if dry_run:
        with _study_errors(out):
            lines = describe(scale, out, only_seeds=only, **grid)
        for line in lines:
            say(line)
        return
    _run_study("mpdp", scale, out, "in the run directories",
               lambda progress: run_study(scale, out, only_seeds=only, compute=not tables_only, command=command,
                                          progress=progress, workers=workers, **grid))


def reproduce_attacks(
    out: Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (Fashion-MNIST, 20 clients, 784-128-10 MLP, 20 rounds: FedAvg, record-level DP-SGD and client-level "
        "central DP at epsilon 1, 3, 8; about 10 minutes) or overfit (500 images on 10 clients trained for 100 rounds "
        "of 5 epochs, so FedAvg overfits and membership inference has something to find; epsilon 1, 8, 100)."))],
    rounds: Rounds = None,
    seeds: Annotated[Optional[int], typer.Option("--seeds", help=(
        "Seeds 0..N-1 of every setting (default 1: seed 0; another seed's directory is "
        "runs/<setting>-seed<s>)."))] = None,
    settings: Annotated[Optional[str], typer.Option("--settings", help=(
        "Only settings matching this fnmatch pattern (comma-separated alternatives): fedavg, dpsgd-eps1, dpsgd-eps3, "
        "dpsgd-eps8, client-eps1, client-eps3, client-eps8 (overfit: eps1, eps8, eps100); e.g. 'dpsgd-*'."))] = None,
    dry_run: DryRun = False, tables_only: TablesOnly = False, workers: Workers = 1,
) -> None:
    """Gradient inversion, membership inference and an empirical epsilon audit of FedAvg, DP-SGD and client-level
    DP. Writes OUT/results.csv, results.md and runs/."""
    from dpfl.reproduce.attacks import describe, run_study

    command = command_line(["dpfl reproduce attacks --scale", scale, "--out", str(out)],
                           (("rounds", rounds), ("seeds", seeds), ("settings", settings)))
    one_of_dry_run_and_tables_only(dry_run, tables_only)
    check_workers(workers, dry_run, tables_only)
    n_seeds = 1 if seeds is None else seeds
    if dry_run:
        with _study_errors(out):
            for line in describe(scale, out, rounds=rounds, pattern=settings, seeds=n_seeds):
                say(line)
        return
    _run_study("attacks", scale, out, "in the run directories (error.txt)",
               lambda progress: run_study(scale, out, rounds=rounds, settings_pattern=settings, seeds=n_seeds,
                                          compute=not tables_only, command=command, progress=progress, workers=workers))


def reproduce_fdp_sensitivity(
    out: Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (digits + logistic regression with its exact smoothness constant, so the worst-case recursion is drawn; "
        "about 25 s) or full (spec §7: CIFAR-10/ResNet-18 if present, else Fashion-MNIST/LeNet-5, else digits/mlp2; "
        "10 settings x 3 seeds x 600 rounds; on Fashion-MNIST about 6 hours per setting and seed on one core)."))],
    seeds: Seeds = None, rounds: Rounds = None,
    coupled_only: Annotated[bool, typer.Option("--coupled-only", help="Skip the independent-noise neighbour run "
                                                                      "(a quarter less work).")] = False,
    settings: Annotated[Optional[str], typer.Option(
        "--settings", help="Comma-separated glob patterns of setting names, e.g. 'fedavg,fedprox-*' (full scale also "
                           "has fedavg-m10, fedavg-K1, fedavg-V1, ...).")] = None,
    tables_only: Annotated[bool, typer.Option(
        "--tables-only", help="Rewrite sensitivity.{csv,json,md,png} from the pairs already finished under --out "
                              "(OUT/pairs); compute nothing. Without it, finished pairs are read back and only the "
                              "missing ones computed.")] = False,
) -> None:
    """Empirical sensitivity of Noisy-FedAvg/FedProx (spec fdp_accounting.md §7): ‖w_t − w′_t‖ per round for
    neighbouring datasets with shared seeds. Writes OUT/sensitivity.{csv,json,md,png}."""
    from dpfl.reproduce.fdp_sensitivity import ControlPairError, run_sensitivity

    try:
        result = run_sensitivity(scale, out, seeds=seeds, rounds=rounds, progress=say, settings_pattern=settings,
                                 couplings=("coupled",) if coupled_only else ("coupled", "independent"),
                                 compute=not tables_only)
    except ControlPairError as e:  # not a user error: the runs were not deterministic
        errors.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(1) from e
    except user_errors() as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except OSError as e:
        fail(f"could not write to {out}: {e}")
    say("sensitivity: " + "  ".join(str(p) for p in result.paths.values()))

"""`dpfl reproduce`: reproduce a paper's comparison, every method on the same data, budgets and seeds. The grid
families (pfa, robust-hdp, fedceo, fdp-accuracy, rdpcfl: `dpfl.reproduce.families`) and their other modes (the
noise table, FedCEO's search and gradient-inversion hook, R-DPCFL's b^1 analysis) are here, the studies that are not
grids (splitting, mpdp, attacks, fdp-sensitivity) in `reproduce_studies`; `merge` joins a grid's results.csv files.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dpfl.cli import reproduce_studies as studies
from dpfl.cli.common import console, errors, fail, say, user_errors
from dpfl.cli.reproduce_options import (Datasets, DryRun, Methods, OnlySeeds, Out, Overrides, Rounds, Scale, Seeds,
                                        Settings, TablesOnly, Workers, check_workers, command_line, grid_overrides,
                                        method_list, one_of_dry_run_and_tables_only, seed_list)


def _reproduce(paper: str, out: Path, scale: str, seeds: Optional[int], rounds: Optional[int], settings: Optional[str],
               methods: Optional[str], datasets: Optional[list[str]], dry_run: bool, tables_only: bool = False,
               *, only_seeds: Optional[str] = None, workers: int = 1, overrides: Optional[list[str]] = None,
               **grid_options: Any) -> None:
    """The grid families' commands (`dpfl.reproduce.families`): plan the grid, list it (--dry-run) or run it (or,
    --tables-only, collect its finished runs) and write the results. `overrides` (--set) apply to every job after
    the grid's own."""
    from dpfl.reproduce import families
    from dpfl.reproduce.runner import FAILED, describe_jobs
    from dpfl.reproduce.workers import WorkerDied

    one_of_dry_run_and_tables_only(dry_run, tables_only)
    only = seed_list(only_seeds, tables_only)
    check_workers(workers, dry_run, tables_only)
    names = families.dataset_names(datasets)
    extra = grid_overrides(overrides)
    command = " ".join(["dpfl reproduce", paper, "--scale", scale, "--out", str(out)]
                       + [f"--{k.replace('_', '-')} {v}" for k, v in grid_options.items() if v]
                       + [f"--dataset {d}" for d in names if datasets]
                       + [f"--{k} {v}" for k, v in (("seeds", seeds), ("rounds", rounds), ("settings", settings),
                                                   ("methods", methods), ("only-seeds", only_seeds))
                          if v is not None]
                       + [f"--set {shlex.quote(x)}" for x in extra])
    try:
        grid = families.plan(paper, scale, datasets=names, seeds=seeds, rounds=rounds, settings_pattern=settings,
                             methods=method_list(methods), extra=extra, only_seeds=only, **grid_options)
        if dry_run:
            for line in describe_jobs(grid, out):
                say(line)
            return
        outcomes, csv_path, md_path = families.run(paper, grid, out, command=command, tables_only=tables_only,
                                                   workers=workers, progress_console=errors)
    except (*user_errors(), WorkerDied) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    failed = [o for o in outcomes if o.status == FAILED]
    counts = families.status_counts(outcomes)
    console.print(f"{paper} ({grid.label}): " + ", ".join(f"{n} {s}" for s, n in counts.items()), highlight=False)
    console.print(f"results: {md_path}  {csv_path}", highlight=False)
    if failed:
        errors.print(f"error: {len(failed)} run(s) failed (status 'failed' in results.csv; tracebacks in "
                     f"{out / 'logs'})", markup=False, highlight=False)
        raise typer.Exit(1)


def reproduce_pfa(
    out: Out, scale: Scale, seeds: Seeds = None, only_seeds: OnlySeeds = None, rounds: Rounds = None,
    settings: Settings = None, methods: Methods = None, dataset: Datasets = None,
    calibration: Annotated[Optional[str], typer.Option(
        help="accountant (RDP + Poisson), pfa-heuristic (the paper's formula + fixed-size batches) or both; default "
             "accountant at full scale, both at ci.")] = None,
    dry_run: DryRun = False, tables_only: TablesOnly = False, workers: Workers = 1, set_: Overrides = None,
) -> None:
    """PFA's comparison (PVLDB 2022): np_fedavg, max_eps, pfa, pfa_plus, weiavg, fedavg, min_eps."""
    _reproduce("pfa", out, scale, seeds, rounds, settings, methods, dataset, dry_run, tables_only,
               only_seeds=only_seeds, workers=workers, overrides=set_, calibration=calibration)


def reproduce_robust_hdp(
    out: Out, scale: Scale, seeds: Seeds = None, only_seeds: OnlySeeds = None, rounds: Rounds = None,
    settings: Settings = None, methods: Methods = None, dataset: Datasets = None, dry_run: DryRun = False,
    tables_only: TablesOnly = False, workers: Workers = 1,
    noise_table: Annotated[bool, typer.Option(
        "--noise-table", help="Only the round-1 noise statistic table (thesis Table 3.4): each setting calibrated "
                              "for its full planned length, round 1 trained once, every aggregator on the same "
                              "uploads. Writes OUT/noise_table.{csv,md}; ignores --rounds/--seeds/--methods.")] = False,
    set_: Overrides = None,
) -> None:
    """Robust-HDP's comparison (ICML 2024): 7 methods on Dist1..9, plus the falsified-budget scenario."""
    if noise_table:
        if only_seeds is not None:
            fail("--only-seeds applies to the comparison (the noise table trains round 1 once per setting)")
        if tables_only:
            fail("--tables-only applies to the comparison (the noise table reuses its saved pairs anyway)")
        if workers != 1:
            fail("--workers applies to the comparison (the noise table trains round 1 once per setting)")
        if set_:
            fail("--set applies to the comparison (the noise table uses each setting as the thesis defines it)")
        _noise_table(out, scale, settings, dataset)
        return
    _reproduce("robust-hdp", out, scale, seeds, rounds, settings, methods, dataset, dry_run, tables_only,
               only_seeds=only_seeds, workers=workers, overrides=set_)


def reproduce_mechanisms(
    out: Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (500 clients, about 20 a round, 50 rounds, 12 methods x 3 seeds: a few minutes on 2 cores) or full "
        "(3,000 clients, about 100 a round, 200 rounds)."))],
    seeds: Seeds = None, only_seeds: OnlySeeds = None, rounds: Rounds = None, settings: Settings = None,
    methods: Methods = None, dry_run: DryRun = False, tables_only: TablesOnly = False, workers: Workers = 1,
    set_: Overrides = None,
) -> None:
    """Adaptive clipping and FedAdam against DP-FedAvg's fixed clip (tuned and untuned), central DP on
    Fashion-MNIST."""
    _reproduce("mechanisms", out, scale, seeds, rounds, settings, methods, None, dry_run, tables_only,
               only_seeds=only_seeds, workers=workers, overrides=set_)


def _noise_table(out: Path, scale: str, settings: Optional[str], datasets: Optional[list[str]]) -> None:
    from dpfl.reproduce.families import dataset_names
    from dpfl.reproduce.noise_table import planned_configs, write_noise_table

    names = dataset_names(datasets)
    try:
        configs, label = planned_configs(scale, datasets=names, settings_pattern=settings)
        csv_path, md_path = write_noise_table(
            configs, out, label=label,
            on_setting=lambda s: errors.print(f"noise table: {s} ...", markup=False, highlight=False))
    except user_errors() as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    console.print(f"noise table: {md_path}  {csv_path}", highlight=False)


def reproduce_fedceo(
    out: Out,
    scale: Annotated[str, typer.Option("--scale", help="ci (minutes: checks that it runs), reduced (the full setting "
                                                       "with T = 50, E = 1: about 2 minutes per seed) or full (the "
                                                       "paper's T = 300, E = 30: about 10 minutes per run on one "
                                                       "core, 15 runs).")],
    seeds: Seeds = None, only_seeds: OnlySeeds = None, rounds: Rounds = None, settings: Settings = None,
    methods: Methods = None,
    dataset: Annotated[Optional[list[str]], typer.Option(
        "--dataset", help="fashion_mnist (the default); at --scale full also the paper's own emnist (mlp2) and "
                          "cifar10 (lenet5), skipped when their files are missing. Repeatable or comma-separated.")
    ] = None,
    dry_run: DryRun = False,
    search: Annotated[bool, typer.Option(
        "--search", help="Instead of the comparison: choose FedCEO's lambda, theta, I per sigma_g on the clients' "
                         "validation splits (coordinate search over the spec's grids, one seed). Writes "
                         "OUT/search.{csv,md,json}; honours --rounds, --settings and --set.")] = False,
    search_result: Annotated[Optional[Path], typer.Option(
        "--search-result", help="The comparison with FedCEO's lambda, theta, I from this search.json (written by "
                                "--search at the same --scale, --rounds, --set and variant) for the sigma_g it runs; "
                                "refused if one of those is incomplete, or from another scale, --set or "
                                "variant.")] = None,
    dlg: Annotated[bool, typer.Option(
        "--dlg", help="Instead of the comparison: the gradient-inversion hook (spec §8, offline variant: mlp2 on "
                      "Fashion-MNIST, the ci config): DLG and Inverting Gradients on one client's upload for FedAvg "
                      "and at each sigma_g, and on FedCEO's smoothed model after smoothings 1 and 4. Writes "
                      "OUT/dlg.{csv,md} and OUT/<point>/inversion.{json,png}; about 30 s per point.")] = False,
    partition: Annotated[Optional[str], typer.Option(
        "--partition", help="iid (the default) or shards (non-i.i.d.: 2 label-sorted shards per client, spec §5). "
                            "Fashion-MNIST only; the settings' names carry it (fmnist-mlp-shards-sg1.5).")] = None,
    mechanism: Annotated[Optional[str], typer.Option(
        "--mechanism", help="dpsgd (the default, the authors' code) or udp (the paper's Algorithm 1: client-level "
                            "DP, the update clipped and noised per upload; lambda must be re-tuned with --search). "
                            "Fashion-MNIST only.")] = None,
    tune_ablation: Annotated[bool, typer.Option(
        "--tune-ablation", help="With --search: also choose the theta = 1 ablation's own lambda (a third stage, the "
                                "lambda grid at the chosen I); the comparison's fedceo_theta1 then uses it.")] = False,
    tables_only: TablesOnly = False, workers: Workers = 1, set_: Overrides = None,
) -> None:
    """FedCEO's comparison (ICML 2025): udp_fedavg, ppsgd, centaur, fedceo_theta1, fedceo at sigma_g 1.0/1.5/2.0."""
    if set_ and dlg:
        fail("--set applies to the comparison and --search, not to --dlg")
    if tables_only and (dlg or search):
        fail("--tables-only applies to the comparison, not to --search or --dlg")
    if only_seeds is not None and (dlg or search):
        fail("--only-seeds applies to the comparison, not to --search or --dlg")
    if workers != 1 and (dlg or search):
        fail("--workers applies to the comparison, not to --search or --dlg")
    if dlg:
        _fedceo_dlg(out, scale, search or search_result is not None or any(
            v is not None for v in (seeds, rounds, settings, methods, dataset, partition, mechanism)) or dry_run
            or tune_ablation)
        return
    if search:
        if search_result is not None:
            fail("--search-result sets the comparison's values: it does not apply to --search")
        _fedceo_search(out, scale, rounds, settings, dataset, seeds, methods, dry_run, partition, mechanism,
                       tune_ablation, grid_overrides(set_))
        return
    if tune_ablation:
        fail("--tune-ablation is a stage of --search (the comparison takes its choice through --search-result)")
    _reproduce("fedceo", out, scale, seeds, rounds, settings, methods, dataset, dry_run, tables_only,
               only_seeds=only_seeds, workers=workers, overrides=set_, search_result=search_result,
               partition=partition, mechanism=mechanism)


def _fedceo_dlg(out: Path, scale: str, other_options: bool) -> None:
    from dpfl.reproduce.fedceo_dlg import run_dlg_study

    if other_options:
        fail("--dlg runs the spec's offline variant as it is: it takes only --out (and --scale ci)")
    if scale != "ci":
        fail("--dlg is the offline variant on the ci config: use --scale ci (the paper's CIFAR-10 LeNet setting "
             "needs CIFAR-10 files)")
    try:
        csv_path, md_path, _ = run_dlg_study(out, command=f"dpfl reproduce fedceo --dlg --scale ci --out {out}",
                                             progress=say)
    except user_errors() as e:
        fail(str(e).splitlines()[0])
    say(f"wrote {csv_path} and {md_path}")


def _fedceo_search(out: Path, scale: str, rounds: Optional[int], settings: Optional[str],
                   datasets: Optional[list[str]], seeds: Optional[int], methods: Optional[str], dry_run: bool,
                   partition: Optional[str], mechanism: Optional[str], tune_ablation: bool,
                   extra: tuple[str, ...] = ()) -> None:
    from dpfl.reproduce.families import dataset_names
    from dpfl.reproduce.fedceo import Variant
    from dpfl.reproduce.fedceo_search import run_search
    from dpfl.reproduce.runner import FAILED, RichProgress

    if seeds is not None or methods or dry_run:
        fail("--search runs its own grid with one seed: --seeds, --methods and --dry-run do not apply (its "
             "stage-2 runs depend on stage 1's results)")
    if any(d != "fashion_mnist" for d in dataset_names(datasets)):
        fail("--dataset: the FedCEO search runs on fashion_mnist only (the paper's datasets have its Table 2 values)")
    command = " ".join(["dpfl reproduce fedceo --search --scale", scale, "--out", str(out)]
                       + [f"--{k} {v}" for k, v in (("rounds", rounds), ("settings", settings),
                                                   ("partition", partition), ("mechanism", mechanism))
                          if v is not None]
                       + (["--tune-ablation"] if tune_ablation else [])
                       + [f"--set {shlex.quote(x)}" for x in extra])
    try:
        variant = Variant.of(partition, mechanism)
        with RichProgress(errors) as progress:
            result = run_search(scale, out, progress=progress, rounds=rounds, settings_pattern=settings,
                                command=command, variant=variant, tune_ablation=tune_ablation, extra=extra)
    except user_errors() as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    for sigma, c in result.chosen.items():
        state = "" if c["complete"] else f"; INCOMPLETE: {c['runs']} of {c['planned']} runs finished"
        ablation = f"; theta = 1 ablation: lambda {c['ablation_lam']:g}" if "ablation_lam" in c else ""
        console.print(f"sigma_g {sigma}: lambda {c['lam']:g}, theta {c['theta']:g}, I {c['interval']} "
                      f"(val acc {c['val_accuracy']:.4f}; udp_fedavg {c['udp_fedavg_val_accuracy'] or float('nan'):.4f}"
                      f"{ablation}{state})", highlight=False)
    console.print("search: " + "  ".join(str(p) for p in result.paths), highlight=False)
    failed = [r for r in result.rows if r["status"] == FAILED]
    if failed:
        errors.print(f"error: {len(failed)} search run(s) failed (tracebacks in {out / 'logs'})", markup=False)
        raise typer.Exit(1)


def reproduce_fdp_accuracy(
    out: Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (seconds per run: digits + logistic regression, checks that it runs), reduced (Fashion-MNIST + LeNet-5 "
        "as a STAND-IN for MNIST, m = 20, K = 10, T = 12, 4 sigmas x 2 seeds = 8 runs; measured 80 s per run on "
        "one core of a shared 2-core machine, about 11 minutes in all) or full (the paper's grid: "
        "MNIST/LeNet-5 and CIFAR-10/ResNet-18, 3 (K, T) pairs x 3 m x 4 sigmas x 5 seeds = 360 runs; datasets "
        "not on this machine are skipped)."))],
    seeds: Seeds = None, only_seeds: OnlySeeds = None, rounds: Rounds = None, settings: Settings = None,
    methods: Methods = None,
    dataset: Annotated[Optional[list[str]], typer.Option(
        "--dataset", help="Default per scale: full mnist,cifar10 (fashion_mnist adds a stand-in for mnist), reduced "
                          "fashion_mnist, ci digits. Repeatable or comma-separated.")] = None,
    dry_run: DryRun = False, tables_only: TablesOnly = False, workers: Workers = 1, set_: Overrides = None,
) -> None:
    """The f-DP paper's accuracy study (spec fdp_accounting.md §8): Noisy-FedAvg accuracy against sigma, m, (K, T),
    next to the accountant's mu and epsilon per configuration."""
    from dpfl.reproduce import fdp_accuracy
    from dpfl.reproduce.families import dataset_names

    names = dataset_names(dataset) if dataset else list(fdp_accuracy.DEFAULT_DATASETS.get(scale, ())) or None
    _reproduce("fdp-accuracy", out, scale, seeds, rounds, settings, methods, names, dry_run, tables_only,
               only_seeds=only_seeds, workers=workers, overrides=set_)


def reproduce_rdpcfl(
    out: Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (Fashion-MNIST rotation, 21 clients x 1,000 records, 20 rounds, eps 5, 2 seeds, 7 methods; about 4-9 "
        "minutes per run on one core) or full (the "
        "thesis grid: rotation / label flip / label shift at N_i = 8000, E = 200, eps 3/4/5/10/15, 4 seeds: weeks "
        "on a CPU; MNIST rotation where its files exist)."))],
    seeds: Seeds = None, only_seeds: OnlySeeds = None, rounds: Rounds = None, settings: Settings = None,
    methods: Methods = None,
    dataset: Datasets = None, dry_run: DryRun = False,
    epsilons: Annotated[Optional[str], typer.Option(
        "--epsilons", help="Comma-separated eps_total values replacing the scale's (ci: 5; full: "
                           "3,4,5,10,15).")] = None,
    round1_analysis: Annotated[bool, typer.Option(
        "--round1-analysis", help="Instead of the comparison: the spec's b^1 analysis. Each point trains round 1 "
                                  "of an R-DPCFL run (noise calibrated for its planned length) and clusters it; "
                                  "writes OUT/round1_analysis.{csv,md} (MSS, EM iterations, centre distance, "
                                  "partition recovered). About 4 minutes per point at full scale.")] = False,
    round1_batches: Annotated[Optional[str], typer.Option(
        "--round1-batches", help="With --round1-analysis: comma-separated b^1 values ('full' or integers; default "
                                 "ci 32,128,512,full, full 32,128,512,2048,full).")] = None,
    tables_only: TablesOnly = False, workers: Workers = 1, set_: Overrides = None,
) -> None:
    """R-DPCFL's comparison (TMLR 2025): rdpcfl, ifca, global, local, mr_mtl, oracle, fedavg on planted clusters.
    Writes OUT/results.csv (mean_acc, minority_acc, ari, clusters_found, ... per run), results.md, plots/."""
    if round1_analysis and workers != 1:
        fail("--workers applies to the comparison, not to --round1-analysis")
    if round1_analysis and set_:
        fail("--set applies to the comparison, not to --round1-analysis")
    if round1_analysis:
        _rdpcfl_round1(out, scale, seeds, rounds, settings, methods, dataset, dry_run, epsilons, round1_batches,
                       tables_only, only_seeds)
        return
    if round1_batches is not None:
        fail("--round1-batches applies to --round1-analysis only")
    _reproduce("rdpcfl", out, scale, seeds, rounds, settings, methods, dataset, dry_run, tables_only,
               only_seeds=only_seeds, workers=workers, overrides=set_, epsilons=epsilons)


def _rdpcfl_round1(out: Path, scale: str, seeds: Optional[int], rounds: Optional[int], settings: Optional[str],
                   methods: Optional[str], datasets: Optional[list[str]], dry_run: bool, epsilons: Optional[str],
                   batches: Optional[str], tables_only: bool, only_seeds: Optional[str]) -> None:
    from dpfl.reproduce.families import dataset_names
    from dpfl.reproduce.jobs import select_seeds
    from dpfl.reproduce.rdpcfl_round1 import analysis_grid, run_analysis

    one_of_dry_run_and_tables_only(dry_run, tables_only)
    only = seed_list(only_seeds, tables_only, "compute")
    if rounds is not None or methods:
        fail("--round1-analysis: --rounds and --methods do not apply (each point is R-DPCFL calibrated for the "
             "scale's planned rounds; choose b^1 with --round1-batches)")
    command = command_line(["dpfl reproduce rdpcfl --round1-analysis --scale", scale, "--out", str(out)],
                           (("seeds", seeds), ("settings", settings), ("epsilons", epsilons),
                            ("round1-batches", batches), ("only-seeds", only_seeds)))
    try:
        grid = analysis_grid(scale, datasets=dataset_names(datasets), seeds=seeds, settings_pattern=settings,
                             batches=[b.strip() for b in batches.split(",") if b.strip()] if batches else None,
                             epsilons=epsilons)
        grid = select_seeds(grid, only)
        if dry_run:
            console.print(f"R-DPCFL b^1 analysis, scale {grid.label}: {len(grid.jobs)} points -> {out / 'round1'}",
                          markup=False, highlight=False)
            for j in grid.jobs:
                say(f"{j.setting} b^1={j.method[1:]} seed {j.seed}")
            return
        done = iter(range(1, len(grid.jobs) + 1))
        states: list[str] = []  # --tables-only: one summary line instead of a line per point

        def on_point(j: Any, what: str) -> None:
            states.append(what)
            if not tables_only:
                console.print(f"[{next(done)}/{len(grid.jobs)}] {j.setting} b^1={j.method[1:]} seed{j.seed}: {what}",
                              markup=False, highlight=False)

        csv_path, md_path, _ = run_analysis(grid, out, command=command, compute=not tables_only, on_point=on_point)
    except user_errors() as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    if tables_only:
        console.print(f"{states.count('saved before')} of the selection's {len(states)} points saved before; the "
                      "others not computed (--tables-only)", highlight=False)
    console.print(f"results: {md_path}  {csv_path}", highlight=False)


def reproduce_merge(
    inputs: Annotated[list[Path], typer.Argument(help="results.csv files of one grid (the first sets the order).")],
    out: Annotated[Path, typer.Option(help="The merged CSV (may be one of the inputs; written once all are read).")],
    key: Annotated[str, typer.Option(help="Comma-separated columns that name one run (one row per key), in the "
                                          "order rows are sorted by.")] = "setting,seed,method",
    new_columns: Annotated[bool, typer.Option(
        "--new-columns", help="Keep a column only some inputs have (one a newer dpfl added, e.g. cpu_seconds): "
                              "empty in the rows of inputs without it.")] = False,
) -> None:
    """Merge the results.csv files of one grid run in pieces (sessions, machines, --only-seeds) into one CSV.

    Refuses different columns (unless --new-columns) and two different rows for one key; identical rows are kept
    once; cells are copied as text; rows are sorted by the key (numbers numerically, other values in the order they
    first appear); the inputs' leading `#` lines (provenance) are kept once each, above the header."""
    from dpfl.reproduce.merge import MergeError, merge_csv_files, row_count
    from dpfl.results.run_files import write_text_atomic

    columns = tuple(c.strip() for c in key.split(","))
    try:
        text = merge_csv_files(inputs, columns, new_columns=new_columns)
        write_text_atomic(out, text)
    except MergeError as e:
        fail(str(e))
    except OSError as e:
        fail(f"--out {out}: {e.strerror or e}")
    console.print(f"merged {len(inputs)} files: {row_count(text)} rows -> {out}", highlight=False)


reproduce_app = typer.Typer(no_args_is_help=True, help="Reproduce a paper's comparison: every method on the same "
                            "data, budgets and seeds; results.csv, results.md and plots.")
# in the order `dpfl reproduce --help` lists them
reproduce_app.command("pfa")(reproduce_pfa)
reproduce_app.command("robust-hdp")(reproduce_robust_hdp)
reproduce_app.command("fedceo")(reproduce_fedceo)
reproduce_app.command("fdp-accuracy")(reproduce_fdp_accuracy)
reproduce_app.command("rdpcfl")(reproduce_rdpcfl)
reproduce_app.command("mechanisms")(reproduce_mechanisms)
reproduce_app.command("splitting")(studies.reproduce_splitting)
reproduce_app.command("mpdp")(studies.reproduce_mpdp)
reproduce_app.command("attacks")(studies.reproduce_attacks)
reproduce_app.command("fdp-sensitivity")(studies.reproduce_fdp_sensitivity)
reproduce_app.command("merge")(reproduce_merge)

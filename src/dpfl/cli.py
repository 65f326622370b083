"""The `dpfl` command: run private federated experiments, inspect privacy, data and results.

User errors (bad config, bad arguments, missing data, an existing run directory) print one line to
stderr and exit with code 2; only bugs show a traceback.

This module holds the commands, their options and the checks of their arguments; what they print lives
in ``dpfl.results`` (``outcome``: a finished run; ``fdp_output``: f-DP curves; ``json_output``: --json).
"""

from __future__ import annotations

import math
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dpfl.engine.backends.errors import BackendError
from dpfl.results.formatting import accuracy_words, format_epsilon, round_accuracy
from dpfl.results.json_output import emit_json

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Differentially private federated learning with per-client privacy ledgers.")
privacy_app = typer.Typer(no_args_is_help=True,
                          help="Privacy accounting: epsilon of a mechanism, or noise for a target.")
data_app = typer.Typer(no_args_is_help=True, help="Datasets: what is available locally, and fetching.")
reproduce_app = typer.Typer(no_args_is_help=True, help="Reproduce a paper's comparison: every method on the same "
                            "data, budgets and seeds; results.csv, results.md and plots.")
app.add_typer(privacy_app, name="privacy")
app.add_typer(data_app, name="data")
bench_app = typer.Typer(no_args_is_help=True, help="Measure the cost of dpfl's protocols on this machine.")
attack_app = typer.Typer(no_args_is_help=True, help="Attacks that measure what a run's mechanism stops in practice.")
app.add_typer(attack_app, name="attack")
app.add_typer(reproduce_app, name="reproduce")
app.add_typer(bench_app, name="bench")

console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)

USAGE_ERROR = 2


class UserError(Exception):
    """An error the user can fix; printed as one line, exit code 2."""


def _fail(message: str) -> None:
    errors.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(USAGE_ERROR)


def _user_errors():
    """The exception types that are the user's to fix (validated input, files, existing runs)."""
    from dpfl.data.errors import DatasetNotFoundError

    return (UserError, ValueError, FileNotFoundError, DatasetNotFoundError)


# ---- run and demo -----------------------------------------------------------------------------------
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

        return execute(cfg, out, resume=resume, on_round=on_round, on_start=on_start)


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


@app.command()
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
) -> None:
    """Run a federated experiment described by a YAML config (an MP-DP config, `scheme: mpdp`, runs its `method`)."""
    from dpfl.experiment.config import load_config
    from dpfl.experiment.mpdp_directory import is_mpdp_config
    from dpfl.results.outcome import print_outcome

    try:
        if config.is_file() and is_mpdp_config(config):
            if resume:
                raise UserError("--resume: MP-DP runs keep no checkpoints (the server's secrets are per round); "
                                "re-run into a new --out")
            if import_:
                raise UserError("--import: MP-DP configs name their data and network directly")
            _run_mpdp(config, list(set_ or []), out)
            return
        _import_plugins(import_ or [])
        cfg = load_config(config, list(set_ or []))
        out = out or Path("runs") / cfg.name
        summary = _run_with_progress(cfg, out, resume)
        print_outcome(out, console, summary)
    except _user_errors() as e:
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except BackendError as e:  # workers lost twice in a round: the run keeps its last checkpoint
        _fail(f"{e}; continue from the last checkpoint with: dpfl run {config} --resume"
              + (f" --out {out}" if out is not None else ""))


def _run_mpdp(config: Path, sets: list[str], out: Optional[Path]) -> None:
    """An MP-DP run (`dpfl.experiment.mpdp_directory`): flat `--set field=value` overrides, then the outcome."""
    import yaml

    from dpfl.evaluate.mpdp_attacks import client_attacks
    from dpfl.experiment.mpdp_config import load_mpdp_config
    from dpfl.experiment.mpdp_directory import execute_mpdp
    from dpfl.results.mpdp_outcome import print_mpdp_outcome

    overrides: dict[str, Any] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item!r}: expected field=value")
        overrides[key.strip()] = yaml.safe_load(value)
    cfg = load_mpdp_config(config, **overrides)
    out = out or Path("runs") / cfg.name
    summary = execute_mpdp(cfg, out, progress=lambda line: errors.print(line, markup=False, highlight=False),
                           client_attacks=client_attacks)
    print_mpdp_outcome(out, console, summary)


@app.command()
def demo(out: Annotated[Optional[Path], typer.Option(help="Run directory (default runs/demo-<time>).")] = None) -> None:
    """A short private run on scikit-learn's bundled digits with a different budget per client."""
    from dpfl.experiment.build import build_demo_config
    from dpfl.results.outcome import print_outcome

    try:
        cfg = build_demo_config()
        out = out or Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
        summary = _run_with_progress(cfg, out, resume=False)
        print_outcome(out, console, summary)
    except _user_errors() as e:
        _fail(str(e).splitlines()[0])


# ---- privacy ------------------------------------------------------------------------------------------
def _positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise UserError(f"--{name} must be a finite number > 0, got {value}")


def _check_mechanism_args(accountant: str, sample_rate: float, delta: float, steps: int) -> None:
    """The arguments both privacy commands share: accountant, Poisson rate, delta, steps."""
    if accountant not in ("rdp", "pld"):
        raise UserError(f"--accountant must be 'rdp' or 'pld', got {accountant!r}")
    if not 0 < sample_rate <= 1:
        raise UserError(f"--sample-rate must be in (0, 1], got {sample_rate}")
    if not 0 < delta < 1:
        raise UserError(f"--delta must be in (0, 1), got {delta}")
    if steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")


@privacy_app.command("epsilon")
def privacy_epsilon(
    noise_multiplier: Annotated[float, typer.Option(help="Noise std / clipping norm.")],
    sample_rate: Annotated[float, typer.Option(help="Poisson sampling rate q.")],
    steps: Annotated[int, typer.Option(help="Number of steps composed.")],
    delta: Annotated[float, typer.Option(help="Target delta.")],
    accountant: Annotated[str, typer.Option(help="rdp or pld.")] = "rdp",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Epsilon of the Poisson-sampled Gaussian mechanism composed over STEPS steps."""
    from dpfl.privacy.accountant import epsilon
    from dpfl.privacy.events import dpsgd_event

    try:
        _check_mechanism_args(accountant, sample_rate, delta, steps)
        if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
            raise UserError(f"--noise-multiplier must be a finite number >= 0, got {noise_multiplier}")
        eps = epsilon(dpsgd_event(noise_multiplier, steps, sampling="poisson", sample_rate=sample_rate), delta,
                      accountant)
    except _user_errors() as e:
        _fail(str(e))
    out = {"epsilon": eps, "delta": delta, "noise_multiplier": noise_multiplier, "sample_rate": sample_rate,
           "steps": steps, "accountant": accountant, "mechanism": "Poisson-sampled Gaussian", "relation": "add_remove"}
    if as_json:
        emit_json(out)
    else:
        console.print(f"epsilon = {eps:.6g} at delta = {delta:g} ({accountant.upper()}, Poisson sampling "
                      f"q = {sample_rate:g}, noise multiplier {noise_multiplier:g}, {steps} steps, add/remove "
                      "neighbours)", highlight=False)


@privacy_app.command("noise")
def privacy_noise(
    epsilon_: Annotated[float, typer.Option("--epsilon", help="Target epsilon.")],
    delta: Annotated[float, typer.Option(help="Target delta.")],
    sample_rate: Annotated[float, typer.Option(help="Poisson sampling rate q.")],
    steps: Annotated[int, typer.Option(help="Number of steps composed.")],
    accountant: Annotated[str, typer.Option(help="rdp or pld.")] = "rdp",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Smallest noise multiplier whose epsilon is at most EPSILON (bisection against the accountant)."""
    from dpfl.privacy.accountant import epsilon as eps_of
    from dpfl.privacy.calibration import calibrate_noise_multiplier
    from dpfl.privacy.events import dpsgd_event

    try:
        _check_mechanism_args(accountant, sample_rate, delta, steps)
        _positive("epsilon", epsilon_)
        z = calibrate_noise_multiplier(epsilon_, delta, steps=steps, sampling="poisson", sample_rate=sample_rate,
                                       accountant=accountant)
        achieved = eps_of(dpsgd_event(z, steps, sampling="poisson", sample_rate=sample_rate), delta, accountant)
    except _user_errors() as e:
        _fail(str(e))
    out = {"noise_multiplier": z, "epsilon": achieved, "target_epsilon": epsilon_, "delta": delta,
           "sample_rate": sample_rate, "steps": steps, "accountant": accountant}
    if as_json:
        emit_json(out)
    else:
        console.print(f"noise multiplier = {z:.6g} (gives epsilon = {achieved:.6g} <= {epsilon_:g} at "
                      f"delta = {delta:g}, {accountant.upper()}, q = {sample_rate:g}, {steps} steps)", highlight=False)


# ---- privacy fdp ------------------------------------------------------------------------------------
def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"--{name} must be one of {', '.join(choices)}, got {value!r}")


@privacy_app.command("fdp")
def privacy_fdp(
    algo: Annotated[Optional[str], typer.Option("--algo", help="fedavg or fedprox.")] = None,
    eta: Annotated[Optional[float], typer.Option("--eta", help="Base learning rate η.")] = None,
    K: Annotated[Optional[int], typer.Option("--K", help="Local steps per round.")] = None,
    V: Annotated[Optional[float], typer.Option("--V", help="Gradient clipping norm.")] = None,
    sigma: Annotated[Optional[float], typer.Option("--sigma", help="Per-client noise std added to "
                                                                   "each upload.")] = None,
    m: Annotated[Optional[int], typer.Option("--m", help="Clients per round.")] = None,
    from_run: Annotated[Optional[Path], typer.Option("--from-run", help="A noisy_fedavg/noisy_fedprox run directory: "
                                                     "its config gives every setting (the grid runs to its T).")
                        ] = None,
    schedule: Annotated[str, typer.Option(help="constant, cyclic, stagewise or continuous.")] = "constant",
    L: Annotated[Optional[float], typer.Option("--L", help="Smoothness constant (an ASSUMPTION); enables the "
                                                           "shifted-interpolation bound.")] = None,
    alpha: Annotated[Optional[float], typer.Option("--alpha", help="FedProx proximal coefficient.")] = None,
    t_max: Annotated[Optional[int], typer.Option("--T-max", help="Largest T of a log:N grid (default 10000, or the "
                                                 "run's T with --from-run).")] = None,
    grid: Annotated[str, typer.Option(help="log:N (N log-spaced T up to --T-max) or a list: 1,10,100.")] = "log:60",
    delta: Annotated[Optional[list[float]], typer.Option(help="δ for ε(δ); repeatable (default 1e-5).")] = None,
    view: Annotated[str, typer.Option("--view", help="auto (upload, or aggregate with --secure-aggregation), upload "
                                                     "or aggregate.")] = "auto",
    secure_aggregation: Annotated[bool, typer.Option("--secure-aggregation", help="The deployment hides individual "
                                                     "uploads (selects the aggregate view under --view auto).")
                                  ] = False,
    release: Annotated[str, typer.Option(help="transcript (every w_t is seen) or final (only w_T).")] = "transcript",
    sensitivity: Annotated[str, typer.Option(help="exact or paper (the paper's surrogates).")] = "exact",
    show_paper_claimed: Annotated[bool, typer.Option("--show-paper-claimed", help="Add the paper's claimed curve, "
                                                     "labelled NOT a guarantee (needs --L).")] = False,
    paper_variant: Annotated[Optional[str], typer.Option("--paper-variant", help="printed (default), eta-consistent "
                                                         "or h0; only with --show-paper-claimed.")] = None,
    c: Annotated[Optional[float], typer.Option("--c", help="Constant c of the paper's cyclic surrogate.")] = None,
    z: Annotated[Optional[float], typer.Option("--z", help="Constant z of the paper's continuous surrogate.")] = None,
    honest_clients: Annotated[Optional[int], typer.Option("--honest-clients", help="Clients whose noise the "
                                                          "adversary does not know (default m).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write fdp_curves.{csv,json,png} into this directory.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json.")] = "table",
    as_json: Annotated[bool, typer.Option("--json", help="Same as --format json.")] = False,
) -> None:
    """μ-GDP and ε(δ) of noisy FedAvg/FedProx over T rounds, per bound, under an explicit threat model.

    Either give the hyperparameters (--algo --eta --K --V --sigma --m ...) or --from-run RUN_DIR.
    """
    from dpfl.privacy.fdp import RELEASES, VIEWS, fdp_report, parse_grid
    from dpfl.privacy.fdp_bounds import PAPER_VARIANTS
    from dpfl.privacy.fdp_sensitivity import ALGORITHMS, SCHEDULES
    from dpfl.results.fdp_output import FDP_FORMATS, print_fdp, write_fdp_files

    fmt = "json" if as_json else fmt
    try:
        if from_run is not None:
            given = {"--algo": algo, "--eta": eta, "--K": K, "--V": V, "--sigma": sigma, "--m": m, "--L": L,
                     "--alpha": alpha, "--c": c, "--z": z, "--honest-clients": honest_clients,
                     "--schedule": None if schedule == "constant" else schedule,
                     "--view": None if view == "auto" else view,
                     "--release": None if release == "transcript" else release,
                     "--sensitivity": None if sensitivity == "exact" else sensitivity,
                     "--secure-aggregation": secure_aggregation or None,
                     "--show-paper-claimed": show_paper_claimed or None}
            clash = [name for name, value in given.items() if value is not None]
            _choice("format", fmt, FDP_FORMATS)
            if clash:
                raise UserError(f"{', '.join(clash)}: with --from-run every setting comes from the run's config")
            if paper_variant is not None:
                _choice("paper-variant", paper_variant, PAPER_VARIANTS)
            from dpfl.evaluate.fdp_from_run import fdp_report_from_run

            report = fdp_report_from_run(from_run, grid, t_max, delta, paper_variant or "printed")
        else:
            missing = [name for name, value in (("--algo", algo), ("--eta", eta), ("--K", K), ("--V", V),
                                                ("--sigma", sigma), ("--m", m)) if value is None]
            if missing:
                raise UserError(f"missing {', '.join(missing)} (or give --from-run RUN_DIR)")
            for name, value, choices in (("algo", algo, ALGORITHMS), ("schedule", schedule, SCHEDULES),
                                         ("view", view, VIEWS), ("release", release, RELEASES),
                                         ("sensitivity", sensitivity, ("exact", "paper")),
                                         ("format", fmt, FDP_FORMATS)):
                _choice(name, value, choices)
            if paper_variant is not None:
                _choice("paper-variant", paper_variant, PAPER_VARIANTS)
                if not show_paper_claimed:
                    raise UserError("--paper-variant only applies with --show-paper-claimed")
            if show_paper_claimed and L is None:
                raise UserError("--show-paper-claimed needs the smoothness constant --L (the paper's bounds depend "
                                "on it)")
            for name, value in (("eta", eta), ("V", V), ("sigma", sigma)):
                _positive(name, value)
            for name, value in (("L", L), ("alpha", alpha), ("c", c), ("z", z)):
                if value is not None and not (value >= 0 and math.isfinite(value)):
                    raise UserError(f"--{name} must be a finite number >= 0, got {value}")
            if K < 1 or m < 1:
                raise UserError(f"--K and --m must be >= 1, got K = {K}, m = {m}")
            rounds = parse_grid(grid, 10000 if t_max is None else t_max)
            report = fdp_report(algo=algo, schedule=schedule, eta=eta, K=K, V=V, sigma=sigma, m=m, rounds=rounds,
                                L=L, alpha=alpha, deltas=tuple(delta or (1e-5,)), view=view,
                                secure_aggregation=secure_aggregation, release=release, sensitivity=sensitivity,
                                paper=(paper_variant or "printed") if show_paper_claimed else None, c=c, z=z,
                                honest_clients=honest_clients)
        written = write_fdp_files(report, out) if out is not None else []
    except _user_errors() as e:
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except OSError as e:  # --out not writable
        _fail(f"could not write to {out}: {e}")
    print_fdp(report, fmt, console, view if from_run is None else report.view, written, from_run)


# ---- data ---------------------------------------------------------------------------------------------
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
    except _user_errors() as e:
        _fail(str(e).splitlines()[0])
    except OSError as e:  # network failures
        _fail(f"could not fetch {name}: {e}")
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
    from dpfl.data import heterogeneity
    from dpfl.reproduce.splitting_config import problem_spec

    try:
        problem = problem_spec(kind=kind, shift_scale=shift_scale, preset=preset).build(seed)
    except _user_errors() as e:
        _fail(str(e).splitlines()[0])
    import numpy as np

    out = {"kind": kind, "clients": problem.n_clients, "dim": problem.dim,
           "samples_per_client": problem.n_samples.tolist(),
           "shift_scale": shift_scale, "seed": seed, "theta_star_norm": float(np.linalg.norm(problem.theta_star)),
           "objective_at_theta_star": problem.objective(problem.theta_star),
           "heterogeneity_H": heterogeneity(problem),
           "heterogeneity_H_per_sample": heterogeneity(problem, per_sample=True)}
    if as_json:
        emit_json(out)
        return
    for key, value in out.items():
        console.print(f"{key}: {value:.6g}" if isinstance(value, float) else f"{key}: {value}", highlight=False)


# ---- results ------------------------------------------------------------------------------------------
@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """Rewrite a run's plots and report.md from its files."""
    from dpfl.results.report import write_report

    try:
        path = write_report(run_dir)
    except _user_errors() as e:
        _fail(str(e).splitlines()[0])
    console.print(f"report: {path}")


@app.command()
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
    except _user_errors() as e:
        _fail(str(e).splitlines()[0])
    if as_json:
        emit_json({"runs": rows, "plot": None if plot is None else str(plot)})
        return
    console.print(format_table(rows, table_columns(rows, bool(label))), highlight=False, markup=False)
    if plot is not None:
        console.print(f"plot: {plot}")


@app.command()
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
    except _user_errors() as e:
        _fail(str(e).splitlines()[0])
    if as_json:
        emit_json({"runs": rows})
        return
    console.print(format_confidence(rows), highlight=False, markup=False)


# ---- reproduce ----------------------------------------------------------------------------------------
_Scale = Annotated[str, typer.Option("--scale", help="ci (minutes on a CPU: checks that it runs) or full (the "
                                                     "paper's grid: hours to days).")]
_Out = Annotated[Path, typer.Option("--out", help="Output directory: runs/, results.csv, results.md, plots/.")]
_Seeds = Annotated[Optional[int], typer.Option("--seeds", help="Number of seeds (0..N-1) instead of the spec's.")]
_OnlySeeds = Annotated[Optional[str], typer.Option(
    "--only-seeds", help="Run only these of the planned seeds (comma-separated, e.g. 2 or 1,2): a grid's seeds "
                         "spread over machines or sessions. The tables still collect every finished seed under "
                         "--out and count against all planned ones.")]
_Rounds = Annotated[Optional[int], typer.Option("--rounds", help="Rounds per run instead of the spec's.")]
_Settings = Annotated[Optional[str], typer.Option("--settings", help="Only settings matching this fnmatch pattern "
                                                                     "(commas: alternatives).")]
_Methods = Annotated[Optional[str], typer.Option("--methods", help="Only these methods, e.g. robust_hdp,weiavg.")]
_Datasets = Annotated[Optional[list[str]], typer.Option("--dataset", help="fashion_mnist (default) or mnist; "
                                                                          "repeatable or comma-separated.")]
_DryRun = Annotated[bool, typer.Option("--dry-run", help="List the jobs and their state; run nothing.")]
_Set = Annotated[Optional[list[str]], typer.Option(
    "--set", help="Override a field of every run's config (repeatable), e.g. --set training.optimizer.lr=0.05. "
                  "The grid is then not the paper's: every output's scale says \"overrides ...\". Not seed, name "
                  "or training.rounds (the grid sets them; use --seeds, --rounds).")]
_GRID_FIELDS = ("seed", "name", "training.rounds")  # set per job by the grid: an override would break it
_Workers = Annotated[int, typer.Option(
    "--workers", help="Worker processes sharing the grid's jobs (each job runs once, in one of them), each with "
                      "this process's torch threads divided among them: on C cores, --workers C runs C jobs at "
                      "once with one thread each.")]
_TablesOnly = Annotated[bool, typer.Option(
    "--tables-only", help="Write results.csv, results.md and plots/ from the runs already finished under --out; "
                          "train nothing (a long grid's tables while it runs elsewhere). The tables' command line "
                          "is the one that computes them, without this option.")]


def _one_of_dry_run_and_tables_only(dry_run: bool, tables_only: bool) -> None:
    if dry_run and tables_only:
        _fail("--dry-run and --tables-only: choose one (--dry-run lists what would run, --tables-only writes the "
              "tables of what finished)")


def _check_workers(workers: int, dry_run: bool, tables_only: bool) -> None:
    if workers < 1:
        _fail(f"--workers must be at least 1, got {workers}")
    if workers > 1 and (dry_run or tables_only):
        _fail(f"--workers shares the runs among processes; {'--dry-run' if dry_run else '--tables-only'} runs none")


def _dataset_names(datasets: Optional[list[str]]) -> list[str]:
    """--dataset values (repeatable or comma-separated, `fmnist` for short), in order, without repeats."""
    names = [d.strip() for item in (datasets or ["fashion_mnist"]) for d in item.split(",") if d.strip()]
    return list(dict.fromkeys({"fmnist": "fashion_mnist"}.get(d, d) for d in names))


def _seed_list(only_seeds: Optional[str], tables_only: bool = False, work: str = "train") -> Optional[list[int]]:
    """--only-seeds as integers (None when not given); refused with --tables-only, which does no `work` at all."""
    if only_seeds is None:
        return None
    if tables_only:
        _fail(f"--only-seeds chooses the seeds to {work}; --tables-only {work}s none (its tables collect every "
              f"{'saved' if work == 'compute' else 'finished'} seed)")
    try:
        seeds = [int(s) for s in only_seeds.split(",") if s.strip()]
    except ValueError:
        _fail(f"--only-seeds takes comma-separated seed numbers, e.g. 2 or 1,2 (got {only_seeds!r})")
    if not seeds:
        _fail("--only-seeds: no seed given")
    return seeds


def _grid_overrides(set_: Optional[list[str]]) -> tuple[str, ...]:
    """--set values for every job of a grid, read as `dpfl run --set` reads them; the fields the grid sets per job
    are refused."""
    from dpfl.experiment.config import ConfigError
    from dpfl.experiment.config.overrides import parse_override

    for item in set_ or ():
        try:
            field = ".".join(parse_override(item)[0])
        except ConfigError as e:
            _fail(str(e).splitlines()[0])
        if field in _GRID_FIELDS:
            instead = {"seed": "use --seeds", "training.rounds": "use --rounds"}.get(field, "its setting, method, seed")
            _fail(f"--set {field}: the grid sets {field} for each run ({instead})")
    return tuple(set_ or ())


def _reproduce(paper: str, out: Path, scale: str, seeds: Optional[int], rounds: Optional[int], settings: Optional[str],
               methods: Optional[str], datasets: Optional[list[str]], dry_run: bool, tables_only: bool = False,
               *, only_seeds: Optional[str] = None, workers: int = 1, overrides: Optional[list[str]] = None,
               **grid_options: Any) -> None:
    """The reproduce commands: build the grid, list it (--dry-run) or run it (or, --tables-only, collect its
    finished runs), then write the results. `overrides` (--set) apply to every job after the grid's own."""
    from dpfl.reproduce import fdp_accuracy, fedceo, pfa, rdpcfl, robust_hdp
    from dpfl.reproduce.jobs import select_seeds
    from dpfl.reproduce.runner import FAILED, RichProgress, collect_finished, describe_jobs, run_jobs
    from dpfl.reproduce.tables import write_results as generic_results
    from dpfl.reproduce.workers import WorkerDied, run_jobs_in_workers

    _one_of_dry_run_and_tables_only(dry_run, tables_only)
    only = _seed_list(only_seeds, tables_only)
    _check_workers(workers, dry_run, tables_only)
    names = _dataset_names(datasets)
    extra = _grid_overrides(overrides)
    wanted = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
    command = " ".join(["dpfl reproduce", paper, "--scale", scale, "--out", str(out)]
                       + [f"--{k.replace('_', '-')} {v}" for k, v in grid_options.items() if v]
                       + [f"--dataset {d}" for d in names if datasets]
                       + [f"--{k} {v}" for k, v in (("seeds", seeds), ("rounds", rounds), ("settings", settings),
                                                   ("methods", methods), ("only-seeds", only_seeds))
                          if v is not None]
                       + [f"--set {shlex.quote(x)}" for x in extra])
    try:
        module = {"pfa": pfa, "robust-hdp": robust_hdp, "fedceo": fedceo, "fdp-accuracy": fdp_accuracy,
                  "rdpcfl": rdpcfl}[paper]
        grid = module.grid(scale, datasets=names, seeds=seeds, rounds=rounds, settings_pattern=settings,
                           methods=wanted, extra=extra, **grid_options)
        grid = select_seeds(grid, only)
        if not grid.jobs:
            raise UserError("no job to run: the selection leaves nothing (see --dry-run)")
        if dry_run:
            for line in describe_jobs(grid, out):
                console.print(line, markup=False, highlight=False)
            return
        if tables_only:
            outcomes = collect_finished(grid.all_jobs, out)
            if not outcomes:
                raise UserError(f"--tables-only: no finished run of this selection under {out / 'runs'}")
        elif workers > 1:
            outcomes = run_jobs_in_workers(grid.jobs, out, workers)
        else:
            with RichProgress(errors) as progress:
                outcomes = run_jobs(grid.jobs, out, progress=progress)
        if not tables_only:
            selected = {j.key for j in grid.jobs}
            outcomes += collect_finished([j for j in grid.all_jobs if j.key not in selected], out)
        write_results = getattr(module, "write_results", generic_results)  # a study's own tables, if it has them
        csv_path, md_path = write_results(grid, outcomes, out, command=command)
    except (*_user_errors(), WorkerDied) as e:
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    failed = [o for o in outcomes if o.status == FAILED]
    counts = {s: sum(o.status == s for o in outcomes) for s in dict.fromkeys(o.status for o in outcomes)}
    console.print(f"{paper} ({grid.label}): " + ", ".join(f"{n} {s}" for s, n in counts.items()), highlight=False)
    console.print(f"results: {md_path}  {csv_path}", highlight=False)
    if failed:
        errors.print(f"error: {len(failed)} run(s) failed (status 'failed' in results.csv; tracebacks in "
                     f"{out / 'logs'})", markup=False, highlight=False)
        raise typer.Exit(1)


@reproduce_app.command("pfa")
def reproduce_pfa(
    out: _Out, scale: _Scale, seeds: _Seeds = None, only_seeds: _OnlySeeds = None, rounds: _Rounds = None,
    settings: _Settings = None, methods: _Methods = None, dataset: _Datasets = None,
    calibration: Annotated[Optional[str], typer.Option(
        help="accountant (RDP + Poisson), pfa-heuristic (the paper's formula + fixed-size batches) or both; default "
             "accountant at full scale, both at ci.")] = None,
    dry_run: _DryRun = False, tables_only: _TablesOnly = False, workers: _Workers = 1, set_: _Set = None,
) -> None:
    """PFA's comparison (PVLDB 2022): np_fedavg, max_eps, pfa, pfa_plus, weiavg, fedavg, min_eps."""
    _reproduce("pfa", out, scale, seeds, rounds, settings, methods, dataset, dry_run, tables_only,
               only_seeds=only_seeds, workers=workers, overrides=set_, calibration=calibration)


@reproduce_app.command("robust-hdp")
def reproduce_robust_hdp(
    out: _Out, scale: _Scale, seeds: _Seeds = None, only_seeds: _OnlySeeds = None, rounds: _Rounds = None,
    settings: _Settings = None, methods: _Methods = None, dataset: _Datasets = None, dry_run: _DryRun = False,
    tables_only: _TablesOnly = False, workers: _Workers = 1,
    noise_table: Annotated[bool, typer.Option(
        "--noise-table", help="Only the round-1 noise statistic table (thesis Table 3.4): each setting calibrated "
                              "for its full planned length, round 1 trained once, every aggregator on the same "
                              "uploads. Writes OUT/noise_table.{csv,md}; ignores --rounds/--seeds/--methods.")] = False,
    set_: _Set = None,
) -> None:
    """Robust-HDP's comparison (ICML 2024): 7 methods on Dist1..9, plus the falsified-budget scenario."""
    if noise_table:
        if only_seeds is not None:
            _fail("--only-seeds applies to the comparison (the noise table trains round 1 once per setting)")
        if tables_only:
            _fail("--tables-only applies to the comparison (the noise table reuses its saved pairs anyway)")
        if workers != 1:
            _fail("--workers applies to the comparison (the noise table trains round 1 once per setting)")
        if set_:
            _fail("--set applies to the comparison (the noise table uses each setting as the thesis defines it)")
        _noise_table(out, scale, settings, dataset)
        return
    _reproduce("robust-hdp", out, scale, seeds, rounds, settings, methods, dataset, dry_run, tables_only,
               only_seeds=only_seeds, workers=workers, overrides=set_)


@reproduce_app.command("fedceo")
def reproduce_fedceo(
    out: _Out,
    scale: Annotated[str, typer.Option("--scale", help="ci (minutes: checks that it runs), reduced (the full setting "
                                                       "with T = 50, E = 1: about 2 minutes per seed) or full (the "
                                                       "paper's T = 300, E = 30: about 10 minutes per run on one "
                                                       "core, 15 runs).")],
    seeds: _Seeds = None, only_seeds: _OnlySeeds = None, rounds: _Rounds = None, settings: _Settings = None,
    methods: _Methods = None,
    dataset: Annotated[Optional[list[str]], typer.Option(
        "--dataset", help="fashion_mnist (the default); at --scale full also the paper's own emnist (mlp2) and "
                          "cifar10 (lenet5), skipped when their files are missing. Repeatable or comma-separated.")
    ] = None,
    dry_run: _DryRun = False,
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
    tables_only: _TablesOnly = False, workers: _Workers = 1, set_: _Set = None,
) -> None:
    """FedCEO's comparison (ICML 2025): udp_fedavg, ppsgd, centaur, fedceo_theta1, fedceo at sigma_g 1.0/1.5/2.0."""
    if set_ and dlg:
        _fail("--set applies to the comparison and --search, not to --dlg")
    if tables_only and (dlg or search):
        _fail("--tables-only applies to the comparison, not to --search or --dlg")
    if only_seeds is not None and (dlg or search):
        _fail("--only-seeds applies to the comparison, not to --search or --dlg")
    if workers != 1 and (dlg or search):
        _fail("--workers applies to the comparison, not to --search or --dlg")
    if dlg:
        _fedceo_dlg(out, scale, search or search_result is not None or any(
            v is not None for v in (seeds, rounds, settings, methods, dataset, partition, mechanism)) or dry_run
            or tune_ablation)
        return
    if search:
        if search_result is not None:
            _fail("--search-result sets the comparison's values: it does not apply to --search")
        _fedceo_search(out, scale, rounds, settings, dataset, seeds, methods, dry_run, partition, mechanism,
                       tune_ablation, _grid_overrides(set_))
        return
    if tune_ablation:
        _fail("--tune-ablation is a stage of --search (the comparison takes its choice through --search-result)")
    _reproduce("fedceo", out, scale, seeds, rounds, settings, methods, dataset, dry_run, tables_only,
               only_seeds=only_seeds, workers=workers, overrides=set_, search_result=search_result,
               partition=partition, mechanism=mechanism)


def _fedceo_dlg(out: Path, scale: str, other_options: bool) -> None:
    from dpfl.reproduce.fedceo_dlg import run_dlg_study

    if other_options:
        _fail("--dlg runs the spec's offline variant as it is: it takes only --out (and --scale ci)")
    if scale != "ci":
        _fail("--dlg is the offline variant on the ci config: use --scale ci (the paper's CIFAR-10 LeNet setting "
              "needs CIFAR-10 files)")
    try:
        csv_path, md_path, _ = run_dlg_study(out, command=f"dpfl reproduce fedceo --dlg --scale ci --out {out}",
                                             progress=lambda line: console.print(line, markup=False, highlight=False))
    except _user_errors() as e:
        _fail(str(e).splitlines()[0])
    console.print(f"wrote {csv_path} and {md_path}", markup=False, highlight=False)


@reproduce_app.command("fdp-accuracy")
def reproduce_fdp_accuracy(
    out: _Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (seconds per run: digits + logistic regression, checks that it runs), reduced (Fashion-MNIST + LeNet-5 "
        "as a STAND-IN for MNIST, m = 20, K = 10, T = 12, 4 sigmas x 2 seeds = 8 runs; measured 80 s per run on "
        "one core of a shared 2-core machine, about 11 minutes in all) or full (the paper's grid: "
        "MNIST/LeNet-5 and CIFAR-10/ResNet-18, 3 (K, T) pairs x 3 m x 4 sigmas x 5 seeds = 360 runs; datasets "
        "not on this machine are skipped)."))],
    seeds: _Seeds = None, only_seeds: _OnlySeeds = None, rounds: _Rounds = None, settings: _Settings = None,
    methods: _Methods = None,
    dataset: Annotated[Optional[list[str]], typer.Option(
        "--dataset", help="Default per scale: full mnist,cifar10 (fashion_mnist adds a stand-in for mnist), reduced "
                          "fashion_mnist, ci digits. Repeatable or comma-separated.")] = None,
    dry_run: _DryRun = False, tables_only: _TablesOnly = False, workers: _Workers = 1, set_: _Set = None,
) -> None:
    """The f-DP paper's accuracy study (spec fdp_accounting.md §8): Noisy-FedAvg accuracy against sigma, m, (K, T),
    next to the accountant's mu and epsilon per configuration."""
    from dpfl.reproduce import fdp_accuracy

    names = _dataset_names(dataset) if dataset else list(fdp_accuracy.DEFAULT_DATASETS.get(scale, ())) or None
    _reproduce("fdp-accuracy", out, scale, seeds, rounds, settings, methods, names, dry_run, tables_only,
               only_seeds=only_seeds, workers=workers, overrides=set_)


@reproduce_app.command("rdpcfl")
def reproduce_rdpcfl(
    out: _Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (Fashion-MNIST rotation, 21 clients x 1,000 records, 20 rounds, eps 5, 2 seeds, 7 methods; about 4-9 "
        "minutes per run on one core) or full (the "
        "thesis grid: rotation / label flip / label shift at N_i = 8000, E = 200, eps 3/4/5/10/15, 4 seeds: weeks "
        "on a CPU; MNIST rotation where its files exist)."))],
    seeds: _Seeds = None, only_seeds: _OnlySeeds = None, rounds: _Rounds = None, settings: _Settings = None,
    methods: _Methods = None,
    dataset: _Datasets = None, dry_run: _DryRun = False,
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
    tables_only: _TablesOnly = False, workers: _Workers = 1, set_: _Set = None,
) -> None:
    """R-DPCFL's comparison (TMLR 2025): rdpcfl, ifca, global, local, mr_mtl, oracle, fedavg on planted clusters.
    Writes OUT/results.csv (mean_acc, minority_acc, ari, clusters_found, ... per run), results.md, plots/."""
    if round1_analysis and workers != 1:
        _fail("--workers applies to the comparison, not to --round1-analysis")
    if round1_analysis and set_:
        _fail("--set applies to the comparison, not to --round1-analysis")
    if round1_analysis:
        _rdpcfl_round1(out, scale, seeds, rounds, settings, methods, dataset, dry_run, epsilons, round1_batches,
                       tables_only, only_seeds)
        return
    if round1_batches is not None:
        _fail("--round1-batches applies to --round1-analysis only")
    _reproduce("rdpcfl", out, scale, seeds, rounds, settings, methods, dataset, dry_run, tables_only,
               only_seeds=only_seeds, workers=workers, overrides=set_, epsilons=epsilons)


def _rdpcfl_round1(out: Path, scale: str, seeds: Optional[int], rounds: Optional[int], settings: Optional[str],
                   methods: Optional[str], datasets: Optional[list[str]], dry_run: bool, epsilons: Optional[str],
                   batches: Optional[str], tables_only: bool, only_seeds: Optional[str]) -> None:
    from dpfl.reproduce.jobs import select_seeds
    from dpfl.reproduce.rdpcfl_round1 import analysis_grid, run_analysis

    _one_of_dry_run_and_tables_only(dry_run, tables_only)
    only = _seed_list(only_seeds, tables_only, "compute")
    if rounds is not None or methods:
        _fail("--round1-analysis: --rounds and --methods do not apply (each point is R-DPCFL calibrated for the "
              "scale's planned rounds; choose b^1 with --round1-batches)")
    command = " ".join(["dpfl reproduce rdpcfl --round1-analysis --scale", scale, "--out", str(out)]
                       + [f"--{k} {v}" for k, v in (("seeds", seeds), ("settings", settings), ("epsilons", epsilons),
                                                    ("round1-batches", batches), ("only-seeds", only_seeds))
                          if v is not None])
    try:
        grid = analysis_grid(scale, datasets=_dataset_names(datasets), seeds=seeds, settings_pattern=settings,
                             batches=[b.strip() for b in batches.split(",") if b.strip()] if batches else None,
                             epsilons=epsilons)
        grid = select_seeds(grid, only)
        if dry_run:
            console.print(f"R-DPCFL b^1 analysis, scale {grid.label}: {len(grid.jobs)} points -> {out / 'round1'}",
                          markup=False, highlight=False)
            for j in grid.jobs:
                console.print(f"{j.setting} b^1={j.method[1:]} seed {j.seed}", markup=False, highlight=False)
            return
        done = iter(range(1, len(grid.jobs) + 1))
        states: list[str] = []  # --tables-only: one summary line instead of a line per point

        def say(j: Any, what: str) -> None:
            states.append(what)
            if not tables_only:
                console.print(f"[{next(done)}/{len(grid.jobs)}] {j.setting} b^1={j.method[1:]} seed{j.seed}: {what}",
                              markup=False, highlight=False)

        csv_path, md_path, _ = run_analysis(grid, out, command=command, compute=not tables_only, on_point=say)
    except _user_errors() as e:
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    if tables_only:
        console.print(f"{states.count('saved before')} of the selection's {len(states)} points saved before; the "
                      "others not computed (--tables-only)", highlight=False)
    console.print(f"results: {md_path}  {csv_path}", highlight=False)


@reproduce_app.command("splitting")
def reproduce_splitting(
    out: _Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (heterogeneous least squares and logistic regression, 6 methods with and without Anderson, 1 seed; "
        "about 5 minutes), reduced (the CNN comparison only: 3 partitions x 5 methods x (tau 0, 10) x 4 seeds at 30 "
        "rounds of ONE local epoch; about 50 s per run), reduced-all-clients (the same with all 100 clients in every "
        "round instead of 10, the reference code's setting for its splitting methods; about 10x the cost) or full "
        "(convex: adds the heterogeneity, noise, partial-participation, diminishing-step and DP settings, 3 seeds, "
        "about 1.5 hours per seed at one thread (measured: least squares 11 min, logistic 75 min, two runs side by "
        "side on 2 cores); CNN: 100 rounds of 10 local epochs, 4 seeds, about 10 s per round: days)."))],
    seeds: _Seeds = None, only_seeds: _OnlySeeds = None, rounds: _Rounds = None, settings: _Settings = None,
    methods: _Methods = None, dry_run: _DryRun = False, tables_only: _TablesOnly = False,
    workers: Annotated[int, typer.Option(
        "--workers", help="Worker processes sharing the CNN runs (each runs once, in one of them; the convex runs "
                          "stay in this process), each with this process's torch threads divided among them.")] = 1,
) -> None:
    """The operator-splitting family (FedAvg, FedProx, FedSplit, FedPi, FedRP, Anderson) on the convex problems of
    specs/operator_splitting.md in float64, and on the reference CNN. Writes OUT/results.csv, results.md, plots/,
    runs/."""
    from dpfl.reproduce.runner import describe_jobs
    from dpfl.reproduce.splitting import plan, run_study

    wanted = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
    command = " ".join(["dpfl reproduce splitting --scale", scale, "--out", str(out)]
                       + [f"--{k} {v}" for k, v in (("seeds", seeds), ("rounds", rounds), ("settings", settings),
                                                   ("methods", methods), ("only-seeds", only_seeds)) if v is not None])

    _one_of_dry_run_and_tables_only(dry_run, tables_only)
    only = _seed_list(only_seeds, tables_only)
    _check_workers(workers, dry_run, tables_only)
    if dry_run:
        with _study_errors(out):
            todo = plan(scale, seeds=seeds, rounds=rounds, settings_pattern=settings, methods=wanted,
                        only_seeds=only)
            for job in todo.convex:
                done = job.paths(out)[1].is_file()
                console.print(f"{job.setting.name} {job.key} ({job.setting.rounds} rounds): "
                              f"{'finished' if done else 'new'}", markup=False, highlight=False)
            for line in describe_jobs(todo.cnn, out) if todo.cnn is not None else ():
                console.print(line, markup=False, highlight=False)
        return
    _run_study("splitting", scale, out, f"in {out / 'logs'}",
               lambda say: run_study(scale, out, seeds=seeds, rounds=rounds, settings_pattern=settings,
                                     methods=wanted, only_seeds=only, progress=say, command=command,
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
    except (*_user_errors(), WorkerDied) as e:
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except OSError as e:
        _fail(f"could not write to {out}: {e}")


@reproduce_app.command("mpdp")
def reproduce_mpdp(
    out: _Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (digits MLP at nominal per-round epsilon 3, 30 and 300; K = 100 on an n-out graph; Fashion-MNIST when "
        "found; 2 seeds; a few minutes) or full (CIFAR-10/100 with norm-free tied-residual ResNets at epsilon 1 and "
        "3, 3 seeds, when the files are found locally: days of CPU; BreakHis listed as skipped) or overfit (a "
        "Fashion-MNIST MLP on 100 records per client for 400 full-batch rounds, so FedAvg overfits and membership "
        "inference has something to find; epsilon 3, 30 and 300, 3 seeds; about an hour)."))],
    seeds: _Seeds = None, only_seeds: _OnlySeeds = None, rounds: _Rounds = None, settings: _Settings = None,
    methods: _Methods = None,
    inversion_steps: Annotated[Optional[int], typer.Option("--inversion-steps", help=(
        "Steps of each gradient-inversion attack on client 0's probe upload (default 200, as `reproduce attacks`; "
        "0 skips the inversion)."))] = None,
    dry_run: _DryRun = False, tables_only: _TablesOnly = False, workers: _Workers = 1,
) -> None:
    """MP-DP (bidirectional privacy) against MP-DP with an oracle clip, MP-DP-Naive, MP-CDP and FedAvg on the same
    FedSGD rounds, with the attacks of spec §10 on each run; TP-SMC (threshold Paillier, slow) only when --methods
    names tp_smc. Writes OUT/results.csv, results.md and runs/."""
    from dpfl.reproduce.mpdp import INVERSION_STEPS, describe, run_study

    _one_of_dry_run_and_tables_only(dry_run, tables_only)
    only = _seed_list(only_seeds, tables_only)
    _check_workers(workers, dry_run, tables_only)
    wanted = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
    command = " ".join(["dpfl reproduce mpdp --scale", scale, "--out", str(out)]
                       + [f"--{k} {v}" for k, v in (("seeds", seeds), ("rounds", rounds), ("settings", settings),
                                                    ("methods", methods), ("inversion-steps", inversion_steps),
                                                    ("only-seeds", only_seeds)) if v is not None])
    steps = INVERSION_STEPS if inversion_steps is None else inversion_steps
    grid = {"seeds": seeds, "methods": wanted, "rounds": rounds, "settings_pattern": settings, "inversion_steps": steps}
    if dry_run:
        with _study_errors(out):
            lines = describe(scale, out, only_seeds=only, **grid)
        for line in lines:
            console.print(line, markup=False, highlight=False)
        return
    _run_study("mpdp", scale, out, "in the run directories",
               lambda say: run_study(scale, out, only_seeds=only, compute=not tables_only, command=command,
                                     progress=say, workers=workers, **grid))


@reproduce_app.command("attacks")
def reproduce_attacks(
    out: _Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (Fashion-MNIST, 20 clients, 784-128-10 MLP, 20 rounds: FedAvg, record-level DP-SGD and client-level "
        "central DP at epsilon 1, 3, 8; about 10 minutes) or overfit (500 images on 10 clients trained for 100 rounds "
        "of 5 epochs, so FedAvg overfits and membership inference has something to find; epsilon 1, 8, 100)."))],
    rounds: _Rounds = None,
    seeds: Annotated[Optional[int], typer.Option("--seeds", help=(
        "Seeds 0..N-1 of every setting (default 1: seed 0; another seed's directory is "
        "runs/<setting>-seed<s>)."))] = None,
    settings: Annotated[Optional[str], typer.Option("--settings", help=(
        "Only settings matching this fnmatch pattern (comma-separated alternatives): fedavg, dpsgd-eps1, dpsgd-eps3, "
        "dpsgd-eps8, client-eps1, client-eps3, client-eps8 (overfit: eps1, eps8, eps100); e.g. 'dpsgd-*'."))] = None,
    dry_run: _DryRun = False, tables_only: _TablesOnly = False, workers: _Workers = 1,
) -> None:
    """Gradient inversion, membership inference and an empirical epsilon audit of FedAvg, DP-SGD and client-level
    DP. Writes OUT/results.csv, results.md and runs/."""
    from dpfl.reproduce.attacks import plan, run_study

    command = " ".join(["dpfl reproduce attacks --scale", scale, "--out", str(out)]
                       + [f"--{k} {v}" for k, v in (("rounds", rounds), ("seeds", seeds), ("settings", settings))
                          if v is not None])
    _one_of_dry_run_and_tables_only(dry_run, tables_only)
    _check_workers(workers, dry_run, tables_only)
    n_seeds = 1 if seeds is None else seeds
    if dry_run:
        with _study_errors(out):
            for name, cfg, state in plan(scale, out, rounds=rounds, pattern=settings, seeds=n_seeds):
                console.print(f"{name} seed {cfg.seed} ({cfg.name}, {cfg.training.rounds} rounds): {state}",
                              markup=False, highlight=False)
        return
    _run_study("attacks", scale, out, "in the run directories (error.txt)",
               lambda say: run_study(scale, out, rounds=rounds, settings_pattern=settings, seeds=n_seeds,
                                     compute=not tables_only, command=command, progress=say, workers=workers))


@reproduce_app.command("fdp-sensitivity")
def reproduce_fdp_sensitivity(
    out: _Out,
    scale: Annotated[str, typer.Option("--scale", help=(
        "ci (digits + logistic regression with its exact smoothness constant, so the worst-case recursion is drawn; "
        "about 25 s) or full (spec §7: CIFAR-10/ResNet-18 if present, else Fashion-MNIST/LeNet-5, else digits/mlp2; "
        "10 settings x 3 seeds x 600 rounds; on Fashion-MNIST about 6 hours per setting and seed on one core)."))],
    seeds: _Seeds = None, rounds: _Rounds = None,
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

    def say(message: str) -> None:
        console.print(message, markup=False, highlight=False)

    try:
        result = run_sensitivity(scale, out, seeds=seeds, rounds=rounds, progress=say, settings_pattern=settings,
                                 couplings=("coupled",) if coupled_only else ("coupled", "independent"),
                                 compute=not tables_only)
    except ControlPairError as e:  # not a user error: the runs were not deterministic
        errors.print(f"error: {e}", markup=False, highlight=False)
        raise typer.Exit(1) from e
    except _user_errors() as e:
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except OSError as e:
        _fail(f"could not write to {out}: {e}")
    say("sensitivity: " + "  ".join(str(p) for p in result.paths.values()))


def _fedceo_search(out: Path, scale: str, rounds: Optional[int], settings: Optional[str],
                   datasets: Optional[list[str]], seeds: Optional[int], methods: Optional[str], dry_run: bool,
                   partition: Optional[str], mechanism: Optional[str], tune_ablation: bool,
                   extra: tuple[str, ...] = ()) -> None:
    from dpfl.reproduce.fedceo import Variant
    from dpfl.reproduce.fedceo_search import run_search
    from dpfl.reproduce.runner import FAILED, RichProgress

    if seeds is not None or methods or dry_run:
        _fail("--search runs its own grid with one seed: --seeds, --methods and --dry-run do not apply (its "
              "stage-2 runs depend on stage 1's results)")
    if any(d != "fashion_mnist" for d in _dataset_names(datasets)):
        _fail("--dataset: the FedCEO search runs on fashion_mnist only (the paper's datasets have its Table 2 values)")
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
    except _user_errors() as e:
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
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


def _noise_table(out: Path, scale: str, settings: Optional[str], datasets: Optional[list[str]]) -> None:
    from dpfl.reproduce import robust_hdp
    from dpfl.reproduce.noise_table import write_noise_table

    names = _dataset_names(datasets)
    try:
        grid = robust_hdp.grid(scale, datasets=names, seeds=1, settings_pattern=settings, methods=["robust_hdp"])
        mains = {s.name for s in grid.settings if s.meta.get("kind") == "main"}
        configs = {j.setting: j.config for j in grid.jobs if j.setting in mains}
        if not configs:
            raise UserError("no main setting selected for the noise table (see --dry-run)")
        csv_path, md_path = write_noise_table(
            configs, out, label=grid.label,
            on_setting=lambda s: errors.print(f"noise table: {s} ...", markup=False, highlight=False))
    except _user_errors() as e:
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    console.print(f"noise table: {md_path}  {csv_path}", highlight=False)


@reproduce_app.command("merge")
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
        _fail(str(e))
    except OSError as e:
        _fail(f"--out {out}: {e.strerror or e}")
    console.print(f"merged {len(inputs)} files: {row_count(text)} rows -> {out}", highlight=False)


# ---- bench ---------------------------------------------------------------------------------------------
@app.command()
def audit(
    config: Annotated[Path, typer.Argument(help="YAML config of the run to audit.")],
    canaries: Annotated[int, typer.Option(help="Canaries (clients or records), each included with "
                                               "probability 1/2.")] = 200,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a field (repeatable).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write OUT/audit.json too.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Empirical lower bound on the run's epsilon (canaries of its unit, one run, 95% confidence) next to the reported
    one: canary clients for client-level mechanisms and non-private runs, canary records for sample-level ones."""
    from dpfl.evaluate.audit import audit_config
    from dpfl.experiment.config import load_config
    from dpfl.results.run_files import write_json_atomic

    try:
        if canaries < 2:
            raise UserError(f"--canaries must be >= 2, got {canaries}")
        if out is not None and (out / "audit.json").exists():
            raise UserError(f"{out / 'audit.json'} already exists (choose another --out)")
        cfg = load_config(config, list(set_ or []))
        result = audit_config(cfg, canaries)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(out / "audit.json", result)
    except _user_errors() as e:
        _fail(str(e).splitlines()[0])
    if as_json:
        emit_json(result)
        return
    reported = result["epsilon_reported"]
    say = lambda text: console.print(text, markup=False, highlight=False)  # noqa: E731
    say(f"{cfg.name}: {result['unit']}-level audit with {result['canaries']} canaries ({result['included']} "
        f"included), {result['rounds_run']} rounds")
    say(f"empirical lower bound eps >= {result['epsilon_lower_bound']:.3f} at {result['confidence']:.0%} confidence "
        f"(delta {result['delta']:g}; {result['correct']} of {result['guesses']} guesses right)")
    if reported is None:
        say("reported: none (the run is not private)")
    else:
        verdict = ("REFUTED: the run leaks more than it reports" if result["refuted"] else
                   "consistent (the attack did not refute the claim; this does not show the reported epsilon is tight)")
        say(f"reported eps = {format_epsilon(reported)}: {verdict}")


def _config_of(run_or_config: Path, sets: list[str]):
    """A config file, or a run directory's config.yaml."""
    from dpfl.experiment.config import load_config

    path = run_or_config / "config.yaml" if run_or_config.is_dir() else run_or_config
    return load_config(path, sets)


def _fresh_out(out: Path, names: tuple[str, ...]) -> None:
    taken = [n for n in names if (out / n).exists()]
    if taken:
        raise UserError(f"{out / taken[0]} already exists (choose another --out)")


@attack_app.command("invert")
def attack_invert(
    run_or_config: Annotated[Path, typer.Argument(help="A config, or a run directory (its config.yaml).")],
    out: Annotated[Path, typer.Option(help="Writes OUT/inversion.json and OUT/inversion.png.")],
    batch: Annotated[int, typer.Option(help="Records in the probed client's one-step upload (1 or 8 in "
                                            "the spec).")] = 1,
    steps: Annotated[int, typer.Option(help="Optimiser steps of each attack.")] = 200,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a field (repeatable).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the attacks' dummies and the feature extractor.")] = 0,
    after_smoothing: Annotated[Optional[int], typer.Option(
        "--after-smoothing", help="FedCEO only: attack client 0's smoothed model after the J-th smoothing (its round's "
                                  "K clients train, the server's T-tSVD smooths at that threshold; spec fedceo §8) "
                                  "instead of its upload.")] = None,
) -> None:
    """Gradient inversion (DLG, Inverting Gradients) of one client's upload, as the server receives it."""
    from dpfl.attacks.figures import reconstruction_grid
    from dpfl.evaluate.probe import inversion_metrics, invert_probe, probe_round
    from dpfl.results.run_files import write_json_atomic

    try:
        if steps < 1:
            raise UserError(f"--steps must be >= 1, got {steps}")
        _fresh_out(out, ("inversion.json", "inversion.png"))
        cfg = _config_of(run_or_config, list(set_ or []))
        probe = probe_round(cfg, batch, after_smoothing)
        result = invert_probe(probe, steps, seed)
    except _user_errors() as e:
        _fail(str(e).splitlines()[0])
    out.mkdir(parents=True, exist_ok=True)
    report = {"config": cfg.name, "batch": batch, "steps": steps, "after_smoothing": after_smoothing,
              "unit": probe.unit, "observer": probe.observer,
              "attacks": inversion_metrics(result)}
    write_json_atomic(out / "inversion.json", report)
    reconstruction_grid(probe.x, {k: v["reconstruction"] for k, v in result.items()}, out / "inversion.png",
                        f"{cfg.name}: batch {batch}, " + (f"{probe.unit}-level DP" if probe.unit else "not private"))
    for name, r in report["attacks"].items():
        console.print(f"{name}: PSNR {r['psnr']:.1f} dB, image MSE {r['image_mse']:.4f}, feature MSE "
                      f"{r['feature_mse']:.4f}", highlight=False)
    what = "client 0's upload" if after_smoothing is None else "client 0's smoothed model"
    console.print(f"what was inverted: {what} as seen by {probe.observer}; wrote {out}/inversion.png",
                  markup=False, highlight=False)


@attack_app.command("mia")
def attack_mia(
    run: Annotated[Path, typer.Argument(help="A finished run directory (dpfl run).")],
    out: Annotated[Path, typer.Option(help="Writes OUT/mia.json and OUT/roc.png.")],
    seed: Annotated[int, typer.Option(help="Seed of the attacker's half and the shadow classifier.")] = 0,
) -> None:
    """Membership inference against the run's released model (loss, confidence and shadow attacks)."""
    from dpfl.attacks.membership import plot_roc
    from dpfl.evaluate.released import attack_released_model
    from dpfl.results.run_files import write_json_atomic

    try:
        _fresh_out(out, ("mia.json", "roc.png"))
        result = attack_released_model(run, seed)
    except _user_errors() as e:
        _fail(str(e).splitlines()[0])
    out.mkdir(parents=True, exist_ok=True)
    attacks = result["attacks"]
    plot_roc({k: (v["fpr"], v["tpr"]) for k, v in attacks.items()}, out / "roc.png",
             title=f"membership inference: {result['name']}")
    keep = ("asr", "auc", "tpr_at_1fpr", "threshold_protocol", "n_members", "n_nonmembers")
    write_json_atomic(out / "mia.json", {**result, "attacks": {k: {m: v.get(m) for m in keep}
                                                                for k, v in attacks.items()}})
    for name, v in attacks.items():
        console.print(f"{name}: ASR {v['asr']:.3f}, AUC {v['auc']:.3f}, TPR at 1% FPR {v['tpr_at_1fpr']:.3f}",
                      highlight=False)
    console.print(f"wrote {out}/mia.json and {out}/roc.png (ASR 0.5 = guessing)", markup=False, highlight=False)


@bench_app.command("secagg")
def bench_secagg(
    clients: Annotated[int, typer.Option(help="Clients in the round.")] = 100,
    dim: Annotated[int, typer.Option(help="Parameters per upload (float32).")] = 1_000_000,
    dropout: Annotated[float, typer.Option(help="Share of clients that drop out.")] = 1 / 3,
    stage: Annotated[str, typer.Option(help="Stage they drop before: advertise_keys, share_keys, masked_input "
                                            "(the costly one for the server) or unmasking.")] = "masked_input",
    threshold: Annotated[Optional[int], typer.Option(help="Shamir threshold t (default floor(n/2) + 1).")] = None,
    ring_bits: Annotated[int, typer.Option(help="Ring Z/2^k: 32 or 64.")] = 64,
    frac_bits: Annotated[Optional[int], typer.Option(help="Fixed-point fractional bits (default 32, or 16 for a "
                                                          "32-bit ring).")] = None,
    workers: Annotated[int, typer.Option(help="Server processes for rebuilding masks.")] = 1,
    seed: Annotated[int, typer.Option(help="Data and dropout seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Time one secure-aggregation round (real key agreement, shares and masks; no network) against a plain sum."""
    from dpfl.algorithms.secure.benchmark import run_secagg_benchmark

    for name, value in (("clients", clients), ("dim", dim), ("workers", workers)):
        if value < 1:
            _fail(f"--{name} must be >= 1, got {value}")
    try:
        out = run_secagg_benchmark(clients, dim, dropout, stage, threshold, ring_bits, frac_bits, workers, seed)
    except _user_errors() as e:
        _fail(str(e))
    if as_json:
        emit_json(out)
        return
    table = Table(title=f"secure aggregation: {clients} clients x {dim} parameters, {out['dropped']} dropped before "
                        f"{stage} (t = {out['threshold']}, {ring_bits}-bit ring)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for label, value in (("server seconds", f"{out['server_seconds']:.3f}"),
                         ("  plain float32 sum", f"{out['plain_sum_seconds']:.4f}"),
                         ("client seconds (slowest)", f"{out['client_seconds_max']:.3f}"),
                         ("client seconds (mean)", f"{out['client_seconds_mean']:.3f}"),
                         ("upload bytes per client", f"{out['upload_bytes_per_client']:,}"),
                         ("  plain float32 upload", f"{out['plain_upload_bytes_per_client']:,}"),
                         ("max |error| of the sum", f"{out['max_abs_error']:.3g} (bound {out['error_bound']:.3g})")):
        table.add_row(label, value)
    console.print(table)


# ---- flower ----------------------------------------------------------------------------------------------
flower_app = typer.Typer(no_args_is_help=True, help="Run a dpfl config as a Flower app (the dpfl[flower] extra; "
                         "docs/flower.md).")
app.add_typer(flower_app, name="flower")


@flower_app.command("guide")
def flower_guide(
    nodes: Annotated[int, typer.Option(help="SuperNodes to start: one per dpfl client (the config's "
                                            "data.clients).")] = 3,
    port: Annotated[int, typer.Option(help="The SuperLink's port (Fleet, Control and Runtime APIs).")] = 9092,
    project: Annotated[str, typer.Option(help="The Flower project directory (pyproject.toml, dpfl "
                                              "config).")] = "examples/flower",
) -> None:
    """Print the commands that start a local federation: SuperLink, SuperNodes, `flwr run`."""
    from dpfl.flower import FlowerMissing, require_flwr
    from dpfl.flower.guide import guide

    try:
        require_flwr()
    except FlowerMissing as e:
        _fail(str(e))
    if nodes < 1 or not 0 < port < 65536 - 10 - nodes:
        _fail(f"--nodes must be >= 1 and --port a free port below {65536 - 10 - nodes}")
    console.print(guide(nodes, port, project), markup=False, highlight=False)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: click's usage errors become one line on stderr with exit code 2."""
    try:  # typer >= 0.2x vendors click; older versions use click itself
        from typer._click import exceptions as click_errors
    except ImportError:  # pragma: no cover
        from click import exceptions as click_errors
    aborts = (getattr(click_errors, "Abort", typer.Abort), typer.Abort)  # Ctrl-C at a prompt, from either click

    try:
        code = app(args=argv, prog_name="dpfl", standalone_mode=False)
    except click_errors.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `dpfl` or `dpfl privacy`: show the help
            errors.print(e.format_message(), markup=False, highlight=False)
            sys.exit(USAGE_ERROR)
        hint = f" (see: {e.ctx.command_path} --help)" if e.ctx is not None else ""
        errors.print(f"error: {e.format_message()}{hint}", markup=False, highlight=False)
        sys.exit(USAGE_ERROR)
    except aborts:
        errors.print("aborted", markup=False)
        sys.exit(130)
    except click_errors.ClickException as e:
        errors.print(f"error: {e.format_message()}", markup=False, highlight=False)
        sys.exit(e.exit_code)
    sys.exit(code or 0)


if __name__ == "__main__":
    main()

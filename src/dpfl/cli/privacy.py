"""`dpfl privacy`: privacy accounting without a run: the epsilon of the Poisson-sampled Gaussian mechanism, the noise
for a target epsilon, and the f-DP curves of noisy FedAvg/FedProx (`dpfl.privacy.fdp`; what they print lives in
``dpfl.results.fdp_output``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from dpfl.cli.common import UserError, console, fail, user_errors
from dpfl.results.json_output import emit_json

privacy_app = typer.Typer(no_args_is_help=True,
                          help="Privacy accounting: epsilon of a mechanism, or noise for a target.")


def _positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise UserError(f"--{name} must be a finite number > 0, got {value}")


def _check_mechanism_args(accountant: str, sample_rate: float, delta: float, steps: int) -> None:
    """The arguments both privacy commands share: accountant, Poisson rate, delta, steps."""
    if accountant not in ("rdp", "pld", "prv"):
        raise UserError(f"--accountant must be 'rdp', 'pld' or 'prv', got {accountant!r}")
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
    accountant: Annotated[str, typer.Option(help="rdp, pld or prv (its upper bound).")] = "rdp",
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
    except user_errors() as e:
        fail(str(e))
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
    accountant: Annotated[str, typer.Option(help="rdp, pld or prv (its upper bound).")] = "rdp",
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
    except user_errors() as e:
        fail(str(e))
    out = {"noise_multiplier": z, "epsilon": achieved, "target_epsilon": epsilon_, "delta": delta,
           "sample_rate": sample_rate, "steps": steps, "accountant": accountant}
    if as_json:
        emit_json(out)
    else:
        console.print(f"noise multiplier = {z:.6g} (gives epsilon = {achieved:.6g} <= {epsilon_:g} at "
                      f"delta = {delta:g}, {accountant.upper()}, q = {sample_rate:g}, {steps} steps)", highlight=False)


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
    except user_errors() as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    except OSError as e:  # --out not writable
        fail(f"could not write to {out}: {e}")
    print_fdp(report, fmt, console, view if from_run is None else report.view, written, from_run)

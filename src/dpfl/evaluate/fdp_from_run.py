"""`dpfl privacy fdp --from-run RUN_DIR`: the f-DP curves of a Noisy-FedAvg/FedProx run, from its own config.

The run's saved config gives the realised step sizes η[T, K], V, σ, α, the cohort size, the view, the release scope
and L; the curves are evaluated on a grid of rounds up to the run's T (or `t_max`). They describe the configured
plan (every round with the configured cohort); the per-client values of what actually ran are in privacy.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dpfl.experiment.build import noisy_accounting
from dpfl.experiment.config import ConfigError, load_config
from dpfl.privacy.fdp import FdpReport, fdp_report, parse_grid
from dpfl.results.run_files import CONFIG_FILE

__all__ = ["fdp_report_from_run"]

NOISY = ("noisy_fedavg", "noisy_fedprox")


def fdp_report_from_run(run_dir: Path, grid: str = "log:60", t_max: int | None = None,
                        deltas: Sequence[float] | None = None, paper_variant: str = "printed") -> FdpReport:
    """Every bound for the run's config; the paper-claimed curve (labelled, never a guarantee) when L is set."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no {CONFIG_FILE})", str(run_dir))
    cfg = load_config(path)
    if cfg.algorithm.name not in NOISY:
        raise ConfigError(f"{run_dir}: f-DP curves exist for {' and '.join(NOISY)} runs; this run is "
                          f"{cfg.algorithm.name!r}", "algorithm.name")
    acc = noisy_accounting(cfg)
    cohort = cfg.planned_cohort  # the schema refuses Poisson selection for these algorithms
    assert cohort is not None
    horizon = acc.rounds if t_max is None else int(t_max)
    if horizon > acc.rounds:
        raise ValueError(f"--T-max {horizon} is beyond the run's {acc.rounds} rounds (its step sizes end there)")
    rounds = parse_grid(grid, horizon)
    if rounds[-1] > acc.rounds:
        raise ValueError(f"--grid reaches round {rounds[-1]}, beyond the run's {acc.rounds} rounds")
    paper = None
    if acc.smoothness_L is not None:  # the printed formulas need a named schedule and, for FedProx, α > L;
        printable = acc.schedule != "custom" and (acc.algo == "fedavg" or (acc.alpha or 0) > acc.smoothness_L)
        paper = paper_variant if printable else "h0"  # h0: the paper's method on the exact sequences
    return fdp_report(algo=acc.algo, schedule=acc.schedule,
                      eta=float(acc.step_sizes[0, 0]), K=int(acc.step_sizes.shape[1]), V=acc.clip, sigma=acc.sigma,
                      m=cohort, rounds=rounds, L=acc.smoothness_L, alpha=acc.alpha,
                      deltas=tuple(deltas or (cfg.privacy.delta,)), view=acc.view,
                      secure_aggregation=acc.secure_aggregation, release=acc.release, paper=paper,
                      honest_clients=acc.honest_clients, eta_array=acc.step_sizes)

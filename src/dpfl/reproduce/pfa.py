"""The PFA paper's comparison (Liu et al., PVLDB 2022; spec heterogeneous_dp.md §7.2 and §7.4).

Methods (spec §7.2 "Seeds and methods"), by the paper's names:

| method | dpfl algorithm | |
|---|---|---|
| np_fedavg | fedavg (no clipping, no noise) | non-private reference |
| max_eps | max_eps, epsilon 10.0 | NOT private: everyone calibrated to 10 |
| pfa | pfa: top 10% public, k = 1, centred, exact SVD | |
| pfa_plus | pfa_plus with pfa's settings | |
| weiavg | weiavg | |
| fedavg | dp_fedavg_local, uniform weights | |
| min_eps | min_eps, observed: everyone at the smallest reported ε | the paper's constants would overspend |

Settings: `full` is the main grid restricted to what ships by default, {logr, cnn_pfa} x iid x
{MixGauss1, MixGauss3} x M in {20, 30, 40, 50} (K = 0.8 M per round) on the selected datasets (Fashion-MNIST by
default; MNIST when its files are present); `ci` is spec §7.4 (M = 10, tau = 10, R = 5, MixGauss1, both
calibrations). The corrected calibration (RDP accountant + Poisson sampling) is the default; `pfa-heuristic` is
the paper's formula with fixed-size batches. CIFAR-10 is not shipped (spec §7.2.5: the paper's model is ambiguous).

min_eps calibrates everyone to the smallest reported budget (`epsilon: observed`). The paper's constants
(0.1 for MixGauss1, 1.0 for MixGauss3) are the centres of the small components, not the smallest drawn
budgets: about half the small-budget clients draw less, so calibrating to the constant would spend more
than their budgets. dpfl keeps min_eps private, as spec §4.1 requires; `MIN_EPS` records the constants.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpfl.reproduce.jobs import Grid, GridError, Method, Setting, build_grid, config_dir, dataset_short

__all__ = ["CALIBRATIONS", "DISTRIBUTIONS", "MIN_EPS", "MODELS", "SPEC", "grid", "methods", "settings"]

PAPER = "pfa"
MODELS = ("logr", "cnn_pfa")
DISTRIBUTIONS = {"full": ("MixGauss1", "MixGauss3"), "ci": ("MixGauss1",)}
CLIENTS = {"full": (20, 30, 40, 50), "ci": (10,)}  # M, the population (spec §7.2 main grid; K = 0.8 M)
PER_CLIENT = {"full": 1200, "ci": 200}
SPEC = {"full": {"rounds": 100, "seeds": 5}, "ci": {"rounds": 5, "seeds": 1}}
# calibration name -> (config overrides, setting-name suffix)
CALIBRATIONS = {
    "accountant": (("privacy.calibration=accountant", "privacy.sampling=poisson"), "rdp"),
    "pfa-heuristic": (("privacy.calibration=pfa-heuristic", "privacy.sampling=fixed"), "heuristic"),
}
DEFAULT_CALIBRATIONS = {"full": ("accountant",), "ci": ("accountant", "pfa-heuristic")}
MIN_EPS = {"MixGauss1": 0.1, "MixGauss3": 1.0}  # PFA's Minimum baseline constants (spec §3.1)
MAX_EPS = 10.0
PFA_PARAMS = "{split: top_fraction, public_fraction: 0.1, k: 1, subspace: centered, svd_solver: exact}"

NOT_PRIVATE = "NOT private (violates budgets)"
NON_PRIVATE = "non-private reference (no DP)"


def methods(distribution: str) -> tuple[Method, ...]:
    """The paper's seven methods for a budget distribution (min_eps's constant depends on it)."""
    if distribution not in MIN_EPS:  # pragma: no cover - only MixGauss1/3 are in the grid
        raise GridError(f"PFA's Minimum baseline constant is given for {', '.join(MIN_EPS)} only")
    return (
        Method("np_fedavg", "fedavg", ("algorithm={name: fedavg}", "privacy={}"), NON_PRIVATE),
        Method("max_eps", "max_eps", (f"algorithm={{name: max_eps, params: {{epsilon: {MAX_EPS}}}}}",
                                      "privacy.allow_budget_violation=true"), NOT_PRIVATE),
        Method("pfa", "pfa", (f"algorithm={{name: pfa, params: {PFA_PARAMS}}}",)),
        Method("pfa_plus", "pfa_plus", (f"algorithm={{name: pfa_plus, params: {PFA_PARAMS}}}",)),
        Method("weiavg", "weiavg", ("algorithm={name: weiavg}",)),
        Method("fedavg", "dp_fedavg_local", ("algorithm={name: dp_fedavg_local, params: {weighting: uniform}}",)),
        # The smallest reported budget, not the paper's constant (MIN_EPS), which MixGauss draws fall below:
        # calibrating to it would spend more than those clients' budgets. Private, as spec §4.1 requires.
        Method("min_eps", "min_eps", ("algorithm={name: min_eps, params: {epsilon: observed}}",),
               f"smallest drawn ε (the paper's constant {MIN_EPS[distribution]} would exceed budgets below it)"),
    )


def settings(scale: str, datasets: Sequence[str] = ("fashion_mnist",),
             calibrations: Sequence[str] | None = None) -> list[Setting]:
    """The settings of a scale, e.g. ``fmnist-logr-iid-MixGauss1-M30-rdp``."""
    if scale not in SPEC:
        raise GridError(f"--scale must be 'ci' or 'full', got {scale!r}")
    cals = list(calibrations or DEFAULT_CALIBRATIONS[scale])
    for c in cals:
        if c not in CALIBRATIONS:
            raise GridError(f"--calibration must be one of {', '.join(CALIBRATIONS)} or both, got {c!r}")
    n = PER_CLIENT[scale]
    out = []
    for dataset in datasets:
        short = dataset_short(dataset, scale, "PFA")
        for model in MODELS:
            base = config_dir() / "pfa" / f"{'ci_' if scale == 'ci' else ''}{short}_{model}.yaml"
            for dist, m, cal in ((d, m, c) for d in DISTRIBUTIONS[scale] for m in CLIENTS[scale] for c in cals):
                k = int(0.8 * m)
                cal_overrides, suffix = CALIBRATIONS[cal]
                batches = "Poisson" if cal == "accountant" else "fixed-size"
                overrides = (f"data.clients={m}", f"data.max_train_samples={m * n}", "data.partition=iid",
                             "training.selection={kind: fixed, k: %d}" % k,
                             f"privacy.budgets={{distribution: {dist}}}", *cal_overrides)
                out.append(Setting(
                    name=f"{short}-{model}-iid-{dist}-M{m}-{suffix}", base=base, overrides=overrides,
                    methods=methods(dist), dataset=dataset,
                    describe=(f"{dataset}, {model}, i.i.d., M = {m} clients x {n} examples, K = {k} per round, "
                              f"budgets {dist}, calibration {cal} ({batches} batches)"),
                    meta={"dist": dist, "model": model, "calibration": cal, "clients": m}))
    return out


def grid(scale: str, *, datasets: Sequence[str] = ("fashion_mnist",), seeds: int | None = None,
         rounds: int | None = None, settings_pattern: str | None = None, methods: Sequence[str] | None = None,
         calibration: str | None = None, extra: Sequence[str] = ()) -> Grid:
    """The jobs of `dpfl reproduce pfa` (see the module docstring); `extra` overrides apply to every job.

    `calibration`: accountant, pfa-heuristic or both (default: accountant at full scale, both at ci).
    """
    if scale not in SPEC:
        raise GridError(f"--scale must be 'ci' or 'full', got {scale!r}")
    cals = None if not calibration else list(CALIBRATIONS) if calibration == "both" else [calibration]
    all_settings = settings(scale, datasets, cals)
    used = cals or DEFAULT_CALIBRATIONS[scale]
    return build_grid(PAPER, scale, all_settings, spec_rounds=SPEC[scale]["rounds"], spec_seeds=SPEC[scale]["seeds"],
                      seeds=seeds, rounds=rounds, settings_pattern=settings_pattern, methods=methods, extra=extra,
                      selection=[f"calibration: {' and '.join(used)}"])

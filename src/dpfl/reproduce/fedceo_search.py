"""`dpfl reproduce fedceo --search`: FedCEO's (λ, ϑ, I) chosen on the clients' validation splits (spec fedceo.md §4).

The spec's grid is λ (per σ_g) × ϑ ∈ {1.02, 1.04, 1.06, 1.08} × I ∈ {10, 20, 30}: 120 runs per σ_g, each hours
long at full scale. dpfl searches it **coordinate-wise** (a reduction, stated in every output):

1. λ over the spec's grid for σ_g (its 9 log-spaced points, or the 10 linear ones for σ_g = 1.0, plus the paper's
   Table 2 value), with ϑ from the paper's row for σ_g and the scale's middle I; under `--mechanism udp`, 9
   log-spaced points over [0.001, 10] for every σ_g instead (see `UDP_LAMBDA_GRID`);
2. ϑ × I over the full sub-grid at the best λ of step 1;
3. only with `--tune-ablation` (spec §4 Option `tune_ablation`): the ϑ = 1 ablation's own λ, over the same λ grid
   at the I chosen in step 2 (otherwise the ablation takes FedCEO's λ and I, as the spec's default says).

The winner is the run with the highest final `val_accuracy`: the global model after the last round on the union
of the clients' validation splits, never the test split. Ties go to the earlier run (grid order). A
`udp_fedavg` run per σ_g (same clients and noise, no smoothing) is the reference the table compares with.
One seed (0). Every run lives in OUT/runs/search-<setting>/..., so an interrupted search resumes; the outputs
are OUT/search.csv (every run), OUT/search.md and OUT/search.json (the choice per σ_g). They cover every σ_g
searched in OUT: `--settings` chooses what runs, and the other σ_g's finished runs are collected. A choice is
`complete` once every run of both stages has finished; `dpfl reproduce fedceo --search-result OUT/search.json`
runs the comparison with the complete ones. A variant (`--partition shards`, `--mechanism udp`) is searched in its
own OUT: search.json records it, and an OUT that holds another variant's search is refused. `--set` overrides
every run of the search; its label (search.json's `scale`) lists them, and only a comparison with the same ones
takes its choices.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.reproduce import fedceo
from dpfl.reproduce.jobs import Grid, GridError, Method, Setting, build_grid
from dpfl.reproduce.runner import OK, Progress, collect_finished, run_jobs
from dpfl.reproduce.tables import columns, csv_text, job_row
from dpfl.results.run_files import write_text_atomic

__all__ = ["LAMBDA_GRIDS", "UDP_LAMBDA_GRID", "THETAS", "INTERVALS", "SearchResult", "lambda_grid", "search_grid",
           "run_search"]

THETAS = (1.02, 1.04, 1.06, 1.08)
# I per scale: the spec's {10, 20, 30} at T = 300; scaled to T = 50 (reduced) and T = 20 (ci) so that every I
# smooths at least once and divides T (the last round is then a smoothing round, as at full scale)
INTERVALS = {"full": (10, 20, 30), "reduced": (5, 10, 25), "ci": (5, 10)}
STAGE1_INTERVAL = {"full": 20, "reduced": 10, "ci": 5}


def _log_points(lo: float, hi: float, n: int = 9) -> list[float]:
    return [float(f"{v:.3g}") for v in np.logspace(math.log10(lo), math.log10(hi), n)]


def lambda_grid(sigma: str) -> list[float]:
    """The spec's λ grid for σ_g (§4: 55..100 step 5; 9 log points in [0.1, 10] / [0.01, 1]) plus Table 2's λ."""
    grid = {"1.0": [float(v) for v in range(55, 101, 5)], "1.5": _log_points(0.1, 10), "2.0": _log_points(0.01, 1)}
    values = grid[sigma]
    paper = fedceo.FEDCEO_PARAMS[sigma][0]
    return sorted(set(values) | {paper})


LAMBDA_GRIDS = {s: lambda_grid(s) for s in fedceo.SIGMAS}
# Under `udp` the spec (§3.1) says λ MUST be re-tuned and gives no grid. Decision: 9 log points over [0.001, 10]
# for every σ_g. The mean of K = 10 uploads carries noise of std σ_g·C/K per weight, whose top singular value on
# the 784 x 64 layer is about σ_g·C/K·(√784 + √64) = 3.6·σ_g; the server's threshold on that mean is
# thr_1/K = 1/(2λK), which this grid takes from 0.005 (λ = 10: changes nothing) to 50 (λ = 0.001: zeroes every tensor).
UDP_LAMBDA_GRID = _log_points(0.001, 10)


def _lambdas(sigma: str, variant: fedceo.Variant) -> list[float]:
    return UDP_LAMBDA_GRID if variant.mechanism == "udp" else LAMBDA_GRIDS[sigma]


def _name(lam: float, theta: float, interval: int) -> str:
    return f"fedceo-lam{lam:g}-th{theta:g}-I{interval}"


def _method(lam: float, theta: float, interval: int) -> Method:
    return Method(_name(lam, theta, interval), "fedceo", (fedceo.fedceo_override(lam, theta, interval),))


def search_grid(scale: str, stage: int, *, best_lam: dict[str, float] | None = None, rounds: int | None = None,
                settings_pattern: str | None = None, variant: fedceo.Variant = fedceo.DEFAULT,
                ablation_at: dict[str, int] | None = None, extra: Sequence[str] = ()) -> Grid:
    """Stage 1 (λ sweep plus the udp_fedavg reference), stage 2 (ϑ × I at `best_lam[σ]`) or stage 3 (the ϑ = 1
    ablation's own λ sweep at the chosen I, `ablation_at[σ]`; `--tune-ablation`) as a Grid. `extra` (--set)
    overrides every run, and the label says so: a comparison takes this search only with the same overrides."""
    settings = []
    for s in fedceo.settings(scale, variant=variant):
        sigma = s.meta["sigma"]
        if stage == 1:
            theta = fedceo.FEDCEO_PARAMS[sigma][1]
            methods = (fedceo.udp_fedavg(variant),  # the reference without smoothing
                       *(_method(lam, theta, STAGE1_INTERVAL[scale]) for lam in _lambdas(sigma, variant)))
        elif stage == 3:
            if ablation_at is None or sigma not in ablation_at:
                continue
            methods = tuple(_method(lam, 1.0, ablation_at[sigma]) for lam in _lambdas(sigma, variant))
        else:
            if best_lam is None or sigma not in best_lam:
                continue
            methods = tuple(_method(best_lam[sigma], th, i) for th in THETAS for i in INTERVALS[scale])
        settings.append(Setting(f"search-{s.name}", s.base, s.overrides, methods, s.dataset,
                                describe=f"search stage {stage}: {s.describe}", meta=dict(s.meta)))
    if not settings:
        raise GridError("the search has no setting to run")
    pattern = ",".join(f"search-{p.strip()}" for p in settings_pattern.split(",") if p.strip()) \
        if settings_pattern else None  # the comparison's setting names, e.g. fmnist-mlp-sg1.5
    return build_grid("fedceo-search", scale, settings, spec_rounds=fedceo.SPEC[scale]["rounds"], spec_seeds=1,
                      rounds=rounds, settings_pattern=pattern, extra=extra)


@dataclass
class SearchResult:
    rows: list[dict[str, Any]]
    chosen: dict[str, dict[str, Any]]
    paths: tuple[Path, Path, Path]


def _best(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    scored = [r for r in rows if r["status"] == OK and r.get("final_val_accuracy") is not None]
    return max(scored, key=lambda r: r["final_val_accuracy"]) if scored else None  # max keeps the first of ties


def run_search(scale: str, out: Path, *, progress: Progress | None = None, rounds: int | None = None,
               settings_pattern: str | None = None, command: str = "",
               execute: Callable[..., Any] | None = None, variant: fedceo.Variant = fedceo.DEFAULT,
               tune_ablation: bool = False, extra: Sequence[str] = ()) -> SearchResult:
    """Run both stages (finished runs are reused), choose per σ_g, write OUT/search.{csv,md,json}.

    `execute` is `run_jobs`'s (tests pass a stand-in). `variant`: which partition and client mechanism.
    `tune_ablation` (spec §4 Option): a third stage sweeps the ϑ = 1 ablation's λ at the chosen I, and the
    choice records it as `ablation_lam` (the comparison's `fedceo_theta1` then uses it). `extra`: --set overrides
    of every run (search.json's label lists them).
    """
    out = Path(out)
    _check_variant(out / "search.json", variant)
    cols = ["stage", "sigma", "lam", "theta", "interval", *columns("fedceo")]
    rows: list[dict[str, Any]] = []
    first = search_grid(scale, 1, rounds=rounds, settings_pattern=settings_pattern, variant=variant, extra=extra)
    selected = {j.setting for j in first.jobs}  # the σ_g this invocation runs; the others are only collected
    planned: dict[str, set[tuple[str, str]]] = {}  # σ_g -> every (setting, method) its choice depends on

    def run(grid: Grid, stage: int) -> None:
        """Run this invocation's jobs of `grid`; collect the other settings' runs finished by earlier ones."""
        for s in grid.settings:
            planned.setdefault(s.meta["sigma"], set()).update((s.name, m.name) for m in s.methods)
        seen = {(r["setting"], r["method"]) for r in rows}
        fresh = [j for j in grid.all_jobs if (j.setting, j.method) not in seen]  # stage 2 repeats stage 1's winner
        outcomes = run_jobs([j for j in fresh if j.setting in selected], out, progress=progress, execute=execute)
        outcomes += collect_finished([j for j in fresh if j.setting not in selected], out)
        order = {(j.setting, j.method): i for i, j in enumerate(fresh)}
        for o in sorted(outcomes, key=lambda o: order[(o.job.setting, o.job.method)]):
            row = job_row(o, grid.label, out, columns=cols)
            setting = grid.setting(o.job.setting)
            params = o.job.config.algorithm.params if o.job.config.algorithm.name == "fedceo" else {}
            row.update(stage=stage, sigma=setting.meta["sigma"], lam=params.get("lam"), theta=params.get("theta"),
                       interval=params.get("interval"))
            rows.append(row)

    run(first, 1)
    best_lam = {}
    for sigma in dict.fromkeys(r["sigma"] for r in rows):
        winner = _best([r for r in rows if r["sigma"] == sigma and r["lam"] is not None])
        if winner is not None:
            best_lam[sigma] = winner["lam"]
    if best_lam:
        run(search_grid(scale, 2, best_lam=best_lam, rounds=rounds, variant=variant, extra=extra), 2)

    def winner(sigma: str) -> dict[str, Any] | None:  # FedCEO's choice: the ϑ > 1 runs of stages 1 and 2
        return _best([r for r in rows if r["sigma"] == sigma and r["lam"] is not None and r["stage"] != 3])

    sigmas = list(dict.fromkeys(r["sigma"] for r in rows))
    if tune_ablation:
        ablation_at = {sigma: w["interval"] for sigma in sigmas if (w := winner(sigma)) is not None}
        if ablation_at:
            run(search_grid(scale, 3, ablation_at=ablation_at, rounds=rounds, variant=variant, extra=extra), 3)
    chosen = {}
    for sigma in sigmas:
        mine = [r for r in rows if r["sigma"] == sigma]
        best = winner(sigma)
        reference = next((r for r in mine if r["method"] == "udp_fedavg"), None)
        finished = {(r["setting"], r["method"]) for r in mine if r["status"] == OK}
        if best is not None:
            chosen[sigma] = {"lam": best["lam"], "theta": best["theta"], "interval": best["interval"],
                             "val_accuracy": best["final_val_accuracy"],
                             "udp_fedavg_val_accuracy": reference and reference.get("final_val_accuracy"),
                             "runs": len(finished), "planned": len(planned[sigma]),
                             "complete": planned[sigma] <= finished,
                             "lam_at_grid_edge": _edge(best["lam"], _lambdas(sigma, variant))}
            ablation = _best([r for r in mine if r["stage"] == 3 and r["interval"] == best["interval"]])
            if tune_ablation and ablation is not None:
                chosen[sigma].update(ablation_lam=ablation["lam"], ablation_val_accuracy=ablation["final_val_accuracy"])
    label = first.label
    record = {"scale": label, "variant": variant.as_dict(), "chosen": chosen}
    paths = (write_text_atomic(out / "search.csv", csv_text(rows, cols)),
             write_text_atomic(out / "search.md", _markdown(rows, chosen, scale, label, command, variant)),
             write_text_atomic(out / "search.json", json.dumps(record, indent=2) + "\n"))
    return SearchResult(rows, chosen, paths)


def _check_variant(path: Path, variant: fedceo.Variant) -> None:
    """Refuse an OUT whose search.json is another variant's: rewriting it would lose that search's choices."""
    try:
        previous = json.loads(path.read_text()).get("variant", fedceo.DEFAULT.as_dict())
    except (OSError, ValueError, AttributeError):
        return  # no (readable) earlier search here: nothing to lose
    if previous != variant.as_dict():
        raise GridError(f"{path} holds the search of the variant {previous}, not {variant.as_dict()}: search each "
                        "variant in its own --out")


def _edge(lam: float, grid: Sequence[float]) -> str | None:
    """"largest" / "smallest" when the chosen λ is an end of its grid: the optimum may lie beyond the grid."""
    return "largest" if lam == max(grid) else "smallest" if lam == min(grid) else None


def _fmt(v: Any) -> str:
    return "—" if v is None else f"{v:.4f}"


def _markdown(rows: Sequence[dict[str, Any]], chosen: dict[str, dict[str, Any]], scale: str, label: str,
              command: str, variant: fedceo.Variant = fedceo.DEFAULT) -> str:
    grid = ("dpfl's grid for `udp` (9 log points over [0.001, 10]; the spec gives none)" if variant.mechanism == "udp"
            else "the spec's grid for σ_g")
    lines = ["# FedCEO hyperparameter search (spec fedceo.md §4)", "",
             f"Scale: **{label}**. Command: `{command}`." if command else f"Scale: **{label}**.", "",
             f"Variant: {variant.split}, client mechanism `{variant.mechanism}`.", "",
             f"Coordinate search, a REDUCTION of the spec's full λ × ϑ × I grid: (1) λ over {grid} "
             "with the paper's ϑ for σ_g and I = " f"{STAGE1_INTERVAL[scale]}; (2) ϑ ∈ "
             f"{{{', '.join(map(str, THETAS))}}}"
             f" × I ∈ {{{', '.join(map(str, INTERVALS[scale]))}}} at the best λ. Selection: the highest final "
             "val_accuracy (the global model after the last round on the union of the clients' validation splits; "
             "the test split is never used). One seed."
             + (" (3) `--tune-ablation`: the ϑ = 1 ablation's own λ, over the same λ grid at the chosen I "
                "(spec §4 Option `tune_ablation`)." if any("ablation_lam" in c for c in chosen.values()) else ""), "",
             "## Chosen", "", "| σ_g | λ | ϑ | I | val acc | udp_fedavg val acc | runs |",
             "|---|---|---|---|---|---|---|"]
    for sigma, c in chosen.items():
        runs = f"{c['runs']} of {c['planned']}" + ("" if c["complete"] else " (**incomplete**: not final)")
        lines.append(f"| {sigma} | {c['lam']:g} | {c['theta']:g} | {c['interval']} | {_fmt(c['val_accuracy'])} | "
                     f"{_fmt(c['udp_fedavg_val_accuracy'])} | {runs} |")
    for sigma, c in chosen.items():
        if "ablation_lam" in c:
            lines += ["", f"σ_g = {sigma}: the ϑ = 1 ablation's own λ = {c['ablation_lam']:g} at I = {c['interval']} "
                      f"(val acc {_fmt(c['ablation_val_accuracy'])})."]
    for sigma, c in chosen.items():
        sweep = [r["final_val_accuracy"] for r in rows if r["sigma"] == sigma and r["stage"] == 1
                 and r["lam"] is not None and r.get("final_val_accuracy") is not None]
        spread = f" Stage 1's val acc spans {max(sweep) - min(sweep):.4f} over the λ grid." if sweep else ""
        if c["lam_at_grid_edge"] == "largest":
            lines += ["", f"**σ_g = {sigma}: the chosen λ is the grid's largest**, so the optimum may lie beyond the "
                      "grid; larger λ smooths less, and as λ grows FedCEO tends to UDP-FedAvg with personal copies."
                      + spread]
        elif c["lam_at_grid_edge"] == "smallest":
            lines += ["", f"**σ_g = {sigma}: the chosen λ is the grid's smallest**, so the optimum may lie beyond the "
                      "grid (smaller λ smooths harder)." + spread]
    lines += ["", "## Every run", "", "| σ_g | stage | method | val acc | status |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['sigma']} | {r['stage']} | {r['method']} | {_fmt(r.get('final_val_accuracy'))} | "
                     f"{r['status']} |")
    return "\n".join(lines) + "\n"

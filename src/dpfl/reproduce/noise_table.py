"""The Robust-HDP thesis's Table 3.4: the round-1 noise statistic of each aggregator, per budget list.

noise_stat = Σ_i w_i² σ_i² / (p η²) (spec heterogeneous_dp §5) depends on the noise each client was
calibrated to, i.e. on the run's *planned* length, so a shortened run would change it. This module
therefore builds each run at its full planned length (e.g. 200 rounds), trains round 1 once, and
applies every aggregator to the same uploads: WeiAvg, DPFedAvg (uniform), Robust-HDP and the oracle
share the clients' own calibration; Minimum-ε recalibrates everyone to the smallest ε and so trains
its own round 1. Both the analytic value (σ_i² from T_i, η, C, z_i, b_i) and the empirical one (the
noise actually drawn) are reported. Nothing is charged to a ledger: this is a diagnostic, not a run.

Two ε conversions, side by side (`CONVERSIONS`): "dp_accounting", the noise dpfl calibrates (dp-accounting's
RDP-to-(ε, δ) conversion, the run's own accountant), and "classic", the noise the thesis's code calibrated
(spec heterogeneous_dp §2.3, §7.3 "code parity"): the smallest z with min_α [RDP(α) − log δ / (α − 1)] ≤ ε over
the spec's orders, rounded up to 2 decimals. The classic conversion is looser, so it buys more noise for the
same ε: the table shows how much of the thesis's numbers that explains.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.oracle import OracleAverage
from dpfl.algorithms.stages import RoundInputs
from dpfl.experiment.build import build_run
from dpfl.experiment.config import RunConfig, config_to_dict, config_to_yaml, validate_config
from dpfl.experiment.federated_run import FederatedRun
from dpfl.reproduce import robust_hdp
from dpfl.reproduce.jobs import GridError
from dpfl.results.environment import computed_and_written, describe_job
from dpfl.results.run_files import write_json_atomic, write_text_atomic

TABLE_METHODS = ("weiavg", "fedavg", "min_eps", "robust_hdp", "oracle")
CONVERSIONS = ("dp_accounting", "classic")
Z_MAX = 1e4  # largest noise multiplier the classic calibration searches


def classic_noise(run: FederatedRun) -> np.ndarray:
    """Each client's DP-SGD noise multiplier under the classic conversion, as the RHDP code calibrated it: the
    smallest multiple of 0.01 (sigma rounded up to 2 decimals) whose classic ε for the client's planned steps (same
    steps, sampling and target as `run`'s own calibration) is at most its target, which it never exceeds."""
    from dpfl.privacy.events import dpsgd_event
    from dpfl.privacy.two_stage import calibrate_grid

    plan = run.planned_run("dpsgd")
    if plan.local_sampling != "poisson":
        raise ValueError("the classic calibration is for Poisson-sampled DP-SGD (the thesis's setting)")
    assert plan.records is not None and plan.batch_sizes is not None and plan.local_steps is not None
    targets = plan.targets if plan.targets is not None else [b.epsilon for b in plan.budgets]
    parts = plan.participations()
    cache: dict[tuple, float] = {}
    out = np.empty(plan.n_clients)
    for i in range(plan.n_clients):
        b, m = int(plan.batch_sizes[i]), int(plan.records[i])
        steps = max(1, int(round(parts[i] * int(plan.local_steps[i]))))
        key = (float(targets[i]), plan.budgets[i].delta, min(1.0, b / m), steps)
        if key not in cache:
            target, delta, q, t = key
            cache[key] = calibrate_grid(lambda z, q=q, t=t: dpsgd_event(z, t, sampling="poisson", sample_rate=q),
                                        target, delta, "classic", z_max=Z_MAX)
        out[i] = cache[key]
    return out


def _built(cfg: RunConfig, conversion: str) -> FederatedRun:
    """`cfg`'s run with its clients' noise calibrated under `conversion`."""
    run = build_run(cfg)
    if conversion == "classic":
        run.noise = classic_noise(run)
    elif conversion != "dp_accounting":
        raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
    return run


def _variant(cfg: RunConfig, name: str, params: dict[str, Any]) -> RunConfig:
    data = config_to_dict(cfg)
    data["algorithm"] = {"name": name, "params": params}
    return validate_config(data)


def round1_noise_statistics(cfg: RunConfig, methods: Sequence[str] = TABLE_METHODS,
                            conversion: str = "dp_accounting") -> dict[str, dict[str, float]]:
    """{method: {"noise_stat_analytic", "noise_stat_empirical", "z_mean"}} of round 1 of `cfg` (full
    participation), every client's noise calibrated under `conversion` (module docstring)."""
    unknown = sorted(set(methods) - set(TABLE_METHODS))
    if unknown:
        raise ValueError(f"no round-1 noise statistic for {unknown}; choose from {TABLE_METHODS}")
    out: dict[str, dict[str, float]] = {}
    shared = [m for m in methods if m != "min_eps"]
    if shared:
        run = _built(_variant(cfg, "robust_hdp", dict(cfg.algorithm.params) if cfg.algorithm.name == "robust_hdp"
                              else {}), conversion)
        w, local = run.first_round()
        aggregators = {"weiavg": FedAvg("epsilon"), "fedavg": FedAvg("uniform"), "oracle": OracleAverage(),
                       "robust_hdp": run.algorithm.aggregator}
        for m in shared:
            agg = aggregators[m]
            if agg.privileged:
                weights = agg.weights(local.view, local.channel, local.dim)
            else:  # Robust-HDP's weights come from the uploads: those of the state its round-1 update returns
                step = agg.update(agg.init(w), w, local.uploads, RoundInputs(local.view, run.seed, 0))
                weights = agg.aggregation_weights(step.state, local.view, None, local.dim)
            out[m] = {**run.noise_statistics(weights, local), "z_mean": float(np.mean(run.noise))}
    if "min_eps" in methods:
        run = _built(_variant(cfg, "min_eps", {"epsilon": "observed"}), conversion)
        w, local = run.first_round()
        out["min_eps"] = {**run.noise_statistics(FedAvg("uniform").weights(local.view), local),
                          "z_mean": float(np.mean(run.noise))}
    return {m: out[m] for m in methods}


def planned_configs(scale: str, *, datasets: Sequence[str], settings_pattern: str | None = None
                    ) -> tuple[dict[str, RunConfig], str]:
    """The table's settings at a scale (`dpfl reproduce robust-hdp --noise-table`): each selected main setting of the
    Robust-HDP grid -> its config at the planned length (one seed), and the grid's scale label; a GridError when the
    selection has no main setting."""
    grid = robust_hdp.grid(scale, datasets=datasets, seeds=1, settings_pattern=settings_pattern,
                           methods=["robust_hdp"])
    mains = {s.name for s in grid.settings if s.meta.get("kind") == "main"}
    configs = {j.setting: j.config for j in grid.jobs if j.setting in mains}
    if not configs:
        raise GridError("no main setting selected for the noise table (see --dry-run)")
    return configs, grid.label


def write_noise_table(configs: Mapping[str, RunConfig], out: Path, *, label: str = "",
                      on_setting: Callable[[str], None] | None = None,
                      conversions: Sequence[str] = CONVERSIONS) -> tuple[Path, Path]:
    """Round-1 noise statistics of every setting, under each ε conversion, into OUT/noise_table.{csv,md}; each
    (setting, conversion) is cached (OUT/noise_table/<setting>.json) and not recomputed for the same config.

    `configs`: setting name -> its config at the spec's planned length (one seed).
    """
    out = Path(out)
    rows: list[dict[str, Any]] = []
    environments: list[list[dict[str, Any]]] = []
    for setting, cfg in configs.items():
        cache = out / "noise_table" / f"{setting}.json"
        wanted = config_to_yaml(cfg)
        saved = json.loads(cache.read_text()) if cache.exists() else None
        if saved is None or saved["config"] != wanted:
            saved = {"config": wanted}
        for conversion in conversions:
            key = _stats_key(conversion)
            if key not in saved or any("z_mean" not in v for v in saved[key].values()):
                if on_setting is not None:
                    on_setting(f"{setting} ({conversion})")
                saved[key] = round1_noise_statistics(cfg, conversion=conversion)
                saved.setdefault("environments", {})[key] = describe_job()
                cache.parent.mkdir(parents=True, exist_ok=True)
                write_json_atomic(cache, saved)
            recorded = saved.get("environments", {}).get(key)
            environments.append([recorded] if recorded else [])
            for method, stats in saved[key].items():
                rows.append({"setting": setting, "conversion": conversion, "method": method,
                             "rounds_planned": cfg.training.rounds, "seed": cfg.seed, **stats})
    csv_path, md_path = out / "noise_table.csv", out / "noise_table.md"
    header = ["setting", "conversion", "method", "rounds_planned", "seed", "z_mean", "noise_stat_analytic",
              "noise_stat_empirical"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(csv_path, buf.getvalue())
    write_text_atomic(md_path, _markdown(rows, label, computed_and_written(environments, "setting-conversion pair")))
    return csv_path, md_path


def _stats_key(conversion: str) -> str:
    return "stats" if conversion == "dp_accounting" else f"stats_{conversion}"  # "stats": the earlier cache files


def _markdown(rows: Sequence[Mapping[str, Any]], label: str, provenance_line: str) -> str:
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    conversions = [c for c in CONVERSIONS if any(r["conversion"] == c for r in rows)]
    methods = [m for m in TABLE_METHODS if any(r["method"] == m for r in rows)]
    value = {(r["setting"], r["conversion"], r["method"]): r for r in rows}
    lines = ["# Round-1 noise statistic (Robust-HDP thesis Table 3.4)", "",
             (f"Scale: {label}. " if label else "") + "Σ_i w_i² σ_i² / (p η²): the per-parameter noise variance of the "
             "round-1 aggregate, normalised by η² "
             "(spec heterogeneous_dp §5). Every run is calibrated for its full planned length "
             f"({', '.join(sorted({str(r['rounds_planned']) for r in rows}))} rounds) and only round 1 is trained; "
             "WeiAvg, DPFedAvg (uniform), Robust-HDP and the oracle aggregate the same uploads, Minimum-ε trains its "
             "own (everyone at the smallest ε). Cells: analytic (σ_i² = T_i η² p C² z_i² / b_i²) / empirical "
             "(σ_i² = ‖n_i‖², the noise actually drawn). The oracle is a privileged reference: it reads the true "
             "noise. Lower is better. Conversion: `dp_accounting` is the noise dpfl calibrates (dp-accounting's "
             "RDP-to-(ε, δ) conversion); `classic` is the noise of the smallest z with min_α [RDP(α) − log δ/(α − 1)] "
             "≤ ε, the conversion the thesis's code used (looser, so more noise for the same ε). z̄: the clients' mean "
             "noise multiplier (of the shared calibration; Minimum-ε's own is in the CSV).", ""]
    lines += ["| setting | conversion | z̄ | " + " | ".join(methods) + " |", "|---" * (len(methods) + 3) + "|"]
    for s in settings:
        for c in conversions:
            cells = []
            for m in methods:
                r = value.get((s, c, m))
                cells.append("n/a" if r is None
                             else f"{r['noise_stat_analytic']:.4g} / {r['noise_stat_empirical']:.4g}")
            shared = value.get((s, c, "weiavg")) or value.get((s, c, methods[0]))
            z = f"{shared['z_mean']:.3f}" if shared is not None and "z_mean" in shared else "n/a"
            lines.append(f"| {s} | {c} | {z} | " + " | ".join(cells) + " |")
    if "oracle" in methods:
        lines += ["", "Ratio to the oracle (analytic; ≥ 1, 1 is optimal):", "",
                  "| setting | conversion | " + " | ".join(m for m in methods if m != "oracle") + " |",
                  "|---" * (len(methods) + 1) + "|"]
        for s in settings:
            for c in conversions:
                best = value.get((s, c, "oracle"))
                cells = []
                for m in methods:
                    if m == "oracle":
                        continue
                    r = value.get((s, c, m))
                    cells.append("n/a" if r is None or best is None else
                                 f"{r['noise_stat_analytic'] / best['noise_stat_analytic']:.3f}")
                lines.append(f"| {s} | {c} | " + " | ".join(cells) + " |")
    lines += ["", provenance_line]
    return "\n".join(lines) + "\n"

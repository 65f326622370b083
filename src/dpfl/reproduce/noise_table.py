"""The Robust-HDP thesis's Table 3.4: the round-1 noise statistic of each aggregator, per budget list.

noise_stat = Σ_i w_i² σ_i² / (p η²) (spec heterogeneous_dp §5) depends on the noise each client was
calibrated to, i.e. on the run's *planned* length, so a shortened run would change it. This module
therefore builds each run at its full planned length (e.g. 200 rounds), trains round 1 once, and
applies every aggregator to the same uploads: WeiAvg, DPFedAvg (uniform), Robust-HDP and the oracle
share the clients' own calibration; Minimum-ε recalibrates everyone to the smallest ε and so trains
its own round 1. Both the analytic value (σ_i² from T_i, η, C, z_i, b_i) and the empirical one (the
noise actually drawn) are reported. Nothing is charged to a ledger: this is a diagnostic, not a run.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dpfl.algorithms.server.fedavg import FedAvg
from dpfl.algorithms.server.oracle import OracleAverage
from dpfl.experiment.build import build_run
from dpfl.experiment.config import RunConfig, config_to_dict, config_to_yaml, validate_config
from dpfl.experiment.federated_run import FederatedRun
from dpfl.engine import params as P
from dpfl.results.run_files import write_json_atomic, write_text_atomic

TABLE_METHODS = ("weiavg", "fedavg", "min_eps", "robust_hdp", "oracle")


def _variant(cfg: RunConfig, name: str, params: dict[str, Any]) -> RunConfig:
    data = config_to_dict(cfg)
    data["algorithm"] = {"name": name, "params": params}
    return validate_config(data)


def _first_round(run: FederatedRun):
    w = P.model_params(run.model)
    everyone = run.algorithm.selection.select(list(range(run.n_clients)), run.seed, 0)
    return w, run.local_round(0, w, everyone, run.algorithm.selection.expected_count(run.n_clients))


def round1_noise_statistics(cfg: RunConfig, methods: Sequence[str] = TABLE_METHODS) -> dict[str, dict[str, float]]:
    """{method: {"noise_stat_analytic", "noise_stat_empirical"}} of round 1 of `cfg` (full participation)."""
    unknown = sorted(set(methods) - set(TABLE_METHODS))
    if unknown:
        raise ValueError(f"no round-1 noise statistic for {unknown}; choose from {TABLE_METHODS}")
    out: dict[str, dict[str, float]] = {}
    shared = [m for m in methods if m != "min_eps"]
    if shared:
        run = build_run(_variant(cfg, "robust_hdp", dict(cfg.algorithm.params) if cfg.algorithm.name == "robust_hdp" else {}))
        w, local = _first_round(run)
        aggregators = {"weiavg": FedAvg("epsilon"), "fedavg": FedAvg("uniform"), "oracle": OracleAverage(),
                       "robust_hdp": run.algorithm.aggregator}
        for m in shared:
            agg = aggregators[m]
            if getattr(agg, "privileged", False):
                weights = agg.weights(local.view, local.channel, local.dim)
            else:
                agg.aggregate(w, local.uploads, local.view, run.seed, 0)  # Robust-HDP's weights come from the uploads
                weights = agg.weights(local.view)
            out[m] = run.noise_statistics(weights, local)
    if "min_eps" in methods:
        run = build_run(_variant(cfg, "min_eps", {"epsilon": "observed"}))
        w, local = _first_round(run)
        out["min_eps"] = run.noise_statistics(FedAvg("uniform").weights(local.view), local)
    return {m: out[m] for m in methods}


def write_noise_table(configs: Mapping[str, RunConfig], out: Path, *, label: str = "",
                      on_setting: Callable[[str], None] | None = None) -> tuple[Path, Path]:
    """Round-1 noise statistics of every setting into OUT/noise_table.{csv,md}; per-setting results cached.

    `configs`: setting name -> its config at the spec's planned length (one seed). A setting already
    computed (OUT/noise_table/<setting>.json for the same config) is not recomputed.
    """
    out = Path(out)
    rows: list[dict[str, Any]] = []
    for setting, cfg in configs.items():
        cache = out / "noise_table" / f"{setting}.json"
        wanted = config_to_yaml(cfg)
        saved = json.loads(cache.read_text()) if cache.exists() else None
        if saved is None or saved["config"] != wanted:
            if on_setting is not None:
                on_setting(setting)
            saved = {"config": wanted, "stats": round1_noise_statistics(cfg)}
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(cache, saved)
        for method, stats in saved["stats"].items():
            rows.append({"setting": setting, "method": method, "rounds_planned": cfg.training.rounds,
                         "seed": cfg.seed, **stats})
    csv_path, md_path = out / "noise_table.csv", out / "noise_table.md"
    header = ["setting", "method", "rounds_planned", "seed", "noise_stat_analytic", "noise_stat_empirical"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(csv_path, buf.getvalue())
    write_text_atomic(md_path, _markdown(rows, label))
    return csv_path, md_path


def _markdown(rows: Sequence[Mapping[str, Any]], label: str) -> str:
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    methods = [m for m in TABLE_METHODS if any(r["method"] == m for r in rows)]
    value = {(r["setting"], r["method"]): r for r in rows}
    lines = ["# Round-1 noise statistic (Robust-HDP thesis Table 3.4)", "",
             (f"Scale: {label}. " if label else "") + "Σ_i w_i² σ_i² / (p η²): the per-parameter noise variance of the round-1 aggregate, normalised by η² "
             "(spec heterogeneous_dp §5). Every run is calibrated for its full planned length "
             f"({', '.join(sorted({str(r['rounds_planned']) for r in rows}))} rounds) and only round 1 is trained; "
             "WeiAvg, DPFedAvg (uniform), Robust-HDP and the oracle aggregate the same uploads, Minimum-ε trains its "
             "own (everyone at the smallest ε). Cells: analytic (σ_i² = T_i η² p C² z_i² / b_i²) / empirical "
             "(σ_i² = ‖n_i‖², the noise actually drawn). The oracle is a privileged reference: it reads the true "
             "noise. Lower is better.", ""]
    lines += ["| setting | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for s in settings:
        cells = []
        for m in methods:
            r = value.get((s, m))
            cells.append("n/a" if r is None else f"{r['noise_stat_analytic']:.4g} / {r['noise_stat_empirical']:.4g}")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    if "oracle" in methods:
        lines += ["", "Ratio to the oracle (analytic; ≥ 1, 1 is optimal):", "",
                  "| setting | " + " | ".join(m for m in methods if m != "oracle") + " |",
                  "|---" * len(methods) + "|"]
        for s in settings:
            best = value.get((s, "oracle"))
            cells = []
            for m in methods:
                if m == "oracle":
                    continue
                r = value.get((s, m))
                cells.append("n/a" if r is None or best is None else
                             f"{r['noise_stat_analytic'] / best['noise_stat_analytic']:.3f}")
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

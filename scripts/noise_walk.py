"""The global model's norm, round by round, beside the norm the run's own logged DP noise alone would give it.

Every private round the aggregate hands part of the clients' DP-SGD noise to the global model, and the run logs how
much: `noise_stat_empirical` (weighted means: sum_i w_i^2 ||n_i||^2 / (p eta^2) from the noise actually drawn) or
`pfa_noise_passthrough` (PFA: ||N||^2 / (p eta^2), the round's noise pushed through its projection). Independent
from round to round, that noise adds a random walk to the weights, so where the walk dominates what was learned

    ||w_r||^2  ~  ||w_0||^2 + p eta^2 * sum_{s <= r} stat_s

(eta the client learning rate, p the number of parameters, w_0 the run's initial model: rebuilt from its config,
the same seed). docs/papers/robust_hdp.md compares final norms with a walk predicted from the calibration alone
(`scripts/pfa_aggregate_noise.py --runs`); this reads the runs' own per-round values, so it needs runs that log them
(written since 2026-11-30) and works for any budget list. A norm well below the walk means the aggregate's signal
and its noise partly cancel or the model shrinks them (weight decay, a server step below 1); well above it, that the
model grew for reasons other than the noise (learning). It is a diagnostic, not a guarantee: it says nothing of
privacy, and the stat is the engine's (the clients' real noise), which no server sees.

    python scripts/noise_walk.py RUN_DIR [RUN_DIR ...] [--every 20] [--json | --csv]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

from dpfl.engine import params as P
from dpfl.experiment.build import build_run
from dpfl.experiment.config import load_config
from dpfl.experiment.run_directory import CONFIG
from dpfl.results.run_files import RunDirError, read_metrics

STAT_KEYS = ("noise_stat_empirical", "pfa_noise_passthrough")
EVALUATION = ("test_accuracy", "test_acc_clients_mean", "test_loss")  # null on rounds without evaluation


def walk(run_dir: Path) -> dict[str, Any]:
    """{"run", "stat_key", "initial_norm", "rounds": [{"round", "param_norm", "walk", "ratio", "stat", and the
    evaluation's test_accuracy, test_acc_clients_mean, test_loss}]} for one run."""
    run_dir = Path(run_dir)
    try:
        rows = read_metrics(run_dir)
    except RunDirError as err:
        raise SystemExit(str(err)) from None
    if not rows:
        raise SystemExit(f"{run_dir}: no metrics.jsonl rows (not a dpfl run directory, or no round finished)")
    key = next((k for k in STAT_KEYS if all(k in r for r in rows)), None)
    if key is None or any("param_norm" not in r for r in rows):
        raise SystemExit(f"{run_dir}: every round needs param_norm and one of {', '.join(STAT_KEYS)} "
                         "(a private weighted-mean or PFA run with DP-SGD clients, written since 2026-11-30)")
    config = load_config(run_dir / CONFIG)
    server_lr = config.algorithm.params.get("server_lr", 1.0)
    if server_lr != 1.0:
        raise SystemExit(f"{run_dir}: server_lr {server_lr}: the walk below is for a server step of 1")
    run = build_run(config)
    w = P.model_params(run.model)  # the initial model, as the run starts from it
    w0 = float(P.global_norms({name: t.double() for name, t in w.items()}, leading=0)) ** 2
    p, lr = P.num_parameters(w), run.algorithm.local.spec.lr
    total, out = 0.0, []
    for row in rows:
        stat = float(row[key])
        total += stat
        predicted = math.sqrt(w0 + p * lr * lr * total)
        out.append({"round": row["round"], "param_norm": row["param_norm"], "walk": predicted,
                    "ratio": row["param_norm"] / predicted, "stat": stat, **{k: row.get(k) for k in EVALUATION}})
    return {"run": str(run_dir), "stat_key": key, "initial_norm": math.sqrt(w0), "rounds": out}


def shown(rounds: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """Rounds 1, every, 2 * every, ... and the last one."""
    return [r for i, r in enumerate(rounds) if r["round"] == 1 or r["round"] % every == 0 or i == len(rounds) - 1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (finished or not)")
    parser.add_argument("--every", type=int, default=20, help="show every N-th round (and the first and last)")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="every round of every run as JSON instead of the table")
    shape.add_argument("--csv", action="store_true", help="every round of every run as CSV rows instead of the table")
    args = parser.parse_args(argv)
    if args.every < 1:
        parser.error("--every must be >= 1")
    results = [walk(r) for r in args.runs]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    if args.csv:
        columns = ["run", "stat_key", "round", "param_norm", "walk", "ratio", "stat", *EVALUATION]
        writer = csv.DictWriter(sys.stdout, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({"run": res["run"], "stat_key": res["stat_key"], **r}
                         for res in results for r in res["rounds"])
        return
    print("| run | stat | round | ‖w‖ | noise walk | ‖w‖ / walk | test accuracy |")
    print("|---|---|---|---|---|---|---|")
    for res in results:
        for r in shown(res["rounds"], args.every):
            acc = "" if r["test_accuracy"] is None else f"{r['test_accuracy']:.4f}"
            print(f"| {res['run']} | {res['stat_key']} | {r['round']} | {r['param_norm']:.2f} | {r['walk']:.2f} | "
                  f"{r['ratio']:.3f} | {acc} |")


if __name__ == "__main__":
    main()

"""Benchmark: a large population with a small cohort per round. Memory should grow with the cohort, not the population.

Each setting runs in its own subprocess (so peak RSS is that setting's alone): synthetic tabular records
(`synthetic`: 8 features, 10 classes, RECORDS_PER_CLIENT = 2 training records per client, 1% more as the global
test set) split iid among N clients, K of them drawn per round (fixed-size selection), sample-level DP-SGD with a
budget per client (calibrated: clients of equal size share one calibration), a small MLP. It reports peak RSS, the
seconds of set-up (data, split, calibration) and per round, and the bytes per client of the built run.

    python benchmarks/scale.py                      # readable table: 1e4, 1e5, 1e6, 1e7 clients, cohort 100
    python benchmarks/scale.py --json               # one JSON object
    python benchmarks/scale.py --population 10000 --cohort 100 --rounds 5   # one setting

10,000,000 clients take a few minutes and about 6 GiB. No timed assertion anywhere: these are measurements. Peak RSS
is `ru_maxrss` of the child process.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

# (population, cohort) settings of the default sweep: the population at a fixed cohort
SWEEP = [(10_000, 100), (100_000, 100), (1_000_000, 100), (10_000_000, 100)]
RECORDS_PER_CLIENT = 2  # training records of each client (the synthetic dataset grows with the population)
TEST_FRACTION = 0.01  # of the synthetic records, the global test set


def _one(population: int, cohort: int, rounds: int, per_client: int) -> dict:
    """Run one setting in this process and return its measurements."""
    import torch

    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import validate_config

    torch.set_num_threads(int(os.environ.get("DPFL_BENCH_THREADS", torch.get_num_threads())))
    records = population * per_client
    cfg = validate_config({
        "name": f"scale-{population}-{cohort}", "seed": 0,
        "data": {"dataset": "synthetic", "clients": population, "partition": "iid", "max_train_samples": records,
                 "options": {"n_samples": int(records / (1 - TEST_FRACTION)) + 1000, "n_features": 8,
                             "n_classes": 10, "test_fraction": TEST_FRACTION}},
        "model": {"name": "relu_mlp"},
        "algorithm": {"name": "dp_fedavg_local"},
        "training": {"rounds": rounds, "local_steps": 5, "batch_size": 8, "optimizer": {"lr": 0.1},
                     "selection": {"kind": "fixed", "k": cohort}},
        "privacy": {"clip": 1.0, "budgets": 8.0, "participation": "worst_case"},
        "evaluation": {"every": rounds},
    })
    rss_start = _rss_mib()
    t0 = time.perf_counter()
    run = build_run(cfg)
    setup = time.perf_counter() - t0
    rss_built = _rss_mib()
    t1 = time.perf_counter()
    result = run.run()
    total = time.perf_counter() - t1
    return {
        "population": population, "cohort": cohort, "rounds": len(result.history), "records": records,
        "records_per_client": per_client, "setup_seconds": setup,
        "seconds_per_round": total / max(1, len(result.history)),
        "round_seconds": [row["seconds"] for row in result.history],
        "rss_mib_after_imports": rss_start, "rss_mib_after_build": rss_built, "peak_rss_mib": _rss_mib(),
        "stop_reason": result.stop_reason, "final_accuracy": result.final_accuracy,
        "threads": torch.get_num_threads(),
    }


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", type=int, help="one setting: this many clients (with --cohort)")
    parser.add_argument("--cohort", type=int, help="one setting: clients per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records-per-client", type=int, default=RECORDS_PER_CLIENT)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_one(args.population, args.cohort, args.rounds, args.records_per_client)))
        return 0
    settings = [(args.population, args.cohort)] if args.population else SWEEP
    rows = []
    for population, cohort in settings:
        print(f"population {population}, cohort {cohort} ...", file=sys.stderr, flush=True)
        child = subprocess.run([sys.executable, __file__, "--child", "--population", str(population), "--cohort",
                                str(cohort), "--rounds", str(args.rounds), "--records-per-client",
                                str(args.records_per_client)],
                               capture_output=True, text=True)
        if child.returncode != 0:
            print(child.stderr, file=sys.stderr)
            return 1
        rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"settings": rows, "load_average_at_end": load}))
        return 0
    print(f"{'population':>10} {'cohort':>7} {'records/client':>14} {'setup s':>8} {'s/round':>8} "
          f"{'round s (2nd+)':>14} {'peak RSS MiB':>13}")
    for r in rows:
        later = r["round_seconds"][1:] or r["round_seconds"]
        print(f"{r['population']:>10} {r['cohort']:>7} {r['records_per_client']:>14} {r['setup_seconds']:>8.2f} "
              f"{r['seconds_per_round']:>8.3f} {sum(later) / len(later):>14.3f} {r['peak_rss_mib']:>13.0f}")
    print("s/round: the run's seconds (its rounds and the privacy report at the end) / rounds; round s: a round's "
          "own seconds (metrics row), the first round's one-off costs left out")
    print(f"(load average at the end: {load:.2f}; threads {rows[0]['threads'] if rows else '-'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

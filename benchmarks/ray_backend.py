"""Benchmark: the Ray backend (`backend: ray`) against the in-process engine, and Ray's overhead per round.

Two workloads, each run in process (`local`) and on 1 and 2 Ray actors on this machine:

1. engine  -- engine.py's round: 24 clients x 100 DP-SGD steps, PFA CNN, Poisson batches of 8 (Fashion-MNIST
              if present, else engine.py's synthetic images), `backend.train` timed alone;
2. scale   -- 1,000 clients, 100 drawn per round (fixed-size selection), 5 DP-SGD steps of 8 records, a small
              MLP on synthetic data: whole `FederatedRun` rounds (selection, accounting, aggregation included).

Per setting: the median seconds per round over `--repeats` rounds after one warm-up round (which pays the
actors' start and the records' transfer; reported as `setup_seconds`). Ray's overhead per round is the 1-actor
time minus the local time at the same thread count (the work is the same; what differs is the transfer of the
start model and the results and the call through the object store). Every Ray result is checked equal to the
local one bit for bit. Nothing asserts a speed.

    python benchmarks/ray_backend.py            # readable table
    python benchmarks/ray_backend.py --json     # one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

from bench_common import loadavg, log


def engine_workload():
    """engine.py's default round as (train(backend) -> LocalResult)."""
    from engine import CLIP, LR, MODEL, NOISE, load_client_data

    from dpfl.engine import params as P
    from dpfl.engine.local_training import ClientPlan, LocalSpec
    from dpfl.engine.pooled import PooledData
    from dpfl.models import build_model

    clients, samples, steps, batch = 24, 1200, 100, 8
    xs, ys, source, _ = load_client_data(clients, samples, seed=0)
    data = PooledData.from_clients(xs, ys)
    model = build_model(MODEL, (1, 28, 28), 10, seed=0)
    spec = LocalSpec(lr=LR, clip=CLIP, sampling="poisson")
    plans = [ClientPlan(i, batch, steps, NOISE) for i in range(clients)]
    start = P.model_params(model)

    def one_round(backend, r: int):
        return backend.train(model, spec, plans, data, start, seed=0, round_=r, stacked_start=False,
                             max_elements=1 << 26, anchor=None).params

    return one_round, {"clients": clients, "steps": steps, "batch": batch, "model": MODEL, "data": source}


def scale_config(rounds: int):
    from dpfl.experiment.config import validate_config

    return validate_config({
        "name": "ray-scale", "seed": 0,
        "data": {"dataset": "synthetic", "clients": 1000, "partition": "iid",
                 "options": {"n_samples": 125_000, "n_features": 32, "n_classes": 10}},
        "model": {"name": "relu_mlp"},
        "algorithm": {"name": "dp_fedavg_local"},
        "training": {"rounds": rounds, "local_steps": 5, "batch_size": 8, "optimizer": {"lr": 0.1},
                     "selection": {"kind": "fixed", "k": 100}},
        "privacy": {"clip": 1.0, "budgets": 8.0, "participation": "worst_case"},
        "evaluation": {"every": rounds},
    })


def time_engine(backend, one_round, repeats: int) -> dict:
    t0 = time.perf_counter()
    first = one_round(backend, 0)
    setup = time.perf_counter() - t0
    times = []
    for r in range(1, repeats + 1):
        t = time.perf_counter()
        one_round(backend, r)
        times.append(time.perf_counter() - t)
    return {"setup_seconds": setup, "seconds_per_round": statistics.median(times), "params": first}


def time_scale(backend, repeats: int) -> dict:
    from dpfl.experiment.build import build_run

    run = build_run(scale_config(repeats + 1))
    run.backend = backend
    t0 = time.perf_counter()
    result = run.run()
    total = time.perf_counter() - t0
    seconds = [row["seconds"] for row in result.history]
    return {"setup_seconds": total - sum(seconds[1:]), "seconds_per_round": statistics.median(seconds[1:]),
            "params": result.params}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workloads", default="engine,scale")
    args = parser.parse_args(argv)
    import ray

    from dpfl.engine.backends.local import LocalBackend
    from dpfl.engine.backends.ray import RayBackend

    cpus = os.cpu_count() or 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ray.init(num_cpus=cpus, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    settings = [("local", None, cpus), ("ray", 1, cpus), ("ray", 2, max(1, cpus // 2))]
    out: dict = {"cpus": cpus, "torch": torch.__version__, "ray": ray.__version__, "loadavg_start": loadavg(),
                 "workloads": {}}
    for workload in args.workloads.split(","):
        rows, reference = [], None
        if workload == "engine":
            one_round, info = engine_workload()  # data and model once; each setting times the same round
        else:
            info = {"population": 1000, "cohort": 100, "local_steps": 5, "batch": 8, "model": "relu_mlp"}
        for name, actors, threads in settings:
            log(f"{workload}: {name} actors={actors} threads={threads}")
            torch.set_num_threads(threads)
            backend = LocalBackend() if actors is None else RayBackend(actors=actors, threads=threads)
            if workload == "engine":
                res = time_engine(backend, one_round, args.repeats)
            else:
                res = time_scale(backend, args.repeats)
            backend.close()
            params = res.pop("params")
            reference = reference or params
            res["equal_to_local"] = all(torch.equal(params[n], reference[n]) for n in params)
            rows.append({"backend": name, "actors": actors, "threads_per_actor": threads, **res})
        local, one = rows[0]["seconds_per_round"], rows[1]["seconds_per_round"]
        out["workloads"][workload] = {"info": info, "rows": rows, "ray_overhead_seconds_per_round": one - local}
    torch.set_num_threads(cpus)
    ray.shutdown()
    out["loadavg_end"] = loadavg()
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0
    for workload, w in out["workloads"].items():
        print(f"\n{workload}: {w['info']}")
        print(f"{'backend':8} {'actors':>6} {'threads':>7} {'setup s':>8} {'s/round':>8} {'equal':>6}")
        for r in w["rows"]:
            print(f"{r['backend']:8} {str(r['actors'] or '-'):>6} {r['threads_per_actor']:>7} "
                  f"{r['setup_seconds']:8.2f} {r['seconds_per_round']:8.3f} {str(r['equal_to_local']):>6}")
        print(f"Ray's overhead per round (1 actor - local, same threads): {w['ray_overhead_seconds_per_round']:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

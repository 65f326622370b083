"""Benchmark: a reproduce grid in one process against `--workers N` (`dpfl.reproduce.workers`).

What a user would otherwise run is one `dpfl reproduce` process, which lets torch use every core for each run in
turn. The workers instead run N jobs at once with cores // N threads each. The same jobs (a slice of the PFA ci
grid with the PFA CNN by default: PyTorch work like the full grids', seconds per run) run each way into a fresh
--out, and the script reports the wall-clock seconds of the whole grid, spawn and start-up of the workers
included, and the ratio. Every worker run is checked equal (metrics, model) to the same job run in one process at
the workers' thread count. Nothing asserts a speed.

    python benchmarks/grid_workers.py              # readable table
    python benchmarks/grid_workers.py --json       # one JSON object on stdout
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from bench_common import loadavg, log


def _grid(settings: str, methods: list[str], rounds: int | None):
    from dpfl.reproduce import pfa

    return pfa.grid("ci", rounds=rounds, methods=methods, settings_pattern=settings, calibration="both")


def _one_process(jobs, out: Path, threads: int) -> float:
    from dpfl.reproduce.runner import run_jobs

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        outcomes = run_jobs(jobs, out)
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(before)
    assert all(o.status == "ok" for o in outcomes), [(o.job.key, o.status, o.message) for o in outcomes]
    return seconds


def _workers(jobs, out: Path, workers: int, threads: int) -> float:
    from dpfl.reproduce.workers import run_jobs_in_workers

    start = time.perf_counter()
    outcomes = run_jobs_in_workers(jobs, out, workers, threads=threads)
    seconds = time.perf_counter() - start
    assert all(o.status == "ok" for o in outcomes), [(o.job.key, o.status, o.message) for o in outcomes]
    return seconds


def _same_runs(jobs, a: Path, b: Path) -> bool:
    """Every run of the two grids has the same metrics (timings aside) and final model."""
    from dpfl.experiment.run_directory import load_checkpoint

    def metrics(d: Path) -> list[dict]:
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if "seconds" not in k} for r in rows]

    for job in jobs:
        da, db = job.run_dir(a), job.run_dir(b)
        if metrics(da) != metrics(db):
            return False
        pa, pb = (load_checkpoint(d / "checkpoint.pt")["params"] for d in (da, db))
        if any(not torch.equal(pa[k], pb[k]) for k in pa):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default="fmnist-cnn_pfa-iid-MixGauss1-*",
                        help="PFA ci settings (fnmatch; default: the PFA CNN, MixGauss1, both calibrations)")
    parser.add_argument("--methods", default="np_fedavg,max_eps,pfa,weiavg,fedavg")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per run (default the ci grid's)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of the one-process run (default torch's, i.e. the cores)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    os.environ.setdefault("DPFL_OFFLINE", "1")
    grid = _grid(args.settings, [m.strip() for m in args.methods.split(",")], args.rounds)
    threads = args.threads or torch.get_num_threads()
    per_worker = max(1, threads // args.workers)
    root = Path(tempfile.mkdtemp(prefix="dpfl-bench-workers-"))
    try:
        log(f"{len(grid.jobs)} jobs; one process at {threads} threads ...")
        one = _one_process(grid.jobs, root / "one", threads)
        log(f"  {one:.1f} s; {args.workers} workers at {per_worker} thread(s) each ...")
        many = _workers(grid.jobs, root / "workers", args.workers, per_worker)
        log(f"  {many:.1f} s; the same jobs in one process at {per_worker} thread(s), to check the results ...")
        check = _one_process(grid.jobs, root / "check", per_worker)
        same = _same_runs(grid.jobs, root / "workers", root / "check")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {
        "benchmark": "grid_workers", "jobs": len(grid.jobs), "settings": args.settings, "methods": args.methods,
        "rounds": args.rounds, "torch": torch.__version__, "cpu_count": os.cpu_count(), "loadavg": loadavg(),
        "one_process": {"threads": threads, "seconds": round(one, 2)},
        "workers": {"workers": args.workers, "threads_each": per_worker, "seconds": round(many, 2)},
        "one_process_at_worker_threads": {"threads": per_worker, "seconds": round(check, 2)},
        "speedup": round(one / many, 2), "workers_equal_one_process_bit_for_bit": same,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{len(grid.jobs)} jobs ({args.settings}; {args.methods})")
    print(f"one process, {threads} threads:            {one:8.1f} s")
    print(f"{args.workers} workers, {per_worker} thread(s) each:        {many:8.1f} s   ({one / many:.2f}x)")
    print(f"one process, {per_worker} thread(s) (the check): {check:8.1f} s")
    print(f"workers' runs equal to the one-process runs at their thread count: {same}")


if __name__ == "__main__":
    main()

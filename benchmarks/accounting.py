"""Benchmark: privacy accounting cost, per RDP curve, per federated round, and in the PFA comparison.

Three measurements (see benchmarks/README.md):

1. curves -- time to compute one fresh per-step RDP curve at dpfl's default orders, for each sampling kind
   (Poisson, fixed size = sampled without replacement, plain Gaussian): dp_accounting's `RdpAccountant`
   composing the leaf event ("old") vs a fresh `dpfl.privacy.RdpCurveCache` ("new", which includes the curve
   at the switch noise for leaves above it). Old and new alternate, `--repeats` times; medians.
2. ledger -- the accounting of a typical round with a per-client `PrivacyLedger` (RDP accountant, one budget
   and noise per client): a budget check (`would_exceed`) for each active client, one event recorded per
   selected client, `close_round`, `spent_all` (what `FederatedRun` does per round). Reports round 1 (fresh
   curves) and the median of the later rounds.
3. runs -- PFA's Fashion-MNIST logistic-regression setting with `calibration: pfa-heuristic` (fixed-size
   local batches; 30 clients, 24 per round, 100 planned rounds), for PFA and for WeiAvg: each run in its
   own process, stopped after `--rounds` rounds, PFA and WeiAvg alternating `--run-repeats` times. Reports
   the median per-round seconds (metrics.jsonl `seconds`) of rounds 2.. and the time spent inside the
   ledger per round (every public `PrivacyLedger` method, outermost calls only).

    python benchmarks/accounting.py            # readable summary
    python benchmarks/accounting.py --json     # one JSON object on stdout, progress on stderr
    python benchmarks/accounting.py --skip-runs

Nothing here asserts a speed. Timings on a shared machine are noisy: compare the ratios, and the load
average the script records.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import loadavg, log

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "hdp" / "pfa" / "fmnist_logr.yaml"
PFA_PARAMS = "{split: top_fraction, public_fraction: 0.1, k: 1, subspace: centered, svd_solver: exact}"
METHODS = {"pfa": f"algorithm={{name: pfa, params: {PFA_PARAMS}}}", "weiavg": "algorithm={name: weiavg}"}
SETTING = (  # dpfl reproduce pfa, setting fmnist-logr-iid-MixGauss1-M30-heuristic
    "data.clients=30", "data.max_train_samples=36000", "data.partition=iid",
    "training.selection={kind: fixed, k: 24}", "privacy.budgets={distribution: MixGauss1}",
    "privacy.calibration=pfa-heuristic", "privacy.sampling=fixed",
)
LEDGER_METHODS = ("would_exceed", "epsilon_if", "record", "record_many", "close_round", "spent", "spent_all",
                  "guarantee")




def _median_ms(values: list[float]) -> float:
    return round(1e3 * statistics.median(values), 4)


# ----------------------------------------------------------------------------------------------- 1. curves
def curve_cases() -> dict[str, list[tuple[str, object]]]:
    import dp_accounting as dpa

    from dpfl.privacy import sampled_gaussian_event

    def fixed(z: float, n: int, m: int):
        return sampled_gaussian_event(z, sampling="fixed", population=n, sample_size=m)  # GaussianDpEvent(z / 2)

    return {
        "poisson": [
            ("q=8/1200 z=1.1", sampled_gaussian_event(1.1, sampling="poisson", sample_rate=8 / 1200)),
            ("q=0.01 z=0.8", sampled_gaussian_event(0.8, sampling="poisson", sample_rate=0.01)),
            ("q=0.1 z=2", sampled_gaussian_event(2.0, sampling="poisson", sample_rate=0.1)),
            ("q=0.001 z=5", sampled_gaussian_event(5.0, sampling="poisson", sample_rate=0.001)),
        ],
        "fixed": [
            ("n=1200 m=8 z=1.1", fixed(1.1, 1200, 8)),
            ("n=1200 m=8 z=4", fixed(4.0, 1200, 8)),
            ("n=60000 m=64 z=1", fixed(1.0, 60000, 64)),
            ("n=1200 m=8 z=20 (PFA heuristic range, above the switch)", fixed(20.0, 1200, 8)),
        ],
        "gaussian": [
            ("z=1.1", dpa.GaussianDpEvent(1.1)),
            ("z=5", dpa.GaussianDpEvent(5.0)),
        ],
    }


def bench_curves(repeats: int) -> dict:
    import dp_accounting as dpa
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

    from dpfl.privacy import DEFAULT_RDP_ORDERS, RdpCurveCache
    from dpfl.privacy.events import REPLACE_ONE, neighboring_relation

    orders = list(DEFAULT_RDP_ORDERS)
    relations = {"add_remove": dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
                 REPLACE_ONE: dpa.NeighboringRelation.REPLACE_ONE}

    def old(event) -> None:
        acc = rdp_lib.RdpAccountant(orders, relations[neighboring_relation(event)])
        acc.compose(event)

    def new(event) -> None:
        RdpCurveCache().curve(event)

    cases = curve_cases()
    for kind_cases in cases.values():  # warm-up: imports, and the per-orders index tables of the new code
        for _, event in kind_cases:
            new(event)
    times = {(kind, label): {"old": [], "new": []} for kind, kc in cases.items() for label, _ in kc}
    for rep in range(repeats):
        for kind, kind_cases in cases.items():
            for label, event in kind_cases:
                for which, fn in (("old", old), ("new", new)) if rep % 2 == 0 else (("new", new), ("old", old)):
                    t = time.perf_counter()
                    fn(event)
                    times[(kind, label)][which].append(time.perf_counter() - t)
        log(f"curves: repeat {rep + 1}/{repeats}")
    out: dict = {}
    for kind, kind_cases in cases.items():
        rows = []
        for label, _ in kind_cases:
            t = times[(kind, label)]
            old_ms, new_ms = _median_ms(t["old"]), _median_ms(t["new"])
            rows.append({"case": label, "old_ms": old_ms, "new_ms": new_ms, "speedup": round(old_ms / new_ms, 1)})
        out[kind] = {
            "cases": rows,
            "old_ms_median": statistics.median(r["old_ms"] for r in rows),
            "new_ms_median": statistics.median(r["new_ms"] for r in rows),
            "new_ms_max": max(r["new_ms"] for r in rows),
        }
    return out


# ----------------------------------------------------------------------------------------------- 2. ledger
def bench_ledger(rounds: int, sampling: str) -> dict:
    """A simulated run's ledger work: 30 clients, each with its own budget and noise, 24 per round."""
    import numpy as np

    from dpfl.privacy import PrivacyLedger, dpsgd_event

    n_clients, per_round, steps, n, b = 30, 24, 100, 1200, 8
    rng = np.random.default_rng(0)
    budgets = {c: float(rng.uniform(0.5, 10.0)) for c in range(n_clients)}
    noise = {c: float(rng.uniform(0.8, 3.0)) for c in range(n_clients)}
    if sampling == "fixed":
        events = {c: dpsgd_event(noise[c], steps, sampling="fixed", population=n, sample_size=b)
                  for c in range(n_clients)}
    else:
        events = {c: dpsgd_event(noise[c], steps, sampling="poisson", sample_rate=b / n) for c in range(n_clients)}
    ledger = PrivacyLedger(range(n_clients), 1e-5, budgets)
    active = list(range(n_clients))
    per_round_s = []
    for r in range(rounds):
        t = time.perf_counter()
        active = [c for c in active if not ledger.would_exceed(c, events[c])]
        selected = (sorted(rng.choice(active, size=min(per_round, len(active)), replace=False).tolist())
                    if active else [])
        for c in selected:
            ledger.record(c, r, events[c])
        ledger.close_round(r)
        ledger.spent_all()
        per_round_s.append(time.perf_counter() - t)
    return {
        "sampling": sampling,
        "clients": n_clients,
        "per_round": per_round,
        "rounds": rounds,
        "first_round_ms": round(1e3 * per_round_s[0], 3),
        "later_rounds_ms_median": _median_ms(per_round_s[1:]) if rounds > 1 else None,
        "active_at_end": len(active),
    }


# ----------------------------------------------------------------------------------------------- 3. runs
def _instrument_ledger(bucket: list[float]) -> None:
    """Add the time of every outermost public PrivacyLedger call to bucket[0]."""
    from dpfl.privacy import ledger as ledger_module

    depth = [0]
    cls = ledger_module.PrivacyLedger
    for name in LEDGER_METHODS:
        real = getattr(cls, name)

        def timed(self, *a, _real=real, **k):
            depth[0] += 1
            t = time.perf_counter()
            try:
                return _real(self, *a, **k)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    bucket[0] += time.perf_counter() - t

        setattr(cls, name, timed)


class _Stop(Exception):
    pass


def child_run(method: str, rounds: int, out: str) -> None:
    """One run (in this process): stop after `rounds` rounds; print one JSON line with per-round facts."""
    logging.getLogger("absl").setLevel(logging.ERROR)
    import dpfl

    bucket = [0.0]
    _instrument_ledger(bucket)
    rows: list[dict] = []
    last = [time.perf_counter()]

    def on_round(row: dict) -> None:
        now = time.perf_counter()
        rows.append({"round": row["round"], "seconds": row["seconds"], "wall": now - last[0], "accounting": bucket[0]})
        bucket[0] = 0.0
        last[0] = now
        if len(rows) >= rounds:
            raise _Stop

    with contextlib.redirect_stdout(sys.stderr):
        t0 = time.perf_counter()
        try:
            dpfl.run(str(CONFIG), out=out, overrides=[*SETTING, METHODS[method]], on_round=on_round)
        except _Stop:
            pass
    print(json.dumps({"method": method, "rows": rows, "total": time.perf_counter() - t0}), flush=True)


def bench_runs(rounds: int, repeats: int) -> dict:
    per: dict[str, list[dict]] = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory(prefix="dpfl-bench-accounting-") as tmp:
        for rep in range(repeats):
            order = list(METHODS) if rep % 2 == 0 else list(reversed(METHODS))
            for method in order:
                out = os.path.join(tmp, f"{method}-{rep}")
                proc = subprocess.run([sys.executable, __file__, "--child", method, str(rounds), out],
                                      capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise RuntimeError(f"{method} run failed:\n{proc.stderr[-3000:]}")
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                per[method].append(result)
                later = result["rows"][1:]
                log(f"runs: {method} repeat {rep + 1}/{repeats}: round seconds "
                    f"{[round(r['seconds'], 3) for r in result['rows']]}, accounting "
                    f"{[round(r['accounting'], 4) for r in result['rows']]}" + ("" if later else " (one round only)"))
    out: dict = {"rounds_per_run": rounds, "repeats": repeats}
    for method, results in per.items():
        later = [r for res in results for r in res["rows"][1:]]
        first = [res["rows"][0] for res in results]
        out[method] = {
            "round_seconds_median": round(statistics.median(r["seconds"] for r in later), 4) if later else None,
            "round_wall_median": round(statistics.median(r["wall"] for r in later), 4) if later else None,
            "accounting_seconds_per_round_median": (round(statistics.median(r["accounting"] for r in later), 5)
                                                    if later else None),
            "accounting_fraction_median": (round(statistics.median(r["accounting"] / r["wall"] for r in later), 5)
                                           if later else None),
            "first_round_seconds_median": round(statistics.median(r["seconds"] for r in first), 4),
            "first_round_accounting_median": round(statistics.median(r["accounting"] for r in first), 4),
            "raw": results,
        }
    if out["pfa"]["round_seconds_median"] and out["weiavg"]["round_seconds_median"]:
        out["pfa_over_weiavg"] = round(out["pfa"]["round_seconds_median"] / out["weiavg"]["round_seconds_median"], 3)
    return out


# ----------------------------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress goes to stderr)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved repetitions of each curve (default 7)")
    p.add_argument("--ledger-rounds", type=int, default=20, help="rounds of the simulated ledger (default 20)")
    p.add_argument("--rounds", type=int, default=6, help="rounds per PFA / WeiAvg run (default 6)")
    p.add_argument("--run-repeats", type=int, default=2, help="PFA / WeiAvg runs each, alternating (default 2)")
    p.add_argument("--skip-runs", action="store_true", help="leave out the PFA / WeiAvg runs (minutes)")
    p.add_argument("--child", nargs=3, metavar=("METHOD", "ROUNDS", "OUT"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child_run(args.child[0], int(args.child[1]), args.child[2])
        return 0
    logging.getLogger("absl").setLevel(logging.ERROR)
    import numpy
    import scipy

    import dp_accounting

    result: dict = {
        "benchmark": "accounting",
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "dp_accounting": getattr(dp_accounting, "__version__", None),
        "cpu_count": os.cpu_count(),
        "loadavg_start": loadavg(),
    }
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        result["curves"] = bench_curves(args.repeats)
        result["ledger"] = {s: bench_ledger(args.ledger_rounds, s) for s in ("fixed", "poisson")}
        result["runs"] = None if args.skip_runs else bench_runs(args.rounds, args.run_repeats)
    result["loadavg_end"] = loadavg()
    if args.json:
        print(json.dumps(result, indent=2), file=real_stdout, flush=True)
    else:
        print_summary(result)
    return 0


def print_summary(result: dict) -> None:
    print(f"load average at start {result['loadavg_start']}, at end {result['loadavg_end']}")
    print("\nFresh RDP curve at dpfl's default orders (median ms): dp_accounting RdpAccountant vs dpfl RdpCurveCache")
    for kind, data in result["curves"].items():
        for row in data["cases"]:
            print(f"  {kind:8s} {row['case']:58s} {row['old_ms']:10.3f} {row['new_ms']:8.3f}  x{row['speedup']}")
    print("\nLedger accounting of one round (30 clients, 24 per round)")
    for s, data in result["ledger"].items():
        print(f"  {s:8s} first round {data['first_round_ms']:.2f} ms, "
              f"later rounds (median) {data['later_rounds_ms_median']:.3f} ms")
    runs = result["runs"]
    if runs:
        print(f"\nPFA setting (pfa-heuristic, fixed-size batches), "
              f"{runs['rounds_per_run']} rounds x {runs['repeats']} runs each")
        for m in METHODS:
            d = runs[m]
            print(f"  {m:7s} round {d['round_seconds_median']} s (median of rounds 2..), "
                  f"first round {d['first_round_seconds_median']} s, "
                  f"accounting {d['accounting_seconds_per_round_median']} s/round "
                  f"({100 * d['accounting_fraction_median']:.2f}%)")
        print(f"  PFA / WeiAvg per-round seconds: {runs.get('pfa_over_weiavg')}")


if __name__ == "__main__":
    sys.exit(main())

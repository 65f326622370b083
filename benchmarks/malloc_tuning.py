"""What dpfl's glibc malloc settings (`dpfl.engine.allocator`) buy on a real run, and that they change nothing else.

Runs the same short FedCEO run twice in fresh processes, once with DPFL_MALLOC_TUNING=0 and once with the
default, and compares the wall time of the rounds after the first (round 1 includes start-up costs) and the
logged accuracies (which must be identical). Default run: the full-scale Fashion-MNIST MLP config of the
FedCEO reproduction (N = 100, K = 10 clients of 480 training images, DP-SGD at B = 64) with E = 1 and 4 rounds,
one thread. Needs Fashion-MNIST (see `dpfl data`).

    python benchmarks/malloc_tuning.py [--rounds 4] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "fedceo" / "fmnist_mlp.yaml"


def one_run(tuning: bool, rounds: int, threads: int) -> list[dict]:
    env = {**os.environ, "DPFL_MALLOC_TUNING": "1" if tuning else "0", "OMP_NUM_THREADS": str(threads)}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        subprocess.run([sys.executable, "-c", "import sys; from dpfl.cli import main; main(sys.argv[1:])",
                        "run", str(CONFIG), "--out", str(out),
                        "--set", f"training.rounds={rounds}", "--set", "training.local_epochs=1",
                        "--set", "evaluation.every=1", "--set", "algorithm.params.interval=2"],
                       env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = {t: one_run(t, args.rounds, args.threads) for t in (False, True)}
    seconds = {t: statistics.median(r["seconds"] for r in rows[t][1:]) for t in rows}
    same = [r["test_accuracy"] for r in rows[False]] == [r["test_accuracy"] for r in rows[True]]
    result = {"round_seconds_default_malloc": seconds[False], "round_seconds_tuned": seconds[True],
              "speedup": seconds[False] / seconds[True], "identical_accuracies": same,
              "rounds": args.rounds, "threads": args.threads}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"round (median of rounds 2..{args.rounds}): glibc defaults {seconds[False]:.2f} s, dpfl's settings "
              f"{seconds[True]:.2f} s: {result['speedup']:.2f}x; accuracies identical: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()

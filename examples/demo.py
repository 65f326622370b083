"""A private federated run on scikit-learn's bundled digits, with a different budget per client.

Each of 10 clients trains a logistic-regression model with DP-SGD (Poisson sampling, its own noise multiplier
calibrated so its expected participation spends exactly its epsilon); the server averages. The table
at the end shows each client's budget, the noise that budget bought, and the epsilon the RDP accountant
computed for the run as it ran.

    python examples/demo.py [--rounds 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpfl.algorithms.algorithm import fedavg
from dpfl.algorithms.client.program import dpsgd
from dpfl.algorithms.selection import Selection
from dpfl.data import federated_dataset
from dpfl.experiment.federated_run import FederatedRun
from dpfl.privacy.budgets import ClientBudget
from dpfl.models import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    data = federated_dataset("digits", n_clients=args.clients, seed=args.seed)
    model = build_model("logr", data.input_shape, data.n_classes, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    budgets = [ClientBudget(float(e), 1e-5) for e in rng.choice([1.0, 2.0, 4.0, 8.0], size=data.n_clients)]
    algorithm = fedavg(dpsgd(lr=2.0, clip=1.0, epochs=1, sampling="poisson"), Selection("all"))
    run = FederatedRun(data, model, algorithm, rounds=args.rounds, batch_sizes=32, budgets=budgets, seed=args.seed,
                       eval_every=5)

    start = time.perf_counter()

    def progress(row: dict) -> None:
        if row.get("test_accuracy") is not None:
            print(f"round {row['round']:3d}/{args.rounds}  test accuracy {row['test_accuracy']:.3f}  "
                  f"max epsilon spent {row['epsilon_max']:.3f}", flush=True)

    result = run.run(progress)
    print(f"\nstopped after {len(result.history)} rounds ({result.stop_reason}) in {time.perf_counter() - start:.1f}s; "
          f"final test accuracy {result.final_accuracy:.3f}")
    print(f"guarantee: ({result.privacy['unit']}-level) against {result.privacy['observer']}; "
          f"accountant {result.privacy['accountant']}; {result.privacy['mechanism']}\n")
    print(f"{'client':>6} {'records':>7} {'budget eps':>10} {'delta':>7} {'noise z':>8} {'spent eps':>9}")
    for c in result.privacy["clients"]:
        print(f"{c['client']:>6} {c['records']:>7} {c['epsilon_budget']:>10.2f} {c['delta']:>7.0e} "
              f"{c['noise_multiplier']:>8.3f} {c['epsilon_spent']:>9.3f}")


if __name__ == "__main__":
    main()

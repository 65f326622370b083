"""Train against test accuracy of the model each client uses, from finished run directories.

A method whose clients' models score low on their own training records is limited by fitting (too few steps, the
clipping, the noise); one whose training accuracy sits far above its test accuracy is limited by generalisation.
R-DPCFL's docs use it to ask why Local training keeps up with the clusters (docs/papers/rdpcfl.md).

For each run the final state (checkpoint.pt) is loaded into the run rebuilt from its config (the same data split, the
same algorithm), and each client's model is the one the run's own evaluation uses: its personal model where the
method keeps one (a clustered client's cluster model, PPSGD's, FedCEO's), else the global model. Its accuracy on the
client's training records and on the client's own test split is averaged over those clients (and over the planted
minority cluster when the data has one). The test mean recomputes the run's logged `acc_personal` (or
`test_acc_clients_mean`): both are printed, so a reader sees that they agree.

    python scripts/personal_fit.py RUN_DIR [RUN_DIR ...] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.engine.evaluation import evaluate
from dpfl.experiment.build import build_run
from dpfl.experiment.config import load_config
from dpfl.experiment.run_directory import CHECKPOINT, CONFIG, SUMMARY, load_checkpoint
from dpfl.results.run_files import last_number, read_metrics


def fit(run_dir: Path) -> dict[str, Any]:
    """The run's clients' train and test accuracy with the models they use (see the module docstring)."""
    run_dir = Path(run_dir)
    if not (run_dir / SUMMARY).is_file() or not (run_dir / CHECKPOINT).is_file():
        raise SystemExit(f"{run_dir}: not a finished dpfl run directory (needs {SUMMARY} and {CHECKPOINT})")
    state = load_checkpoint(run_dir / CHECKPOINT)
    if state.get("stop_reason") is None:
        raise SystemExit(f"{run_dir}: {CHECKPOINT} is not the final state of the run")
    run = build_run(load_config(run_dir / CONFIG))
    if run.algorithm.personal is not None:
        run.algorithm.personal.load_state_dict(state.get("client_state"))
    w = state["params"]
    personal = run.personal_models(w, state.get("aggregator_state"))
    clients = sorted(personal) if personal else list(range(len(run.data.clients)))
    loss = run.algorithm.local.spec.loss
    run.model.eval()
    train, test = [], []
    for c in clients:
        params, data = personal.get(c, w), run.data.clients[c]
        train.append(evaluate(run.model, params, data.x_train, data.y_train, loss)[0])
        test.append(evaluate(run.model, params, data.x_test, data.y_test, loss)[0])
    info = run.data.info or {}
    truth, minority = info.get("true_cluster"), info.get("minority_cluster")
    mine = [i for i, c in enumerate(clients) if truth is not None and truth[c] == minority]
    metrics = read_metrics(run_dir)
    out = {"run": str(run_dir), "model": "personal" if personal else "global", "clients": len(clients),
           "train_acc": float(np.mean(train)), "test_acc": float(np.mean(test)),
           "logged_test_acc": last_number(metrics, "acc_personal" if personal else "test_acc_clients_mean")}
    out["gap"] = out["train_acc"] - out["test_acc"]
    if mine:
        out["minority_train_acc"] = float(np.mean([train[i] for i in mine]))
        out["minority_test_acc"] = float(np.mean([test[i] for i in mine]))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished run directories")
    parser.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    args = parser.parse_args(argv)
    rows = [fit(r) for r in args.runs]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("| run | model | clients | train acc | test acc | train - test | logged test acc | minority train / test |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        minority = (f"{r['minority_train_acc']:.4f} / {r['minority_test_acc']:.4f}"
                    if "minority_train_acc" in r else "")
        logged = "" if r["logged_test_acc"] is None else f"{r['logged_test_acc']:.4f}"
        print(f"| {r['run']} | {r['model']} | {r['clients']} | {r['train_acc']:.4f} | {r['test_acc']:.4f} | "
              f"{r['gap']:+.4f} | {logged} | {minority} |")


if __name__ == "__main__":
    main()

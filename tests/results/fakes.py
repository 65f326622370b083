"""Fake run directories written by hand in the FORMATS.md formats (no experiment code involved)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG = "name: {name}\nseed: 0\nrounds: {rounds}\nalgorithm:\n  name: {algorithm}\n"


def spent_epsilon(client: int, round_: int) -> float:
    """Irregular values, so formatting to 3 decimals is actually exercised."""
    return round(0.1234567 * round_ * (1.0 + client / 7.0), 10)


def budget(client: int) -> float:
    return 1.0 + 0.5 * (client % 4)


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _metrics(n_clients: int, rounds: int, accounted: bool, eval_every: int = 1) -> list[dict[str, Any]]:
    rows = []
    for r in range(1, rounds + 1):
        evaluated = r % eval_every == 0 or r == rounds
        row: dict[str, Any] = {
            "round": r,
            "test_accuracy": 0.5 + 0.07 * r - (0.05 if r == 4 else 0.0) if evaluated else None,
            "test_loss": 1.5 - 0.2 * r if evaluated else None,
            "selected": list(range(0, n_clients, 2)),
            "uplink_bytes": 4000 * n_clients,
            "downlink_bytes": 4000 * n_clients,
            "seconds": 0.25,
        }
        if accounted:
            row["epsilon"] = [spent_epsilon(c, r) for c in range(n_clients)]
            row["epsilon_max"] = max(row["epsilon"])
        rows.append(row)
    return rows


def make_accounted_run(run_dir: Path, *, n_clients: int = 10, rounds: int = 5, complete: bool = True,
                       name: str = "dp-fedavg-test") -> Path:
    """A sample-level accounted run: per-client budgets, epsilon in every metrics row."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(CONFIG.format(name=name, rounds=rounds, algorithm="dp_fedavg_local"))
    metrics = _metrics(n_clients, rounds, accounted=True)
    _write_jsonl(run_dir / "metrics.jsonl", metrics)
    clients = [{"client": c, "epsilon_budget": budget(c), "delta": 1e-5, "noise_multiplier": 1.1 + 0.01 * c,
                "batch_size": 16 + c, "records": 100 + 10 * c, "epsilon_spent": spent_epsilon(c, rounds)}
               for c in range(n_clients)]
    privacy = {
        "algorithm": "dp_fedavg_local", "unit": "sample",
        "observer": "the server, which sees every individual upload",
        "mechanism": "DP-SGD (poisson sampling, per-sample clip 1.0)", "accountant": "rdp",
        "client_sampling": {"kind": "fixed", "k": max(1, n_clients // 2), "rate": None},
        "local_sampling": "poisson", "stop_reason": "rounds", "accounted": True,
        "clients": clients, "ledger": {"format": "fake"},
    }
    (run_dir / "privacy.json").write_text(json.dumps(privacy, indent=2))
    if complete:
        accs = [m["test_accuracy"] for m in metrics]
        best = max(range(rounds), key=lambda i: accs[i])
        summary = {"final_accuracy": accs[-1], "best_accuracy": accs[best], "best_round": best + 1,
                   "rounds_done": rounds, "rounds_planned": rounds, "stop_reason": "rounds",
                   "epsilon_max": metrics[-1]["epsilon_max"], "seconds": 1.25, "name": name}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir


def make_unaccounted_run(run_dir: Path, *, n_clients: int = 10, rounds: int = 5, name: str = "udp-unaccounted") -> Path:
    """A private mechanism ran but no accountant: no epsilon anywhere, a warning in privacy.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(CONFIG.format(name=name, rounds=rounds, algorithm="udp"))
    metrics = _metrics(n_clients, rounds, accounted=False, eval_every=2)
    _write_jsonl(run_dir / "metrics.jsonl", metrics)
    privacy = {
        "algorithm": "udp", "unit": "client", "observer": "the server, which sees every individual upload",
        "mechanism": "clip update + Gaussian noise (NOT accounted: no epsilon is computed for it)",
        "accountant": None, "client_sampling": {"kind": "poisson", "k": None, "rate": 0.3},
        "local_sampling": "shuffle", "stop_reason": "rounds", "accounted": False,
        "warning": "a privacy mechanism ran for which dpfl computes no epsilon; no guarantee is reported",
    }
    (run_dir / "privacy.json").write_text(json.dumps(privacy, indent=2))
    summary = {"final_accuracy": metrics[-1]["test_accuracy"], "best_accuracy": metrics[-1]["test_accuracy"],
               "best_round": rounds, "rounds_done": rounds, "rounds_planned": rounds, "stop_reason": "rounds",
               "epsilon_max": None, "seconds": 1.0, "name": name}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir

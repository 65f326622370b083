"""A cross-device population costs a run a few hundred bytes per client between rounds (issue 67: at most 512, so
that 10,000,000 clients fit in 24 GiB): the clients' records pooled with offsets, budgets, noise, batch sizes and the
ledger as arrays, never a Python object per client. Measured with tracemalloc (numpy's arrays; torch's own allocator
is not traced: the records and the pooled data's two int64 offsets per client are not counted) at two populations,
after a run of two rounds whose result was dropped."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np

from dpfl.data.federated import PooledClients
from dpfl.experiment.build import build_run
from dpfl.experiment.config import validate_config
from dpfl.experiment.run_evaluation import PER_CLIENT_LIMIT, PER_CLIENT_ROW_LIMIT


def population_config(n: int, rounds: int = 2) -> dict:
    return {
        "name": "population", "seed": 0,
        "data": {"dataset": "synthetic", "clients": n, "partition": "iid", "max_train_samples": 2 * n,
                 "options": {"n_samples": int(2 * n / 0.8) + 1000, "n_features": 4, "n_classes": 3}},
        "model": {"name": "logr"},
        "algorithm": {"name": "dp_fedavg_local"},
        "training": {"rounds": rounds, "local_steps": 2, "batch_size": 2, "optimizer": {"lr": 0.1},
                     "selection": {"kind": "fixed", "k": 10}},
        "privacy": {"clip": 1.0, "budgets": 8.0, "participation": "worst_case"},
        "evaluation": {"every": rounds},
    }


def _held_per_client(n: int) -> float:
    cfg = validate_config(population_config(n))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    run = build_run(cfg)
    assert isinstance(run.data.clients, PooledClients)
    result = run.run()
    assert len(result.history) == 2
    del result
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del run
    return held / n


def test_a_clients_standing_state_is_a_few_hundred_bytes_whatever_the_population():
    """About 155 bytes per client at both sizes (arrays of 8 bytes: records, batch size, noise, reported and budget
    epsilons, deltas, steps, offsets of each split, the ledger's 40). A ClientData of six tensors alone was ~1 KB;
    a per-client Python object anywhere would add 50+ bytes. 400 leaves room for a few more arrays, and with the
    untraced 16 bytes of pooled offsets stays under the issue's 512."""
    _held_per_client(2_000)  # imports and the accountant's caches are not a client's
    assert PER_CLIENT_ROW_LIMIT < 20_000 < 100_000 <= PER_CLIENT_LIMIT  # rows summarised, the report per client
    small, large = _held_per_client(20_000), _held_per_client(100_000)
    assert large < 400 and small < 400
    assert abs(large - small) < 20  # it does not grow with the population: a cost per client, not per pair


def test_a_population_row_and_report_list_classes_not_clients():
    """Above PER_CLIENT_ROW_LIMIT clients a metrics row counts the clients of each distinct epsilon; above
    PER_CLIENT_LIMIT privacy.json lists each class of alike clients: the same epsilons as the ledger's."""
    n = PER_CLIENT_LIMIT + 1
    run = build_run(validate_config(population_config(n, rounds=1)))
    result = run.run()
    row = result.history[-1]
    spent = run.ledger.spent_array()
    assert "epsilon" not in row
    assert row["epsilon_classes"] == [[float(v), int((spent == v).sum())] for v in np.unique(spent)]
    assert row["epsilon_max"] == float(spent.max()) and sum(c for _, c in row["epsilon_classes"]) == n
    privacy = run.privacy_summary(result.stop_reason, 1, result.history)
    assert "clients" not in privacy
    summary = privacy["clients_summary"]
    assert summary["clients"] == n and sum(c["clients"] for c in summary["classes"]) == n
    selected = sorted(result.history[0]["selected"])
    assert [c["first_client"] for c in summary["classes"]] == ([0, selected[0]] if selected[0] else [0, 1])
    for c in summary["classes"]:
        i = c["first_client"]
        assert c["epsilon_spent"] == c["epsilon_guarantee"] == float(spent[i])
        assert c["clients"] == int((spent == spent[i]).sum())  # budgets, noise and records alike: spent decides
        assert (c["epsilon_budget"], c["delta"], c["records"]) == (8.0, run.budgets[i].delta, 2)
    assert privacy["guarantee"]["epsilon_max"] == float(spent.max()) and privacy["meets_budgets"] is True

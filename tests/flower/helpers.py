"""Shared by the Flower tests: the 3-client config, the in-process reference run, the equivalence check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "flower" / "dpfl_config.yaml"  # digits, 3 clients, all selected, 3 rounds
TOL = 1e-6


def reference(config: Path = CONFIG) -> dict[str, Any]:
    """`build_run(cfg).run()` in process: final accuracy, per-client epsilon spent, privacy (as JSON would store it)."""
    from dpfl.experiment.build import build_run
    from dpfl.experiment.config import load_config

    result = build_run(load_config(config)).run()
    return {"accuracy": result.final_accuracy, "spent": result.spent(),
            "privacy": result.privacy.to_dict(), "history": result.history}


def assert_same_run(out: Path, ref: dict[str, Any], *, shared_seed: bool = True) -> None:
    """The Flower run directory `out` matches the in-process reference within TOL (accuracy, ledger, privacy)."""
    summary = json.loads((out / "summary.json").read_text())
    privacy = json.loads((out / "privacy.json").read_text())
    assert summary["rounds_done"] == 3 and summary["stop_reason"] == "rounds"
    assert summary["final_accuracy"] == pytest.approx(ref["accuracy"], abs=TOL)
    clients, expected = privacy["clients"], ref["privacy"]["clients"]
    assert [c["client"] for c in clients] == [c["client"] for c in expected] == [0, 1, 2]
    for got, want in zip(clients, expected, strict=True):
        assert set(got) == set(want)
        for key, value in want.items():
            assert got[key] == pytest.approx(value, abs=TOL), key
        assert got["epsilon_spent"] == pytest.approx(ref["spent"][got["client"]], abs=TOL)
    guarantee, want_g = privacy["guarantee"], ref["privacy"]["guarantee"]
    assert guarantee["epsilon_max"] == pytest.approx(want_g["epsilon_max"], abs=TOL)
    assert {k: v for k, v in guarantee.items() if k != "epsilon_max"} == \
        {k: v for k, v in want_g.items() if k != "epsilon_max"}
    assert privacy["flower"]["shared_seed"] is shared_seed
    assert "NOT private against the server" in privacy["flower"]["seeds"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for row, want in zip(rows, ref["history"], strict=True):
        assert row["test_accuracy"] == pytest.approx(want["test_accuracy"], abs=TOL)
        assert row["epsilon"] == pytest.approx(want["epsilon"], abs=TOL)

"""scripts/pfa_run_facts.py: the per-run facts the PFA docs quote (rounds without a large-budget client, clients over
budget, one method's accuracy minus another's), read from run directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_module import load_script

SETTING = "fmnist-cnn_pfa-iid-MixGauss1-M4-rdp"


def _script():
    return load_script("pfa_run_facts")


def _run(out: Path, method: str, selected: list[list[int]], acc: dict[int, float], spent: list[float]) -> None:
    """A run directory as the engine writes it: client 3 has the large budget (10), the others 0.1."""
    d = out / "runs" / SETTING / method / "seed1"
    d.mkdir(parents=True)
    rows = [{"round": t, "selected": sel, **({"test_accuracy": acc[t]} if t in acc else {})}
            for t, sel in enumerate(selected, start=1)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    budgets = [0.1, 0.1, 0.1, 10.0]
    (d / "privacy.json").write_text(json.dumps({"accounted": True, "clients": [
        {"client": k, "epsilon_budget": b, "epsilon_spent": e} for k, (b, e) in enumerate(zip(budgets, spent,
                                                                                              strict=True))]}))
    (d / "summary.json").write_text(json.dumps({
        "final_accuracy": acc[max(acc)], "best_accuracy": max(acc.values()), "best_round": max(acc, key=acc.get),
        "rounds_done": len(selected), "stop_reason": "rounds", "traffic": {"uplink_mib": 1.5}}))


def test_rounds_without_a_large_budget_client_overspending_and_the_gap(tmp_path, capsys):
    _run(tmp_path, "weiavg", [[0, 3], [1, 2], [3, 0]], {2: 0.5, 3: 0.25}, [0.1, 0.09, 0.1, 15.0])
    _run(tmp_path, "pfa", [[3, 1], [3, 2], [3, 0]], {2: 0.625, 3: 0.5}, [0.1, 0.1, 0.1, 9.9])
    lines = _script().main([str(tmp_path), "--seed", "1", "--from-round", "2"])
    pfa_line, weiavg_line, gap_line = lines
    assert pfa_line.startswith(f"{SETTING} pfa seed1: final 0.5000, best 0.6250 (round 2), 3 rounds (rounds)")
    assert "clients with ε budget ≥ 5: [3], rounds without one: none; over budget: none" in pfa_line
    assert "largest ε spent 9.9000" in pfa_line
    assert "rounds without one: [2]" in weiavg_line  # round 2 drew clients 1 and 2 only
    assert "over budget: 3 (15.00 of 10.00, 1.50×)" in weiavg_line  # client 1 at 0.09 of 0.1 is within
    assert gap_line == (f"{SETTING} seed1: pfa − weiavg from round 2 on: mean +0.1875, min +0.1250, max +0.2500 "
                        "over 2 evaluations")
    assert "over 1 evaluation" in _script().main([str(tmp_path), "--from-round", "3"])[-1]
    (tmp_path / "runs" / SETTING / "pfa" / "seed1" / "summary.json").unlink()  # as a run still going has it
    (tmp_path / "runs" / SETTING / "pfa" / "seed1" / "privacy.json").unlink()
    lines = _script().main([str(tmp_path), "--seed", "1", "--from-round", "2"])
    assert lines[0] == f"{SETTING} pfa seed1: not finished (3 rounds logged so far)"
    assert lines[1].startswith(f"{SETTING} weiavg seed1: final 0.2500") and len(lines) == 2  # no gap without pfa
    capsys.readouterr()


def test_bad_input_is_refused_with_a_message(tmp_path):
    with pytest.raises(SystemExit, match="no runs/ directory"):
        _script().main([str(tmp_path)])
    (tmp_path / "runs").mkdir()
    with pytest.raises(SystemExit, match="no run directory"):
        _script().main([str(tmp_path)])
    with pytest.raises(SystemExit, match="two methods"):
        _script().main([str(tmp_path), "--gap", "pfa"])


def test_it_reads_what_the_engine_writes(tmp_path, fmnist):
    """A real ci run: the fields the script reads (each round's selected clients, budgets and spend, the evaluated
    accuracies) are where the engine puts them."""
    from dpfl.reproduce import pfa
    from dpfl.reproduce.runner import OK, run_jobs

    grid = pfa.grid("ci", calibration="pfa-heuristic", methods=["weiavg"], settings_pattern="*logr*MixGauss1*")
    outcomes = run_jobs(grid.jobs, tmp_path)
    assert outcomes and all(o.status == OK for o in outcomes)
    facts = _script().collect(tmp_path, "*", None, 5.0)
    assert len(facts) == len(outcomes)
    for f, o in zip(sorted(facts, key=lambda f: f.setting), sorted(outcomes, key=lambda o: o.job.setting),
                    strict=True):
        summary = json.loads((o.run_dir / "summary.json").read_text())
        privacy = json.loads((o.run_dir / "privacy.json").read_text())
        assert f.final == summary["final_accuracy"] and f.rounds == summary["rounds_done"]
        assert f.large == [c["client"] for c in privacy["clients"] if c["epsilon_budget"] >= 5.0] != []
        assert f.over and max(s for _, s, _ in f.over) == f.max_spent  # the heuristic overspends (ci docs)
        assert f.accuracy and max(f.accuracy) == summary["rounds_done"]  # the last round is evaluated
        rows = [json.loads(line) for line in (o.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert sum("selected" in r for r in rows) == summary["rounds_done"]  # every round's draw is logged

"""The facts behind the PFA results (docs/papers/pfa.md), read from the run directories of a `dpfl reproduce pfa`
output.

Per run: final and best test accuracy, rounds and stop reason, uplink, the largest epsilon spent, the clients whose
budget is at least --large-eps (the "eps ~ 10 clients" of MixGauss1/3) and the rounds that drew none of them, and
every client over its budget under the run's accountant. Per (setting, seed): one method's test accuracy minus
another's over the evaluations from --from-round on. Why: in a round without a large-budget client WeiAvg averages
small-budget clients alone (its aggregate noise jumps, metrics.jsonl's noise statistic) and PFA projects onto a
small-budget "public" client; the docs' statements about such rounds, and about overspending clients, come from here.

    python scripts/pfa_run_facts.py OUT --settings 'fmnist-cnn_pfa-*M20*' --seed 2
"""

from __future__ import annotations

import argparse
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from dpfl.reproduce.pfa_report import clients_over_budget
from dpfl.results.run_files import RunDirError, as_number, read_metrics, read_privacy, read_summary


@dataclass(frozen=True)
class RunFacts:
    setting: str
    method: str
    seed: int
    final: float | None
    best: float | None
    best_round: int | None
    rounds: int | None
    stop: str | None
    uplink_mib: float | None
    max_spent: float | None
    large: list[int] = field(default_factory=list)  # clients with budget >= large_eps
    rounds_without_large: list[int] = field(default_factory=list)  # training rounds that selected none of them
    over: list[tuple[int, float, float]] = field(default_factory=list)  # (client, spent, budget) with spent > budget
    accuracy: dict[int, float] = field(default_factory=dict)  # evaluated round -> test accuracy
    rounds_logged: int = 0  # training rounds in metrics.jsonl: how far an unfinished run got


def run_facts(run_dir: Path, setting: str, method: str, seed: int, large_eps: float) -> RunFacts:
    summary = read_summary(run_dir) or {}
    try:
        privacy = read_privacy(run_dir)
    except RunDirError:  # a run that did not get as far as its privacy report
        privacy = {}
    clients = privacy.get("clients") or []
    metrics = read_metrics(run_dir)
    budgets = {c["client"]: as_number(c.get("epsilon_budget")) for c in clients}
    large = sorted(k for k, b in budgets.items() if b is not None and b >= large_eps)
    without = [r["round"] for r in metrics if "selected" in r and large and not set(large) & set(r["selected"])]
    known = [s for s in (as_number(c.get("epsilon_spent")) for c in clients) if s is not None]
    accuracy = {r["round"]: r["test_accuracy"] for r in metrics if as_number(r.get("test_accuracy")) is not None}
    return RunFacts(
        setting, method, seed, as_number(summary.get("final_accuracy")), as_number(summary.get("best_accuracy")),
        summary.get("best_round"), summary.get("rounds_done"), summary.get("stop_reason"),
        as_number((summary.get("traffic") or {}).get("uplink_mib")), max(known) if known else None, large, without,
        clients_over_budget(privacy), accuracy, sum("selected" in r for r in metrics))


def accuracy_gap(a: RunFacts, b: RunFacts, from_round: int) -> tuple[float, float, float, int] | None:
    """(mean, min, max, n) of a's test accuracy minus b's over the rounds both evaluated, from `from_round` on."""
    diffs = [a.accuracy[r] - b.accuracy[r] for r in sorted(a.accuracy) if r >= from_round and r in b.accuracy]
    return (sum(diffs) / len(diffs), min(diffs), max(diffs), len(diffs)) if diffs else None


def collect(out: Path, settings: str, seed: int | None, large_eps: float) -> list[RunFacts]:
    found = []
    for run_dir in sorted(out.glob("runs/*/*/seed*")):
        setting, method, seed_name = run_dir.parts[-3:]
        k = seed_name.removeprefix("seed")
        if not k.isdigit() or not fnmatch.fnmatch(setting, settings) or (seed is not None and int(k) != seed):
            continue
        found.append(run_facts(run_dir, setting, method, int(k), large_eps))
    return found


def _num(x: float | None, fmt: str = ".4f") -> str:
    return "—" if x is None else format(x, fmt)


def describe(f: RunFacts, large_eps: float) -> str:
    if f.rounds is None:  # no summary.json yet: its facts would read as "none", which would be wrong
        return f"{f.setting} {f.method} seed{f.seed}: not finished ({f.rounds_logged} rounds logged so far)"
    large = (f"clients with ε budget ≥ {large_eps:g}: {f.large or 'none'}, rounds without one: "
             f"{f.rounds_without_large or 'none'}")
    over = ", ".join(f"{k} ({s:.2f} of {b:.2f}, {s / b:.2f}×)" for k, s, b in f.over) or "none"
    if f.method == "max_eps" and f.over:  # a reference that ignores the budgets: its overspending is the point
        over = f"{len(f.over)} clients (max_eps is NOT private: it trains every client at the largest budget)"
    return (f"{f.setting} {f.method} seed{f.seed}: final {_num(f.final)}, best {_num(f.best)} (round {f.best_round}), "
            f"{f.rounds} rounds ({f.stop}), uplink {_num(f.uplink_mib, '.1f')} MiB, largest ε spent "
            f"{_num(f.max_spent)}; {large}; over budget: {over}")


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the --out of `dpfl reproduce pfa` (holds runs/)")
    parser.add_argument("--settings", default="*", help="glob over setting names (default: all)")
    parser.add_argument("--seed", type=int, default=None, help="only this seed (default: all)")
    parser.add_argument("--large-eps", type=float, default=5.0,
                        help="budgets at least this count as large (default 5: the ε ≈ 10 clients of MixGauss1/3)")
    parser.add_argument("--gap", default="pfa,weiavg", help="A,B: print A's test accuracy minus B's per setting")
    parser.add_argument("--from-round", type=int, default=20, help="the gap over evaluations from this round on")
    args = parser.parse_args(argv)
    if not (args.out / "runs").is_dir():
        raise SystemExit(f"error: {args.out} has no runs/ directory (give the --out of `dpfl reproduce pfa`)")
    first, _, second = args.gap.partition(",")
    if not first or not second:
        raise SystemExit(f"error: --gap takes two methods, A,B (got {args.gap!r})")
    facts = collect(args.out, args.settings, args.seed, args.large_eps)
    if not facts:
        raise SystemExit(f"error: no run directory under {args.out / 'runs'} matches")
    lines = [describe(f, args.large_eps) for f in facts]
    by_key = {(f.setting, f.seed, f.method): f for f in facts}
    for setting, seed in dict.fromkeys((f.setting, f.seed) for f in facts):
        a, b = by_key.get((setting, seed, first)), by_key.get((setting, seed, second))
        finished = a and b and a.rounds is not None and b.rounds is not None  # no gap over part of a run
        gap = accuracy_gap(a, b, args.from_round) if finished else None
        if gap:
            mean, low, high, n = gap
            lines.append(f"{setting} seed{seed}: {first} − {second} from round {args.from_round} on: mean "
                         f"{mean:+.4f}, min {low:+.4f}, max {high:+.4f} over {n} evaluation{'s' * (n != 1)}")
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()

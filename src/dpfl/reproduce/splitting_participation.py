"""Every client in every round against a 10% cohort on the reduced CNN, from the CSVs: the tables of
docs/papers/splitting_all_clients.md.

The two are separate studies with separate published CSVs (`--scale reduced-all-clients`:
docs/results/splitting_cnn_all_clients.csv; `--scale reduced`: splitting_cnn_reduced.csv). The docs set them side
by side, seed by seed and as mean ± sd over the seeds whose all-clients grid is complete; generating the tables
(scripts/splitting_participation_table.py) and testing that the docs hold them keeps hand-copied numbers out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from dpfl.reproduce.runner import OK
from dpfl.reproduce.splitting_cnn import PRESETS, TAU
from dpfl.reproduce.tables import md_table, mean_std

PARTITIONS = (("cnn-iid", "iid"), ("cnn-shards2", "≤ 2 classes"), ("cnn-shards6", "≤ 6 classes"))
Row = Mapping[str, str]
Index = dict[tuple[str, str, int, int], Row]  # (setting, preset, tau, seed) -> a finished run's CSV row


def index(rows: Sequence[Row]) -> Index:
    """The finished (status ok) runs of a splitting CNN results CSV by (setting, preset, tau, seed)."""
    return {(r["setting"], r["method"], int(r["anderson"]), int(r["seed"])): r for r in rows if r["status"] == OK}


def complete_seeds(everyone: Index) -> list[int]:
    """Seeds with every (partition, method, tau) of the all-clients grid finished."""
    cells = [(s, p, tau) for s, _ in PARTITIONS for p in PRESETS for tau in (0, TAU)]
    seeds = sorted({k[3] for k in everyone})
    return [seed for seed in seeds if all((*c, seed) in everyone for c in cells)]


def seed_table(everyone: Index, cohort: Index, seed: int) -> list[str]:
    """One seed: all 100 clients' final accuracy (best in brackets) beside the 10% cohort's final accuracy."""
    def cells(key: tuple[str, str, int]) -> list[str]:
        run = everyone.get((*key, seed))
        return [f"{_acc(run, 'final_accuracy')} ({_acc(run, 'best_accuracy')})" if run else "not run",
                _acc(cohort.get((*key, seed)), "final_accuracy")]
    return _table(cells)


def mean_table(everyone: Index, cohort: Index, seeds: Sequence[int]) -> list[str]:
    """Final accuracy, mean ± sample sd over `seeds` (both studies over the same seeds, so the columns compare)."""
    if len(seeds) < 2:
        raise ValueError(f"a mean ± sd needs two or more seeds, not {list(seeds)}")
    return _table(lambda key: [_mean_sd([runs.get((*key, s)) for s in seeds]) for runs in (everyone, cohort)])


def _table(cells: Callable[[tuple[str, str, int]], list[str]]) -> list[str]:
    """One row per (method, tau), two columns per partition: `cells((setting, preset, tau))`."""
    header = ["method", "Anderson τ"]
    for _, label in PARTITIONS:
        header += [f"{label}, all 100", f"{label}, 10 per round"]
    body = [[preset, str(tau), *(c for setting, _ in PARTITIONS for c in cells((setting, preset, tau)))]
            for preset in PRESETS for tau in (0, TAU)]
    return md_table(header, body)


def _acc(run: Row | None, column: str) -> str:
    """As every generated table rounds (a float's format: 0.3565 reads 0.356; the CSV has the exact k / 10,000)."""
    return f"{float(run[column]):.3f}" if run else "not run"


def _mean_sd(runs: Sequence[Row | None]) -> str:
    """Mean ± sd of the final accuracies; 'incomplete (k of n)' rather than a mean over fewer seeds than planned."""
    done = [float(r["final_accuracy"]) for r in runs if r]
    if len(done) < len(runs):
        return f"incomplete ({len(done)} of {len(runs)})"
    return mean_std(done, ".3f")

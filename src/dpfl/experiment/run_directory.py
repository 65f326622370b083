"""Execute a configured run into a run directory, checkpointing so that a killed run resumes exactly.

Layout and formats: `dpfl/results/FORMATS.md`. The rules that keep a directory honest:
- the config is validated and the run built (data, model, calibration) before the directory is created,
  so a user error leaves nothing behind;
- `summary.json` is written only when the run has finished: its presence means complete;
- checkpoints and JSON files are written atomically (temp file + rename), and `metrics.jsonl` is cut
  back to the checkpoint's round on resume, so a crash at any point leaves a resumable directory;
- resuming with a config that differs from the saved one is refused.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dpfl.experiment.build import build_run
from dpfl.experiment.config import RunConfig, config_to_yaml, load_config
from dpfl.experiment.federated_run import FederatedRun, RunResult, RunState
from dpfl.results.report import write_report
from dpfl.results.traffic import traffic_report
from dpfl.results.run_files import (append_jsonl, read_summary, truncate_jsonl, write_bytes_atomic, write_json_atomic,
                                    write_text_atomic)

CONFIG, METRICS, PRIVACY, SUMMARY, CHECKPOINT = "config.yaml", "metrics.jsonl", "privacy.json", "summary.json", "checkpoint.pt"


class RunDirectoryError(ValueError):
    """A user error about the run directory (exists already, nothing to resume, config changed)."""


def execute(cfg: RunConfig, out: Path, *, resume: bool = False,
            on_round: Callable[[dict[str, Any]], None] | None = None,
            on_start: Callable[[FederatedRun, int], None] | None = None) -> dict[str, Any]:
    """Run `cfg` into `out` (or continue it with `resume`) and return the summary."""
    out = Path(out)
    state = _prepare(cfg, out) if resume else _refuse_existing(out)
    if isinstance(state, dict):  # resume of a finished run: nothing to do
        return state
    run = build_run(cfg)  # data, model, calibration: user errors surface before anything is written
    if not resume:
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / CONFIG, config_to_yaml(cfg))
    truncate_jsonl(out / METRICS, state.round if state is not None else 0)
    if on_start is not None:
        on_start(run, state.round if state is not None else 0)
    started = time.perf_counter()

    def record(row: dict[str, Any]) -> None:
        append_jsonl(out / METRICS, row)
        if on_round is not None:
            on_round(row)

    result = run.run(record, state=state, on_checkpoint=lambda s: _save_checkpoint(out / CHECKPOINT, s),
                     checkpoint_every=cfg.checkpoint.every)
    return _finish(cfg, out, run, result, time.perf_counter() - started)


def _refuse_existing(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        hint = "it is a finished run" if (out / SUMMARY).exists() else "resume it with --resume"
        raise RunDirectoryError(f"{out} already exists and is not empty ({hint}, or choose another --out)")
    return None


def _prepare(cfg: RunConfig, out: Path) -> RunState | dict[str, Any] | None:
    if not (out / CONFIG).exists():
        raise RunDirectoryError(f"nothing to resume: {out / CONFIG} does not exist")
    saved = load_config(out / CONFIG)
    if config_to_yaml(saved) != config_to_yaml(cfg):
        raise RunDirectoryError(f"the config differs from the one saved in {out / CONFIG}; a resumed run must use the same config")
    summary = read_summary(out)
    if summary is not None:
        return summary
    if not (out / CHECKPOINT).exists():
        return None  # killed before the first checkpoint: start over in place
    return RunState.from_dict(torch.load(out / CHECKPOINT, weights_only=True))


def _finish(cfg: RunConfig, out: Path, run: FederatedRun, result: RunResult, seconds: float) -> dict[str, Any]:
    privacy = dict(result.privacy)
    if result.ledger is not None:
        privacy["ledger"] = result.ledger.to_dict()
    write_json_atomic(out / PRIVACY, privacy)
    evaluated = [(row["round"], row["test_accuracy"]) for row in result.history if row.get("test_accuracy") is not None]
    best_round, best = max(evaluated, key=lambda t: t[1]) if evaluated else (None, None)
    validated = [row["val_accuracy"] for row in result.history if row.get("val_accuracy") is not None]
    summary = {
        "name": cfg.name,
        "final_accuracy": result.final_accuracy,
        "best_accuracy": best,
        "best_round": best_round,
        "final_val_accuracy": validated[-1] if validated else None,
        "rounds_done": len(result.history),
        "rounds_planned": run.rounds,
        "stop_reason": result.stop_reason,
        "epsilon_max": max(result.spent().values()) if result.ledger is not None else None,
        "traffic": traffic_report(result.history),
        "seconds": seconds,
    }
    write_json_atomic(out / SUMMARY, summary)
    write_report(out)
    return summary


def _save_checkpoint(path: Path, state: RunState) -> None:
    buffer = io.BytesIO()
    torch.save(state.to_dict(), buffer)
    write_bytes_atomic(path, buffer.getvalue())

"""Execute a configured run into a run directory, checkpointing so that a killed run resumes exactly.

Layout and formats: `dpfl/results/FORMATS.md`. The rules that keep a directory honest:
- the config is validated and the run built (data, model, calibration) before the directory is created,
  so a user error leaves nothing behind;
- `summary.json` is written only when the run has finished: its presence means complete;
- checkpoints and JSON files are written atomically (temp file + rename), and `metrics.jsonl` is cut
  back to the checkpoint's round on resume, so a crash at any point leaves a resumable directory;
- resuming with a config that differs from the saved one is refused.

Resume (`execute(..., resume=True)`) reads and checks every file of the directory BEFORE it changes
anything: a damaged file (garbage or truncated `checkpoint.pt`, `config.yaml`, `privacy.json`,
`summary.json`, a damaged complete line of `metrics.jsonl` or `environment.jsonl`) or a checkpoint that
belongs to another run is a `RunDirectoryError` / `RunDirError` (both `ValueError`s: one line in the CLI,
exit code 2) that names the file and what the user can do, and the directory is left byte for byte as it was.
Only the traces a killed writer leaves are repaired silently: a partial last line of `metrics.jsonl`, rows after the
checkpoint's round, temporary files of interrupted atomic writes. Resuming a finished run (summary.json
present: the training is complete) trains nothing and rewrites `report.md` and `plots/`, which a kill
after `summary.json` may have left missing or stale.
"""

from __future__ import annotations

import hashlib
import io
import os
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpfl.algorithms.stages import ServerStep
from dpfl.experiment.build import build_run
from dpfl.experiment.config import RunConfig, config_to_dict, config_to_yaml, load_config
from dpfl.experiment.federated_run import FederatedRun, RunResult, RunState
from dpfl.experiment.run_records import local_state_problem, mechanism_state_problem, without_evaluation_at_stop
from dpfl.experiment.run_lock import LOCK_FILE, hold_run_directory, run_held
from dpfl.results.environment import ENVIRONMENT_FILE, read_environment, record_environment
from dpfl.results.report import write_report
from dpfl.results.traffic import traffic_report
from dpfl.results.run_files import (PLOTS_DIR, append_jsonl, canonical_json, complete_jsonl_rows, read_config_text,
                                    read_metrics, read_privacy, read_summary, stale_temp_files, training_time,
                                    truncate_jsonl, write_bytes_atomic, write_json_atomic, write_text_atomic)

CONFIG, METRICS, PRIVACY, SUMMARY = "config.yaml", "metrics.jsonl", "privacy.json", "summary.json"
CHECKPOINT = "checkpoint.pt"
# Extra checkpoint key: sha256 of the config.yaml the checkpoint was written under (RunState ignores it).
FINGERPRINT = "dpfl_config_sha256"
_STATE_KEYS = ("round", "params", "retired", "ledger", "history", "stop_reason", "steps_done")


class RunDirectoryError(ValueError):
    """A user error about the run directory (exists already, nothing to resume, config changed, a damaged
    file, a checkpoint of another run)."""


class RunDirectoryOccupied(RunDirectoryError):
    """A new run (or a copy) was to start in a directory that already holds one (`is_occupied`)."""


Measure = Callable[[FederatedRun, RunResult], dict[str, Any]]


def execute(cfg: RunConfig, out: Path, *, resume: bool = False,
            on_round: Callable[[dict[str, Any]], None] | None = None,
            on_start: Callable[[FederatedRun, int], None] | None = None,
            build: Callable[[], FederatedRun] | None = None,
            measure: Measure | None = None) -> dict[str, Any]:
    """Run `cfg` into `out` (or continue it with `resume`) and return the summary.

    `build` makes the FederatedRun (default `build_run(cfg)`; `dpfl.run` passes the user's data and model objects).
    `measure(run, result)`: blocks added to privacy.json after the last round, before the summary is written (the
    attacks of `dpfl.evaluate` on the final models: what a curious client of an MP-DP run learns).
    """
    out = Path(out)
    build = build or (lambda: build_run(cfg))
    run = None
    if not resume:
        _refuse_existing(out)
        run = build()  # data, model, calibration: user errors surface before anything is written
        out.mkdir(parents=True, exist_ok=True)
    elif not out.is_dir():
        _inspect(cfg, out)  # raises: nothing to resume
    with hold_run_directory(out):  # another process writing here is refused before anything is read or written
        return _execute_held(cfg, out, run, build, on_round, on_start, measure)


def _execute_held(cfg: RunConfig, out: Path, run: FederatedRun | None, build: Callable[[], FederatedRun],
                  on_round: Callable[[dict[str, Any]], None] | None,
                  on_start: Callable[[FederatedRun, int], None] | None, measure: Measure | None) -> dict[str, Any]:
    """`execute` with the directory's lock held: resume when `run` is None, else start `run` afresh."""
    if run is None:
        found = _inspect(cfg, out)  # reads and checks every file; changes nothing
        if found.summary is not None:  # the training is complete: only the report may be missing
            _remove_stale_temps(out)
            write_report(out)
            return found.summary
        run = build()
        state = _check_state(found.checkpoint, run, out, found.fingerprint) if found.checkpoint is not None else None
        _check_metrics(out, state)
        # Everything checked: only now repair what a kill leaves behind.
        _remove_stale_temps(out)
        _restore_metrics(out, state)
        fingerprint = found.fingerprint
    else:
        _refuse_existing(out)  # again, under the lock: another process may have started here meanwhile
        _remove_stale_temps(out)
        text = config_to_yaml(cfg)
        write_text_atomic(out / CONFIG, text)
        fingerprint = _sha256(text.encode("utf-8"))
        truncate_jsonl(out / METRICS, 0)
        state = None
    record_environment(out, state.round if state is not None else 0, str(run.device))  # what ran from which round
    if on_start is not None:
        on_start(run, state.round if state is not None else 0)
    started = time.perf_counter()

    def record(row: dict[str, Any]) -> None:
        append_jsonl(out / METRICS, row)
        if on_round is not None:
            on_round(row)

    def evaluated(row: dict[str, Any]) -> None:  # the last row, with the model the run stopped with evaluated
        rows = len(complete_jsonl_rows(out / METRICS))
        truncate_jsonl(out / METRICS, rows - 1)
        append_jsonl(out / METRICS, row)

    result = run.run(record, state=state, on_checkpoint=lambda s: _save_checkpoint(out / CHECKPOINT, s, fingerprint),
                     checkpoint_every=cfg.checkpoint.every, on_evaluated=evaluated)
    return _finish(cfg, out, run, result, time.perf_counter() - started, measure)


# ---------------------------------------------------------------------------------------- fresh runs
def is_occupied(out: Path) -> bool:
    """Whether a new run must not start in `out`: it exists and holds more than a run that wrote nothing leaves (the
    lock file a killed run leaves, and the temp file of a write a kill interrupted)."""
    out = Path(out)
    if not out.is_dir():
        return out.exists()
    leftovers = set(stale_temp_files(out)) | {out / LOCK_FILE}
    return any(p not in leftovers for p in out.iterdir())


def _refuse_existing(out: Path) -> None:
    if is_occupied(out):
        hint = "it is a finished run" if (out / SUMMARY).exists() else "resume it with --resume"
        raise RunDirectoryOccupied(f"{out} already exists and is not empty ({hint}, or choose another --out)")


# ---------------------------------------------------------------------------------------- resume: checks
class _Found:
    """What `_inspect` read: the summary of a finished run, or the raw checkpoint (None: start over)."""

    def __init__(self, fingerprint: str, summary: dict[str, Any] | None, checkpoint: dict[str, Any] | None):
        self.fingerprint, self.summary, self.checkpoint = fingerprint, summary, checkpoint


def _placed_alike(cfg: RunConfig) -> str:
    """The config without where it runs (backend, ray, device): a run may resume on another backend, since its result
    does not depend on it (all randomness is keyed by seed, round and client), and on another device (checkpoints
    hold CPU tensors), where its later rounds draw that device's random streams: the same in distribution, not the
    rounds an uninterrupted run would have produced. config.yaml keeps where it started."""
    return config_to_yaml(cfg.model_copy(update={"backend": "local", "ray": None, "device": "cpu"}))


def _inspect(cfg: RunConfig, out: Path) -> _Found:
    """Read and check every file of `out` against `cfg`; raise before anything is written."""
    path = out / CONFIG
    if not path.is_file():
        what = "does not exist" if not out.exists() else f"has no {CONFIG}"
        raise RunDirectoryError(f"nothing to resume: {out} {what} (start the run without --resume)")
    raw = path.read_bytes()
    read_config_text(out)  # readable, a YAML mapping, not cut short (RunDirError with a hint otherwise)
    try:
        saved = load_config(path)
    except ValueError as e:
        detail = " ".join(str(e).split())
        detail = detail[len(f"{path}: "):] if detail.startswith(f"{path}: ") else detail
        raise RunDirectoryError(
            f"{path}: corrupt: not a valid dpfl config ({detail}); nothing was changed; without its saved config the "
            "run cannot be resumed: restore config.yaml from a copy, or re-run the experiment into a new --out"
        ) from None
    if config_to_yaml(saved) != config_to_yaml(cfg) and _placed_alike(saved) != _placed_alike(cfg):
        where = _first_difference(config_to_dict(saved), config_to_dict(cfg))
        note = ("" if config_to_yaml(saved).encode("utf-8") == raw else
                f"; note: {CONFIG} is not in the form dpfl writes it (edited, cut short, or written by another dpfl "
                "version): if it was damaged, the run cannot be resumed")
        raise RunDirectoryError(f"the config differs from the one saved in {path} ({where}); a resumed run must use "
                                f"the same config{note}")
    summary = read_summary(out)  # RunDirError (names the file, says what to do) if damaged
    if (out / METRICS).exists() or summary is not None:
        read_metrics(out)  # a finished run needs its metrics: a missing file is an error there
    if (out / PRIVACY).exists() or summary is not None:
        read_privacy(out)
    read_environment(out)
    if summary is not None:
        return _Found(_sha256(raw), summary, None)
    checkpoint = load_checkpoint(out / CHECKPOINT) if (out / CHECKPOINT).exists() else None
    return _Found(_sha256(raw), None, checkpoint)


# Checkpoints of f-DP runs written before 2026-11-30 hold NumPy floats in their metrics rows (the GDP accountant
# returned some); rebuilding a NumPy scalar from its dtype and bytes runs no code, so the safe loader may accept it.
_NUMPY_SCALAR_GLOBALS = [np._core.multiarray.scalar, np.dtype, *(type(np.dtype(t)) for t in "?bhilqBHILQefdg")]


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's content, after checking it is a whole torch archive with every RunState key (else one line)."""
    problem = _archive_problem(path)
    data: Any = None
    if problem is None:
        try:
            with torch.serialization.safe_globals(_NUMPY_SCALAR_GLOBALS):
                data = torch.load(path, weights_only=True, map_location="cpu")  # whatever device wrote it
        except Exception as e:  # noqa: BLE001 - a damaged payload raises many types (pickle, zip, EOF...)
            problem = f"cannot be loaded: {type(e).__name__}: {' '.join(str(e).split())[:100]}"
    if problem is not None:
        raise RunDirectoryError(
            f"{path}: corrupt: {problem}; nothing was changed; delete checkpoint.pt to restart the run from round 0 "
            "in place (`--resume` again), or re-run into a new --out")
    if not isinstance(data, dict) or any(k not in data for k in _STATE_KEYS):
        missing = [k for k in _STATE_KEYS if not isinstance(data, dict) or k not in data]
        raise RunDirectoryError(
            f"{path}: corrupt: not a dpfl checkpoint (missing {', '.join(missing)}); nothing was changed; delete "
            "checkpoint.pt to restart the run from round 0 in place (`--resume` again), or re-run into a new --out")
    return data


def _archive_problem(path: Path) -> str | None:
    """What is wrong with `path` as a torch.save archive (a zip file), before torch sees it."""
    try:
        if not zipfile.is_zipfile(path):
            return "not a checkpoint archive (garbage, or cut short)"
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        return f"a damaged archive ({type(e).__name__}: {' '.join(str(e).split())[:100]})"
    return None if bad is None else f"a damaged archive (bad checksum in {bad})"


def _not_this_run(out: Path, why: str) -> RunDirectoryError:
    return RunDirectoryError(
        f"{out / CHECKPOINT}: does not belong to this run ({why}); nothing was changed; put back this run's "
        "checkpoint, or delete checkpoint.pt to restart the run from round 0 in place (`--resume` again)")


def _check_state(data: dict[str, Any], run: FederatedRun, out: Path, fingerprint: str) -> RunState:
    """The checkpoint as a RunState, after checking that it fits `run` (a checkpoint of another config
    copied in must be refused here, not crash mid-round or, worse, continue someone else's run)."""
    stamp = data.get(FINGERPRINT)
    if stamp is not None and stamp != fingerprint:
        raise _not_this_run(out, f"it was written under another config than this directory's {CONFIG}")
    r = data["round"]
    if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r <= run.rounds:
        raise _not_this_run(out, f"round {r!r} is not in 0..{run.rounds}")
    history = data["history"]
    if not isinstance(history, list) or len(history) != r or any(
            not isinstance(row, dict) or row.get("round") != i + 1 for i, row in enumerate(history)):
        raise _not_this_run(out, f"its history is not the rows of rounds 1..{r}")
    fresh = run.initial_state()
    params = data["params"]
    if not isinstance(params, dict) or list(params) != list(fresh.params):
        raise _not_this_run(out, "its model parameters are not this model's")
    for name, t in fresh.params.items():
        got = params[name]
        if not isinstance(got, torch.Tensor) or got.shape != t.shape or got.dtype != t.dtype:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise _not_this_run(out, f"parameter {name} is {shape}, this model's is {tuple(t.shape)}")
    n = len(fresh.steps_done)
    steps, retired = data["steps_done"], data["retired"]
    if not isinstance(steps, list) or len(steps) != n:
        raise _not_this_run(out, f"it has {len(steps) if isinstance(steps, list) else '?'} clients, this run has {n}")
    if not isinstance(retired, list) or any(not isinstance(c, int) or not 0 <= c < n for c in retired):
        raise _not_this_run(out, "its retired clients are not clients of this run")
    if data["stop_reason"] is not None and not isinstance(data["stop_reason"], str):
        raise _not_this_run(out, "its stop reason is not a string")
    _check_ledger(data["ledger"], run, out)
    _check_component_state(run.algorithm.aggregator, data.get("aggregator_state"), "aggregator", out, fresh.params)
    problem = (mechanism_state_problem(run.algorithm.upload, data.get("mechanism_state"))
               or local_state_problem(run.algorithm.local, n, data.get("local_state")))
    if problem is not None:
        raise _not_this_run(out, f"it {problem}")
    personal = run.algorithm.personal
    if personal is not None:
        _check_component_state(personal, data.get("client_state"), "client", out)
    elif data.get("client_state") is not None:
        raise _not_this_run(out, "it holds client state, this algorithm keeps none")
    return RunState.from_dict(data)


def _check_ledger(ledger: Any, run: FederatedRun, out: Path) -> None:
    if (ledger is None) != (run.ledger is None):
        raise _not_this_run(out, "it has a privacy ledger and this run is not accounted" if ledger is not None
                            else "it has no privacy ledger and this run is accounted: the spent budgets would be lost")
    if ledger is None:
        return
    from dpfl.privacy.ledger import PrivacyLedger

    try:
        restored = PrivacyLedger.from_dict(ledger).to_dict()
    except Exception as e:  # noqa: BLE001 - any malformed payload
        raise _not_this_run(out, f"its privacy ledger cannot be read: {' '.join(str(e).split())[:120]}") from None
    expected = run.ledger.to_dict()
    for key in ("clients", "deltas", "budgets", "accountant", "unit"):
        if canonical_json(restored.get(key)) != canonical_json(expected.get(key)):
            raise _not_this_run(out, f"its privacy ledger has other {key} than this run's")


def _check_component_state(component: Any, state: Any, what: str, out: Path, params: Any = None) -> None:
    """A client-side stage (it keeps its state in attributes) gets a state it can load (loading it here is harmless:
    `run()` loads the checkpointed state again before using it); a server step with explicit state (its `init` at
    the initial `params` returns one: FedCEO's personal models, MP-DP's last broadcast, ...) gets a state of the same
    form, a mapping of its keys (a key the checkpoint lacks resumes at its initial value: `resumed_server_state`);
    a stateless server step gets none."""
    if isinstance(component, ServerStep):
        initial = component.init(params) if params is not None else None
        if initial is None:
            if state is not None:
                raise _not_this_run(out, f"it holds {what} state, this algorithm keeps none")
            return
        if state is None:
            raise _not_this_run(out, f"it holds no {what} state, this algorithm needs its ({type(component).__name__})")
        if isinstance(initial, dict) and (not isinstance(state, dict) or not set(state) <= set(initial)):
            raise _not_this_run(out, f"its {what} state does not fit {type(component).__name__} (not a mapping of "
                                     f"{', '.join(sorted(initial))})")
        return
    if not isinstance(state, dict):
        raise _not_this_run(out, f"it holds no {what} state, this algorithm needs its ({type(component).__name__})")
    try:
        component.load_state_dict(state)
    except Exception as e:  # noqa: BLE001 - KeyError, TypeError, ... from another algorithm's state
        raise _not_this_run(out, f"its {what} state does not fit {type(component).__name__} "
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:100]})") from None


def _check_metrics(out: Path, state: RunState | None) -> None:
    """metrics.jsonl must agree with the checkpoint: its first rows are the checkpoint's history (rows past
    the checkpoint are re-run, a partial last line is the trace of a kill; fewer rows are rebuilt)."""
    try:
        rows = complete_jsonl_rows(out / METRICS)
    except ValueError as e:  # read_metrics (in _inspect) already explains most damage; this is the rest
        raise RunDirectoryError(f"{' '.join(str(e).split())}; nothing was changed; delete {METRICS} and resume to "
                                f"rebuild it from {CHECKPOINT}") from None
    history = state.history if state is not None else []
    for i, (row, kept) in enumerate(zip(rows, history, strict=False), start=1):
        if _comparable(row) != _comparable(kept):
            raise RunDirectoryError(
                f"{out / METRICS}: line {i} differs from the round-{i} row recorded in {CHECKPOINT}: the two files are "
                f"not from the same run; nothing was changed; move one away: without {METRICS} it is rebuilt from "
                f"the checkpoint, without {CHECKPOINT} the run restarts from round 0 in place")


def _comparable(row: dict[str, Any]) -> str:
    """A row as two executions of the same round agree on it: untimed, and without the evaluation a stop added (a
    kill between the last row's rewrite and the last checkpoint leaves one file with it, the other without)."""
    return canonical_json(_untimed(without_evaluation_at_stop(row)))


def _untimed(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row without its wall-clock fields (`seconds`, `prox_seconds`): two executions of the same
    rounds agree on everything else, bit for bit."""
    return {k: v for k, v in row.items() if k != "seconds" and not k.endswith("_seconds")}


# ---------------------------------------------------------------------------------------- resume: repairs
def _remove_stale_temps(out: Path) -> None:
    """Temporary files of atomic writes interrupted by a kill (never renamed: nobody reads them)."""
    for directory in (out, out / PLOTS_DIR):
        for path in stale_temp_files(directory):
            path.unlink(missing_ok=True)


def _restore_metrics(out: Path, state: RunState | None) -> None:
    """Make metrics.jsonl hold exactly the checkpoint's rows: cut the rows after it and a partial last
    line, and write back from the checkpoint any row the file lacks (e.g. a deleted metrics.jsonl)."""
    n = state.round if state is not None else 0
    path = out / METRICS
    rows = complete_jsonl_rows(path)
    kept = state.history if state is not None else []
    have = next((i for i, (row, own) in enumerate(zip(rows[:n], kept, strict=False))
                 if canonical_json(_untimed(row)) != canonical_json(_untimed(own))), min(len(rows), n))
    truncate_jsonl(path, have)
    for row in (state.history[have:n] if state is not None else []):
        append_jsonl(path, row)


def _first_difference(saved: Any, given: Any, where: str = "") -> str:
    if isinstance(saved, dict) and isinstance(given, dict):
        for key in list(saved) + [k for k in given if k not in saved]:
            sub = f"{where}.{key}" if where else str(key)
            if key not in saved or key not in given:
                return f"{sub}: only in the {'given' if key not in saved else 'saved'} config"
            if saved[key] != given[key]:
                return _first_difference(saved[key], given[key], sub)
    return f"{where or 'config'}: saved {_short(saved)}, given {_short(given)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------- twins
def twin_key(cfg: RunConfig) -> str:
    """What a run's result depends on: its whole config except `name` (every random draw is keyed by seed, round and
    client; the only use of the name is secure aggregation's run id, which salts masks that cancel exactly in the
    ring sum). Two configs with the same key give the same run."""
    return config_to_yaml(cfg.model_copy(update={"name": ""}))


def copy_finished_run(src: Path, cfg: RunConfig, out: Path) -> dict[str, Any]:
    """Make `out` the finished run of `cfg` by copying `src`, a finished run of a config equal to `cfg` but for its
    name (a grid that lists the same run under several settings, e.g. a non-private reference that does not depend
    on the settings' budgets, then runs it once). config.yaml and summary.json carry `cfg`'s name, the checkpoint is
    re-stamped with its fingerprint, and summary.json records `same_run_as` (the source, relative to `out`)."""
    src, out = Path(src), Path(out)
    summary = read_summary(src)
    if summary is None:
        raise RunDirectoryError(f"{src} is not a finished run (no {SUMMARY}): nothing to copy")
    if twin_key(load_config(src / CONFIG)) != twin_key(cfg):
        raise RunDirectoryError(f"{src} holds a run of another config than {cfg.name!r} (beyond its name)")
    # two processes copying one twin: the second is refused (RunDirectoryBusy), or finds the copy made (refused)
    return run_held(out, lambda: _refuse_existing(out), lambda: _copy_held(src, summary, cfg, out))


def _copy_held(src: Path, summary: dict[str, Any], cfg: RunConfig, out: Path) -> dict[str, Any]:
    text = config_to_yaml(cfg)
    write_text_atomic(out / CONFIG, text)
    for name in (METRICS, PRIVACY, ENVIRONMENT_FILE):
        if (src / name).is_file():
            write_bytes_atomic(out / name, (src / name).read_bytes())
    if (src / CHECKPOINT).is_file():
        state = load_checkpoint(src / CHECKPOINT)
        buffer = io.BytesIO()
        torch.save({**state, FINGERPRINT: _sha256(text.encode("utf-8"))}, buffer)
        write_bytes_atomic(out / CHECKPOINT, buffer.getvalue())
    copied = {**summary, "name": cfg.name, "same_run_as": os.path.relpath(src, out)}
    write_json_atomic(out / SUMMARY, copied)
    write_report(out)
    return copied


# ---------------------------------------------------------------------------------------- the end
def _finish(cfg: RunConfig, out: Path, run: FederatedRun, result: RunResult, seconds: float,
            measure: Measure | None = None) -> dict[str, Any]:
    privacy = result.privacy.to_dict()
    if result.ledger is not None:
        privacy["ledger"] = result.ledger.to_dict()
    if measure is not None:
        privacy.update(measure(run, result))
    write_json_atomic(out / PRIVACY, privacy)
    best_round, best = _best(result.history, "test_accuracy")
    validated = [row["val_accuracy"] for row in result.history if row.get("val_accuracy") is not None]
    personal = result.final_personal_accuracy
    best_personal_round, best_personal = _best(result.history, "acc_personal")
    summary = {
        "name": cfg.name,
        "final_accuracy": result.final_accuracy,
        "best_accuracy": best,
        "best_round": best_round,
        "final_val_accuracy": validated[-1] if validated else None,
        **({} if personal is None else {"final_personal_accuracy": personal, "best_personal_accuracy": best_personal,
                                        "best_personal_round": best_personal_round}),
        "rounds_done": len(result.history),
        "rounds_planned": run.rounds,
        "stop_reason": result.stop_reason,
        "epsilon_max": _guarantee_max(result),
        "traffic": traffic_report(result.history),
        "seconds": seconds,
        **training_time(result.history),
        **({"backend": run.backend.describe()} if hasattr(run.backend, "describe") else {}),
    }
    write_json_atomic(out / SUMMARY, summary)
    write_report(out)
    return summary


def _best(history: list[dict[str, Any]], key: str) -> tuple[int | None, float | None]:
    """(round, value) of the largest `key` over the rounds that logged it; (None, None) if none did."""
    logged = [(row["round"], row[key]) for row in history if row.get(key) is not None]
    return max(logged, key=lambda t: t[1]) if logged else (None, None)


def _guarantee_max(result: RunResult) -> float | None:
    """The run's one epsilon (privacy.json `guarantee`): the largest client guarantee, None if not accounted."""
    guarantee = result.privacy.guarantee
    if guarantee is not None:
        return guarantee.epsilon_max
    return max(result.spent().values()) if result.ledger is not None else None


def _save_checkpoint(path: Path, state: RunState, fingerprint: str) -> None:
    buffer = io.BytesIO()
    torch.save({**state.to_dict(), FINGERPRINT: fingerprint}, buffer)
    write_bytes_atomic(path, buffer.getvalue())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

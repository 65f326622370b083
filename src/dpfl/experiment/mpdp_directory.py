"""An MP-DP run as a run directory: `dpfl run configs/mpdp/<name>.yaml` (the config's `scheme: mpdp` selects it).

The directory holds config.yaml, metrics.jsonl (one row per round), privacy.json (the method's guarantee: NOMINAL
for mpdp and mpdp_naive, accounted for mp_cdp), environment.jsonl (what ran it) and summary.json, written last.
MP-DP runs keep no checkpoints (the server's secrets are drawn per round and never stored), so a killed run is
re-run from the start, not resumed. As for training runs, the directory's lock file (.lock) is held while a run
writes there.
`dpfl reproduce mpdp` writes the same files for each of its runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dpfl.experiment.config.errors import ConfigError
from dpfl.experiment.config.loading import read_config_mapping
from dpfl.experiment.mpdp_config import MPDPConfig
from dpfl.experiment.mpdp_run import ClientAttacks, MPDPResult, federated_arrays, run_mpdp
from dpfl.experiment.run_directory import CONFIG, METRICS, PRIVACY, SUMMARY, RunDirectoryError, is_occupied
from dpfl.experiment.run_lock import run_held
from dpfl.results.environment import write_environment
from dpfl.results.run_files import write_json_atomic, write_text_atomic

SCHEME = "mpdp"


def is_mpdp_config(path: str | Path) -> bool:
    """Whether the YAML file at `path` is an MP-DP config (top-level `scheme: mpdp`); a file that is not readable
    YAML is not, and the run config's loader reports what is wrong with it."""
    try:
        return read_config_mapping(path).get("scheme") == SCHEME
    except ConfigError:
        return False


def write_run_files(out: Path, result: MPDPResult) -> None:
    """metrics.jsonl, privacy.json and environment.jsonl (one execution: MP-DP runs do not resume) of a finished
    run (summary.json is the caller's, written last)."""
    write_text_atomic(out / METRICS, "".join(json.dumps(row) + "\n" for row in result.history))
    write_json_atomic(out / PRIVACY, result.privacy)
    write_environment(out)


def execute_mpdp(cfg: MPDPConfig, out: Path, progress: Callable[[str], None] | None = None,
                 client_attacks: ClientAttacks | None = None) -> dict[str, Any]:
    """Run cfg's `method` into `out` (which must not exist or be empty) and return the summary. The directory's lock
    (`dpfl.experiment.run_lock`) is held from the run's start to its last write: a second process given the same
    `out` is refused at once (RunDirectoryBusy) instead of running too and overwriting the first's files.
    `client_attacks` (`dpfl.evaluate.mpdp_attacks.client_attacks` from the CLI) adds the spec's client attacks to
    privacy.json."""
    out = Path(out)
    arrays = federated_arrays(cfg)  # a missing dataset surfaces before the directory is made

    def run() -> dict[str, Any]:
        result = run_mpdp(cfg, cfg.method, arrays=arrays, progress=progress, client_attacks=client_attacks)
        write_text_atomic(out / CONFIG, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        write_run_files(out, result)
        summary = {"name": cfg.name, "scheme": SCHEME, **result.summary, "rounds_done": cfg.rounds}
        write_json_atomic(out / SUMMARY, summary)
        return summary

    return run_held(out, lambda: _refuse_used(out), run)


def _refuse_used(out: Path) -> None:
    """Raises if `out` holds a run (finished, or not: MP-DP runs cannot resume); the lock file alone is no
    obstacle (a run that failed before writing)."""
    if is_occupied(out):
        state = "a finished run" if (out / SUMMARY).exists() else "an unfinished run: MP-DP runs cannot resume"
        raise RunDirectoryError(f"{out} already exists and is not empty ({state}; choose another --out)")

"""What each mechanism stops in practice (issue 19): `dpfl reproduce attacks`.

For FedAvg (no privacy), record-level DP-SGD (`dpsgd`) and client-level central DP-FedAvg (`client`) at each budget,
on the scale's base config (`ci`: configs/attacks/ci_fmnist.yaml, budgets 1, 3, 8; `overfit`:
configs/attacks/overfit_fmnist.yaml, 50 records per client trained long enough that FedAvg overfits, budgets 1, 8,
100):
- the run itself (run directory runs/<setting>/run: accuracy, the ledger's epsilon);
- membership inference on its released model (`evaluate.released`; the strongest of the loss, confidence and shadow
  attacks by AUC: its ASR, AUC and TPR at 1% FPR);
- gradient inversion of one client's upload of 4 records in a probe round (`evaluate.probe`; the better of DLG and
  Inverting Gradients by PSNR);
- the empirical audit of the mechanism's unit (`evaluate.audit`: canary clients for fedavg and client, canary records
  for dpsgd), a 95%-confidence lower bound on epsilon next to the epsilon the audited run (the setting plus its
  canaries, calibrated to the same budget) reports.

OUT/results.csv: method, epsilon, seed, psnr, mia_asr, mia_auc, tpr_at_1fpr, eps_lower, eps_reported, accuracy,
audit_unit, status. Each setting's attacks.json is written last: a re-run skips finished settings of the same config
and refuses one of another (other --rounds). Settings are named `fedavg`, `dpsgd-eps1`, ..., `client-eps8`
(`setting_name`); `--seeds N` runs each on seeds 0..N-1 (seed 0 in runs/<config name>, as before seeds existed,
seed s in runs/<config name>-seed<s>) and results.md adds mean ± std over seeds; `--settings` selects them by
fnmatch pattern, `--dry-run` lists their state (`plan`) and
`--tables-only` rewrites the results from the finished ones without computing.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from dpfl.evaluate.audit import audit_config
from dpfl.attacks.figures import reconstruction_grid
from dpfl.attacks.membership import NonFiniteOutputsError
from dpfl.evaluate.probe import inversion_metrics, invert_probe, probe_round, shared_extractor
from dpfl.evaluate.released import attack_released_model
from dpfl.experiment.config import RunConfig, config_to_dict, config_to_yaml, load_config, validate_config
from dpfl.experiment.run_directory import execute
from dpfl.experiment.run_lock import RunDirectoryBusy, run_held
from dpfl.reproduce.jobs import GridError, config_dir, select_names
from dpfl.reproduce.runner import first_difference
from dpfl.reproduce.tables import csv_text, md_table, mean_std
from dpfl.reproduce.workers import rows_in_workers
from dpfl.results.environment import computed_and_written, describe_job, job_executions
from dpfl.results.formatting import or_na
from dpfl.results.run_files import write_json_atomic, write_text_atomic

COLUMNS = ["method", "epsilon", "seed", "psnr", "mia_asr", "mia_auc", "tpr_at_1fpr", "eps_lower", "eps_reported",
           "accuracy", "audit_unit", "status"]
SCALES = {"ci": {"config": "ci_fmnist.yaml", "epsilons": (1.0, 3.0, 8.0), "canaries": 200, "inversion_steps": 200},
          # few records trained long, so FedAvg's model overfits and membership inference has something to find
          "overfit": {"config": "overfit_fmnist.yaml", "epsilons": (1.0, 8.0, 100.0), "canaries": 200,
                      "inversion_steps": 200}}
DELTA = 1e-5
PICTURE_BATCH = 4  # the probe's batch: four private-class records, distinct labels


def setting_config(base: RunConfig, method: str, epsilon: float | None, rounds: int | None,
                   seed: int = 0) -> RunConfig:
    """The base config turned into `method` at `epsilon` (fedavg: None) and `seed`. Seed 0 keeps the name it had
    before seeds existed (its run directories stay valid); another seed adds `-seed<s>`."""
    d = config_to_dict(base)
    d["name"] = (f"{base.name}-{method}" + (f"-eps{epsilon:g}" if epsilon is not None else "")
                 + (f"-seed{seed}" if seed else ""))
    d["seed"] = seed
    if rounds is not None:
        d["training"]["rounds"] = rounds
    if method == "fedavg":
        d["algorithm"] = {"name": "fedavg"}
    elif method == "dpsgd":
        d["algorithm"] = {"name": "dp_fedavg_local"}
        d["privacy"] = {"mechanism": "dpsgd", "clip": 1.0, "budgets": epsilon, "delta": DELTA}
    elif method == "client":
        d["algorithm"] = {"name": "dp_fedavg_central"}
        d["privacy"] = {"mechanism": "central", "clip": 1.0, "budgets": epsilon, "delta": DELTA}
    else:
        raise ValueError(f"unknown method {method!r}; methods are fedavg, dpsgd, client")
    return validate_config(d)


def setting_name(method: str, epsilon: float | None) -> str:
    """The name --settings matches: fedavg, dpsgd-eps1, client-eps8, ..."""
    return method if epsilon is None else f"{method}-eps{epsilon:g}"


def settings(scale: str, rounds: int | None = None, pattern: str | None = None,
             seeds: int = 1) -> list[tuple[str, float | None, RunConfig]]:
    """(method, epsilon, config) of the scale's settings whose `setting_name` matches `pattern` (all if None), for
    seeds 0..seeds-1, seed by seed (every setting of seed 0 first)."""
    if scale not in SCALES:
        raise ValueError(f"--scale must be {' or '.join(SCALES)}, got {scale!r}")
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    base = load_config(config_dir("attacks") / SCALES[scale]["config"])
    out: list[tuple[str, float | None, RunConfig]] = []
    for seed in range(seeds):
        out.append(("fedavg", None, setting_config(base, "fedavg", None, rounds, seed)))
        for method in ("dpsgd", "client"):
            out += [(method, e, setting_config(base, method, e, rounds, seed)) for e in SCALES[scale]["epsilons"]]
    chosen = set(select_names(list(dict.fromkeys(setting_name(m, e) for m, e, _ in out)), pattern))
    return [(m, e, cfg) for m, e, cfg in out if setting_name(m, e) in chosen]


def setting_state(cfg: RunConfig, out: Path) -> str:
    """"finished" (attacks.json written), "partial" (its run started) or "new"; a GridError if OUT holds another
    experiment under this setting's name (other --rounds), which a re-run would mix with this one."""
    d = out / "runs" / cfg.name
    saved = d / "run" / "config.yaml"
    if saved.is_file():
        have, wanted = config_to_yaml(load_config(saved)), config_to_yaml(cfg)
        if have != wanted:
            raise GridError(f"{d} holds another run ({first_difference(have, wanted)}); use another --out, or the "
                            "options that made it")
    if (d / "attacks.json").is_file():
        return "finished"
    return "partial" if d.exists() else "new"


def plan(scale: str, out: Path, *, rounds: int | None = None, pattern: str | None = None,
         seeds: int = 1) -> list[tuple[str, RunConfig, str]]:
    """(setting name, config, state) of the selected settings, every directory checked before anything runs."""
    return [(setting_name(m, e), cfg, setting_state(cfg, out))
            for m, e, cfg in settings(scale, rounds, pattern, seeds)]


def describe(scale: str, out: Path, *, rounds: int | None = None, pattern: str | None = None,
             seeds: int = 1) -> list[str]:
    """The --dry-run listing: one line per selected setting and seed with its directory's state (`plan`)."""
    return [f"{name} seed {cfg.seed} ({cfg.name}, {cfg.training.rounds} rounds): {state}"
            for name, cfg, state in plan(scale, out, rounds=rounds, pattern=pattern, seeds=seeds)]


def run_setting(method: str, epsilon: float | None, cfg: RunConfig, out: Path, scale: str,
                cache: dict[Any, Any] | None = None) -> dict[str, Any]:
    """The run, its attacks and its audit; the row of results.csv (read back if attacks.json exists). `cache` keeps
    what settings share (the inversion metrics' feature extractor)."""
    d = out / "runs" / cfg.name

    def finished() -> dict[str, Any] | None:
        return _read_back(cfg, d) if setting_state(cfg, out) == "finished" else None

    # the run, attacks and audit of one process: another worker skips the setting (RunDirectoryBusy)
    return run_held(d, finished,
                    lambda: _run_setting_held(method, epsilon, cfg, d, scale, cache if cache is not None else {}))


def _read_back(cfg: RunConfig, d: Path) -> dict[str, Any]:
    return {"seed": cfg.seed, **json.loads((d / "attacks.json").read_text())}  # rows from before seeds: seed 0


def _run_setting_held(method: str, epsilon: float | None, cfg: RunConfig, d: Path, scale: str,
                      cache: dict[Any, Any]) -> dict[str, Any]:
    done = d / "attacks.json"
    row: dict[str, Any] = {"method": method, "epsilon": epsilon, "seed": cfg.seed}
    try:
        run_dir = d / "run"
        summary = execute(cfg, run_dir, resume=run_dir.exists())
        try:
            mia = attack_released_model(run_dir)["attacks"]
            best_mia = max(mia.values(), key=lambda a: a["auc"])
        except NonFiniteOutputsError as e:  # a diverged model: no membership numbers, the rest of the row stays
            best_mia = dict.fromkeys(("asr", "auc", "tpr_at_1fpr"))
            row["mia_skipped"] = e.skipped
        probe = probe_round(cfg, PICTURE_BATCH)
        extractor = shared_extractor(probe, 0, cache)  # the same public records for every setting: trained once
        inversion = invert_probe(probe, SCALES[scale]["inversion_steps"], extractor=extractor)
        reconstruction_grid(probe.x, {k: v["reconstruction"] for k, v in inversion.items()}, d / "inversion.png",
                            cfg.name)
        psnr = max(v["psnr"] for v in inversion.values())
        audit = audit_config(cfg, SCALES[scale]["canaries"])
        row.update(psnr=psnr, mia_asr=best_mia["asr"], mia_auc=best_mia["auc"], tpr_at_1fpr=best_mia["tpr_at_1fpr"],
                   eps_lower=audit["epsilon_lower_bound"], eps_reported=audit["epsilon_reported"],
                   accuracy=summary.get("final_accuracy"), audit_unit=audit["unit"], status="ok",
                   environment=describe_job())
        write_json_atomic(d / "audit.json", audit)
        write_json_atomic(d / "inversion.json", inversion_metrics(inversion))
    except Exception as e:  # noqa: BLE001 - a failed setting is a row with its message; the study goes on
        (d / "error.txt").write_text(traceback.format_exc())
        return {**row, "status": f"failed: {e}"}
    write_json_atomic(done, row)
    return row


def run_study(scale: str, out: Path, *, rounds: int | None = None, settings_pattern: str | None = None,
              seeds: int = 1, compute: bool = True, progress: Callable[[str], None] | None = None,
              command: str = "", workers: int = 1) -> tuple[Path, Path, list[dict[str, Any]]]:
    """Run (or with compute=False only read back) the selected settings; OUT/results.{csv,md} of their rows.
    `workers` > 1: the settings shared by that many processes (`dpfl.reproduce.workers`); one another process holds
    is skipped (its row is that process's)."""
    todo = settings(scale, rounds, settings_pattern, seeds)
    states = [setting_state(cfg, out) for _, _, cfg in todo]  # every directory checked before anything runs
    if compute and workers > 1:
        shared = rows_in_workers(partial(_setting_row, out, scale), todo, [cfg.name for _, _, cfg in todo], workers,
                                 finished=[state == "finished" for state in states])
        rows = [r for r in shared if r is not None]
    else:
        rows = _rows_here(todo, states, out, scale, compute, progress)
    if not rows and not compute:
        raise GridError(f"--tables-only: no finished setting of this selection under {out / 'runs'}")
    if not rows:
        raise GridError("every selected setting is being run by another process: its tables come when it ends "
                        "(or with --tables-only then)")
    out.mkdir(parents=True, exist_ok=True)
    csv_path = write_text_atomic(out / "results.csv", csv_text(rows, COLUMNS))
    md_path = write_text_atomic(out / "results.md", markdown(scale, rows, command, planned=len(todo)))
    return csv_path, md_path, rows


def _rows_here(todo: Sequence[tuple[str, float | None, RunConfig]], states: Sequence[str], out: Path, scale: str,
               compute: bool, progress: Callable[[str], None] | None) -> list[dict[str, Any]]:
    """The rows of `todo` in this process: every setting run (or read back if finished), or with compute=False only
    the finished ones read back; a setting another process holds is skipped."""
    rows: list[dict[str, Any]] = []
    cache: dict[Any, Any] = {}  # shared_extractor's: one feature extractor per public records
    for i, ((method, eps, cfg), state) in enumerate(zip(todo, states, strict=True), 1):
        if not compute and state != "finished":
            continue
        if compute and progress is not None:
            progress(f"[{i}/{len(todo)}] {cfg.name}")
        try:
            rows.append(run_setting(method, eps, cfg, out, scale, cache))  # a finished setting is read back
        except RunDirectoryBusy as err:  # another process runs it: its row is that process's
            if progress is not None:
                progress(f"  skipped: {err}")
    return rows


def _setting_row(out: Path, scale: str, setting: tuple[str, float | None, RunConfig],
                 cache: dict[Any, Any]) -> dict[str, Any]:
    method, epsilon, cfg = setting
    return run_setting(method, epsilon, cfg, out, scale, cache)


def markdown(scale: str, rows: Sequence[dict[str, Any]], command: str, planned: int | None = None) -> str:
    """results.md; `planned`: the selection's number of settings, when the rows may be fewer (--tables-only)."""
    done = [job_executions(r) for r in rows if r.get("status") == "ok"]
    provenance = computed_and_written(done, "setting")
    if planned is not None and len(rows) < planned:
        provenance += f" This table holds {len(rows)} of the selection's {planned} settings (the others have not " \
                      "finished here)."
    lines = [f"# What the mechanisms stop ({scale} scale)", "", f"Command: `{command}`" if command else "", "",
             provenance, "",
             "psnr: the better of DLG and Inverting Gradients on one client's upload of 4 records in a probe round "
             "(higher = more leakage). mia: the strongest of the loss, confidence and shadow attacks on the released "
             "model (ASR 0.5 = guessing). eps_lower: a 95%-confidence empirical lower bound on epsilon from canaries "
             "(one run; Steinke et al. 2023), next to the epsilon the audited run (the setting plus its canaries, "
             "calibrated to the same budget) reports; it can refute a reported epsilon, never confirm it.", ""]
    body = [[r["method"], or_na(r.get("epsilon"), "g"), str(r.get("seed", 0)), or_na(r.get("accuracy"), ".3f"),
             or_na(r.get("psnr"), ".1f"), or_na(r.get("mia_asr"), ".3f"), or_na(r.get("mia_auc"), ".3f"),
             or_na(r.get("tpr_at_1fpr"), ".3f"), or_na(r.get("eps_lower"), ".3f"), or_na(r.get("eps_reported"), ".3f"),
             r.get("audit_unit") or "n/a", r.get("status", "")] for r in rows]
    lines += md_table(["method", "ε budget", "seed", "accuracy", "PSNR dB", "MIA ASR", "MIA AUC", "TPR@1%FPR",
                       "ε lower", "ε reported", "audit unit", "status"], body)
    return "\n".join(lines + _over_seeds(rows)) + "\n"


def _over_seeds(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Mean ± sample std over seeds per (method, budget) of the finished rows, when some setting has several."""
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("status") == "ok":
            groups.setdefault((r["method"], r.get("epsilon")), []).append(r)
    if all(len(g) < 2 for g in groups.values()):
        return []
    body = [[method, or_na(eps, "g"), str(len(g))] + [mean_std((r.get(k) for r in g), ".3f") for k in (
        "accuracy", "psnr", "mia_asr", "mia_auc", "tpr_at_1fpr", "eps_lower")] for (method, eps), g in groups.items()]
    return ["", "Over seeds (mean ± sample std of the finished runs):", ""] + md_table(
        ["method", "ε budget", "seeds", "accuracy", "PSNR dB", "MIA ASR", "MIA AUC", "TPR@1%FPR", "ε lower"], body)

"""MP-DP's comparison (Yang et al., arXiv 2412.11737; spec bidirectional.md §9, §11): `dpfl reproduce mpdp`.

Methods on the same shards, initial model, batches and FedSGD rounds (the config's MSE-trained network):

| method | what runs |
|---|---|
| mpdp | MP-DP: perturbed model to clients, LMT at Ŵ, joint clipping of (g, Ψ, Φ) at Ŵ (the spec's default), DDP noise |
| mpdp_oracle_clip | MP-DP with the simulation-only clip of the TRUE gradient (`clip_mode: oracle_true`): the
  idealised sensitivity |
| mpdp_naive | MP-DP-Naive: a Gaussian LDP upload on the perturbed gradient, no pairwise noise |
| mp_cdp | MP-CDP: a trusted server, clipped true gradients, Gaussian on the mean (accounted by dpfl's RDP accountant) |
| fedavg | FedSGD in the clear, no privacy |
| tp_smc | only on request (`--methods ...,tp_smc`): TP-SMC, clipped true gradients with client Gaussian noise
  summed under threshold Paillier (spec §9's optional baseline; about 50 s per round at the configs' 1024-bit keys
  on the ci MLP); accounted like mp_cdp under its honest-client assumption; no inversion view (the server sees only
  the decrypted sum) |

`ci`: configs/mpdp/ci_digits_mlp.yaml at nominal per-round epsilon 3 (the spec's), 30 and 300, ci_digits_cnn.yaml
at 3 and 300, ci_digits_k100.yaml (K = 100, n-out graph, Theorem 11) at its epsilon 3, and ci_digits_mlp_hardened.yaml
(mask_corrections) at 30 and 300 for mpdp and mpdp_oracle_clip only, 2 seeds;
ci_fmnist_mlp.yaml when Fashion-MNIST is found locally. `full`: full_c10_k5, full_c100_k5 (Theorem 10),
full_c10_k100_verified (n = 68) and full_c10_k100_paper (n = 5, UNVERIFIED) at nominal epsilon 1 and 3, 3 seeds,
with dpfl's norm-free tied-residual ResNets (EXPERIMENTAL, spec §7.4), when the CIFAR files are found locally;
BreakHis is listed as skipped (dpfl has no BreakHis loader). `overfit`: overfit_fmnist_mlp.yaml at nominal
per-round epsilon 3, 30 and 300, 3 seeds, when Fashion-MNIST is found locally: 100 records per client and 400
full-batch rounds, so that FedAvg's model overfits and a client's membership inference has something to find (the
ci models do not overfit; CIFAR, where the paper measured it, is absent).

OUT/results.csv: setting, method, seed, epsilon (nominal per round; empty for fedavg), accuracy (final, the true
model on the test set), round_seconds, server_seconds (per round), client_seconds (per client per round),
upload_bytes (per client per round), violation_rate (share of client-rounds whose noise-free recovered gradient
exceeded S), epsilon_composed (per client over the run: nominal composition for mpdp*, dpfl's accountant for
mp_cdp), perturbed_accuracy and demasked_accuracy (mpdp*: the last model client 0 received, as received and after
it demasked it with its own labels, spec §10 W3), mia_asr and mia_auc (membership inference by a client, the
strongest of the loss, confidence and shadow attacks by AUC: on the perturbed model as received for mpdp*, on the
plaintext global model otherwise; 0.5 = guessing), mia_asr_adaptive (mpdp*: the same on client 0's demasked network),
psnr_b1 and psnr_b8 (gradient inversion by the server of client 0's probe upload at the final true model, batch 1
and 8, the strongest of DLG and Inverting Gradients on every view the server has, in dB, higher = more leakage;
psnr_b*_recovered, psnr_b*_upload and psnr_b*_phi: mpdp*'s views, the Eq. (18) recovered gradient matched at W, the
raw upload matched at Ŵ, and the noise-free correction term Φ_k (W2): evaluate/mpdp_inversion.py),
status, run_dir. Every job is an ordinary run directory of the one round loop (`run_directory.execute`: config.yaml,
metrics.jsonl, checkpoint.pt, privacy.json with every attack's ASR, AUC and TPR at 1% FPR, summary.json) plus
comparison.json, the job's results.csv row, written last. A re-run skips the finished jobs of the same config and
inversion steps, resumes the unfinished ones from their last checkpoint, and refuses, before running anything, a
directory that holds another config: one --out, one experiment. `--only-seeds` spreads a
grid's seeds over sessions or machines; `--tables-only` writes the tables of the finished runs and trains nothing.
Two invocations may share an --out, and `--workers N` starts N processes that do: a job's directory is locked while
it runs (`dpfl.experiment.run_lock`), and a job another process is running is skipped, its row left to that process
(the tables then hold the finished runs; with --workers, every job's row).
"""

from __future__ import annotations

import json
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from dpfl.data.errors import DatasetNotFoundError
from dpfl.evaluate.mpdp_attacks import comparison_arrays, measure_client_attacks
from dpfl.evaluate.mpdp_inversion import ProbeSetting, inversion_report
from dpfl.experiment.build import build_data, build_run
from dpfl.experiment.config import RunConfig, config_to_dict, config_to_yaml, load_config, validate_config
from dpfl.experiment.config.overrides import apply_overrides
from dpfl.experiment.federated_run import FederatedRun
from dpfl.experiment.run_directory import (CHECKPOINT, CONFIG, PRIVACY, SUMMARY, RunDirectoryOccupied, execute,
                                          load_checkpoint)
from dpfl.experiment.run_lock import RunDirectoryBusy, hold_run_directory, lock_holder
from dpfl.reproduce.jobs import GridError, check_planned, config_dir, select_names
from dpfl.reproduce.runner import DIFFERS, FINISHED, NEW, PARTIAL, first_difference
from dpfl.reproduce.tables import csv_text, md_table, mean_std
from dpfl.reproduce.workers import rows_in_workers
from dpfl.results.environment import computed_and_written, run_environments
from dpfl.results.formatting import or_na
from dpfl.results.run_files import read_metrics, write_json_atomic, write_text_atomic

METHODS = ("mpdp", "mpdp_oracle_clip", "mpdp_naive", "mp_cdp", "fedavg")
OPTIONAL_METHODS = ("tp_smc",)  # run only when --methods names them (slow: homomorphic encryption every round)
ALGORITHM = {"mpdp_oracle_clip": "mpdp", "fedavg": "fedsgd"}  # a method's algorithm, where the names differ
COMPARISON = "comparison.json"  # a job's results.csv row, written last
ERROR = "error.txt"  # the traceback of a job's last failed attempt
COLUMNS = ["setting", "method", "seed", "epsilon", "accuracy", "round_seconds", "server_seconds", "client_seconds",
           "upload_bytes", "violation_rate", "epsilon_composed", "epsilon_label", "perturbed_accuracy",
           "demasked_accuracy", "mia_asr", "mia_auc", "mia_asr_adaptive", "psnr_b1", "psnr_b8", "psnr_b1_recovered",
           "psnr_b8_recovered", "psnr_b1_upload", "psnr_b8_upload", "psnr_b1_phi", "psnr_b8_phi", "status", "run_dir"]
INVERSION_STEPS = 200  # per attack and probe batch, as in `dpfl reproduce attacks`
SCALES = {
    "ci": {"seeds": 2, "configs": (("ci_digits_mlp.yaml", (3.0, 30.0, 300.0)), ("ci_digits_cnn.yaml", (3.0, 300.0)),
                                   ("ci_digits_k100.yaml", (3.0,)), ("ci_fmnist_mlp.yaml", (3.0,)),
                                   # mask_corrections changes only MP-DP: its baselines would repeat ci_digits_mlp
                                   ("ci_digits_mlp_hardened.yaml", (30.0, 300.0), ("mpdp", "mpdp_oracle_clip")))},
    "full": {"seeds": 3, "configs": tuple((f"{name}.yaml", (1.0, 3.0)) for name in (
        "full_c10_k5", "full_c100_k5", "full_c10_k100_verified", "full_c10_k100_paper"))},
    # a membership-inference stand-in for the full scale: few records per client, trained until FedAvg overfits
    "overfit": {"seeds": 3, "configs": (("overfit_fmnist_mlp.yaml", (3.0, 30.0, 300.0)),)},
}
SKIPPED = {
    "ci": {},
    "overfit": {},
    "full": {"full_breakhis_k5": "dpfl has no BreakHis loader (the histopathology PNGs would need a local "
                                 "image-folder reader); no config ships"},
}


def with_fields(cfg: RunConfig, *overrides: str) -> RunConfig:
    """`cfg` with `FIELD.PATH=VALUE` overrides, validated again."""
    return validate_config(apply_overrides(config_to_dict(cfg), overrides))


@dataclass(frozen=True)
class MPDPJob:
    setting: str
    method: str
    seed: int
    config: RunConfig  # the setting's config at this job's seed and epsilon

    def directory(self, out: Path) -> Path:
        return out / "runs" / self.setting / f"{self.method}-seed{self.seed}"

    def run_config(self) -> RunConfig:
        """The config this job runs, as its config.yaml records it: its method's algorithm, and for
        mpdp_oracle_clip MP-DP with the simulation-only clip of the true gradient. The threat model (mechanism,
        unit, observer), which validation filled in for the setting's algorithm, is left out so that it is filled in
        again for the method's (mp_cdp: mpdp_central, fedsgd: none), as `dpfl run --set algorithm.name=...` does."""
        extra = {"mpdp_oracle_clip": ("algorithm.params.clip_mode=oracle_true",),
                 "fedavg": ("privacy.clip=null",)}.get(self.method, ())  # FedSGD clips nothing
        return with_fields(self.config, f"algorithm.name={ALGORITHM.get(self.method, self.method)}",
                           "privacy.mechanism=null", "privacy.unit=null", "privacy.observer=null", *extra)


def job_state(job: MPDPJob, out: Path, inversion_steps: int) -> tuple[str, str]:
    """(state, why) of a job's directory: new, finished, partial (resumed) or config differs."""
    d = job.directory(out)
    config_path, row_path = d / CONFIG, d / COMPARISON
    if not config_path.is_file():
        if (d / "summary.json").is_file():
            return DIFFERS, "it was made before dpfl saved each run's config.yaml, so its config cannot be checked"
        return NEW, ""
    saved, wanted = config_path.read_text(encoding="utf-8"), config_to_yaml(job.run_config())
    if saved != wanted:
        return DIFFERS, first_difference(saved, wanted)
    if not row_path.is_file():
        return PARTIAL, ""
    steps = json.loads(row_path.read_text(encoding="utf-8")).get("inversion_steps")
    if steps != inversion_steps:
        return DIFFERS, f"saved inversion_steps {steps}, this job {inversion_steps}"
    return FINISHED, ""


def check_directories(todo: Sequence[MPDPJob], out: Path, inversion_steps: int) -> list[str]:
    """Every job's state; GridError (before anything runs) if a directory holds another experiment."""
    states = []
    for job in todo:
        state, why = job_state(job, out, inversion_steps)
        if state == DIFFERS:
            raise GridError(f"{job.directory(out)} holds another run ({why}); use another --out, or the options "
                            "that made it")
        states.append(state)
    return states


def _setting_name(cfg: RunConfig, eps: float, several: bool) -> str:
    return f"{cfg.name}-eps{eps:g}" if several else cfg.name


def jobs(scale: str, seeds: int | None = None, methods: Sequence[str] | None = None,
         rounds: int | None = None, settings_pattern: str | None = None) -> tuple[list[MPDPJob], dict[str, str]]:
    """The scale's jobs, and the settings skipped with their reasons. `settings_pattern`: only the settings whose
    name matches it (fnmatch; commas: alternatives), e.g. 'full_c10_k5-*'."""
    if scale not in SCALES:
        raise ValueError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    wanted = tuple(methods) if methods else METHODS
    unknown = set(wanted) - set(METHODS) - set(OPTIONAL_METHODS)
    if unknown:
        raise ValueError(f"unknown method(s) {sorted(unknown)}; methods are {', '.join(METHODS)} (the default) and "
                         f"{', '.join(OPTIONAL_METHODS)} (on request)")
    n_seeds = seeds if seeds is not None else SCALES[scale]["seeds"]
    skipped = dict(SKIPPED[scale])
    out: list[MPDPJob] = []
    for filename, epsilons, *only in SCALES[scale]["configs"]:  # an optional third entry: the config's methods
        base = load_config(config_dir("mpdp") / filename, [f"training.rounds={rounds}"] if rounds else [])
        try:
            build_data(base)
        except DatasetNotFoundError as e:
            skipped[base.name] = f"dataset {base.data.dataset!r} not found locally ({str(e).splitlines()[0]})"
            continue
        for eps in epsilons:
            setting = _setting_name(base, eps, len(epsilons) > 1)
            for seed in range(n_seeds):
                cfg = with_fields(base, f"algorithm.params.epsilon={eps!r}", f"seed={seed}")
                for method in (m for m in wanted if not only or m in only[0]):
                    if method == "fedavg" and eps != epsilons[0]:
                        continue  # no epsilon: once per config and seed
                    out.append(MPDPJob(setting if method != "fedavg" else base.name, method, seed, cfg))
    if settings_pattern:
        chosen = set(select_names(list(dict.fromkeys(j.setting for j in out)), settings_pattern))
        out = [j for j in out if j.setting in chosen]
    return out, skipped


def inversion_columns(inversion: dict[str, Any]) -> dict[str, float | None]:
    """psnr_b{b}: the strongest (view, attack); psnr_b{b}_recovered / _upload / _phi: the best attack on the
    Eq. (18) recovered gradient, on the raw upload at Ŵ and on the noise-free Φ_k (mpdp*; empty where the view
    does not exist)."""
    row: dict[str, float | None] = {}
    for b, entry in inversion.get("batches", {}).items():
        row[f"psnr_b{b}"] = entry.get("psnr")
        for view, col in (("recovered", "recovered"), ("upload_at_w_hat", "upload"), ("phi", "phi")):
            attacks = entry.get("views", {}).get(view, {}).get("attacks")
            row[f"psnr_b{b}_{col}"] = max(a["psnr"] for a in attacks.values()) if attacks else None
    return row


CLIENT_SECONDS = {"mpdp": ("lmt_seconds", "ddp_seconds"), "mpdp_naive": ("lmt_seconds", "ddp_seconds"),
                  "tp_smc": ("client_seconds", "encrypt_seconds")}
SERVER_SECONDS = {"mpdp": ("server_seconds", "upload_sum_seconds", "recover_update_seconds"),
                  "mpdp_naive": ("server_seconds", "upload_sum_seconds", "recover_update_seconds"),
                  "tp_smc": ("decrypt_seconds",)}


def comparison_row(cfg: RunConfig, history: list[dict[str, Any]], privacy: dict[str, Any],
                   seconds: float) -> dict[str, Any]:
    """The comparison's numbers of one finished run (results.csv's columns): final accuracy, times per round,
    upload size, violation rate, the composed epsilon and its label, and what the client attacks found."""
    method = ALGORITHM_METHOD.get(cfg.algorithm.name, cfg.algorithm.name)
    stage = privacy.get("stage", {})
    membership = privacy.get("membership", {})
    rounds = len(history)
    per_round = lambda keys: sum(row.get(k, 0.0) for row in history for k in keys) / rounds  # noqa: E731
    final = history[-1]
    return {"setting": cfg.name, "method": method, "seed": cfg.seed,
            "epsilon": None if method == "fedavg" else cfg.algorithm.params["epsilon"],
            "accuracy": final.get("test_accuracy"), "round_seconds": sum(r["seconds"] for r in history) / rounds,
            "server_seconds": per_round(SERVER_SECONDS.get(method, ())),
            "client_seconds": per_round(CLIENT_SECONDS.get(method, ("client_seconds",))) / cfg.data.clients,
            "upload_bytes": final["uplink_bytes"] // max(len(final["selected"]), 1),
            "violation_rate": stage.get("violation_rate"),
            "epsilon_composed": stage.get("composed_epsilon_max", stage.get("epsilon_total")),
            "demasked_accuracy": privacy.get("model_hiding", {}).get("demasked_accuracy"),
            "perturbed_accuracy": privacy.get("model_hiding", {}).get("perturbed_accuracy"),
            "mia_asr": membership.get("plain", {}).get("asr"), "mia_auc": membership.get("plain", {}).get("auc"),
            "mia_asr_adaptive": membership.get("adaptive", {}).get("asr"),
            "epsilon_label": stage.get("label", stage.get("guarantee")), "rounds": rounds, "seconds": seconds}


ALGORITHM_METHOD = {"fedsgd": "fedavg"}  # the comparison's name of an algorithm, where they differ


def run_job(job: MPDPJob, out: Path, inversion_steps: int = INVERSION_STEPS,
            extractors: dict[Any, Any] | None = None) -> dict[str, Any]:
    """Runs one job into its directory (resuming it; skipped if finished) and returns its results.csv row.
    `inversion_steps`: per attack and probe batch; 0 skips the inversion (recorded as skipped). `extractors`: the
    study's cache of public feature extractors (`shared_extractor`), shared by its jobs. Another process running
    the job: RunDirectoryBusy, nothing written."""
    d = job.directory(out)
    state = check_directories([job], out, inversion_steps)[0]
    if state == FINISHED:
        return json.loads((d / COMPARISON).read_text())
    if state == NEW:  # the traceback of an attempt that failed before its run started: the job starts afresh
        (d / ERROR).unlink(missing_ok=True)
    cfg = job.run_config()
    built: list[FederatedRun] = []
    started = time.perf_counter()
    try:
        try:
            execute(cfg, d, resume=state == PARTIAL, measure=measure_client_attacks,
                    on_start=lambda run, done: built.append(run))
        except RunDirectoryOccupied:  # a new job: did another process start it while this one built the run?
            now = job_state(job, out, inversion_steps)[0]
            if now == FINISHED:
                return json.loads((d / COMPARISON).read_text())
            if now == PARTIAL:  # its row is that process's (or, if it died, the next invocation's: it resumes)
                raise RunDirectoryBusy(f"{d}: another process started this job while this one prepared it") from None
            raise
        with hold_run_directory(d):  # attacks of the server and the row, once
            if (d / COMPARISON).is_file():  # another process finished it meanwhile
                return json.loads((d / COMPARISON).read_text())
            return _finish_job(job, out, cfg, built[0] if built else build_run(cfg), inversion_steps, extractors,
                               time.perf_counter() - started)
    except RunDirectoryBusy:
        raise
    except Exception as e:  # noqa: BLE001 - a failed run is a row with its message; the study goes on
        d.mkdir(parents=True, exist_ok=True)
        (d / ERROR).write_text(traceback.format_exc())
        return {"setting": job.setting, "method": job.method, "seed": job.seed, "status": f"failed: {e}",
                "run_dir": str(d)}


def _finish_job(job: MPDPJob, out: Path, cfg: RunConfig, run: FederatedRun, inversion_steps: int,
                extractors: dict[Any, Any] | None, seconds: float) -> dict[str, Any]:
    """The server's inversion of a probe upload at the final model (into privacy.json), then comparison.json."""
    d = job.directory(out)
    weights = list(load_checkpoint(d / CHECKPOINT)["params"].values())
    plan = run.algorithm.local.network
    inversion = (inversion_report(ProbeSetting.of(run), weights, plan, comparison_arrays(run.data),
                                  steps=inversion_steps, extractors=extractors)
                 if inversion_steps > 0 else {"skipped": "--inversion-steps 0"})
    privacy = json.loads((d / PRIVACY).read_text())
    privacy["inversion"] = inversion
    write_json_atomic(d / PRIVACY, privacy)
    summary = comparison_row(cfg, read_metrics(d), privacy, seconds)
    row = {**{k: summary.get(k) for k in COLUMNS}, "setting": job.setting, "method": job.method,
           **inversion_columns(inversion), "status": "ok", "run_dir": str(d.relative_to(out)),
           "inversion_steps": inversion_steps}
    write_json_atomic(d / COMPARISON, row)
    return row


def _checked_seeds(only_seeds: Sequence[int] | None, todo: Sequence[MPDPJob]) -> set[int] | None:
    if only_seeds is None:
        return None
    planned = sorted({j.seed for j in todo})
    if not planned:
        raise GridError("--only-seeds: this selection plans no run (every setting was skipped; see --dry-run)")
    check_planned(only_seeds, planned)
    return set(only_seeds)


def _partial_words(d: Path) -> str:
    """What a re-run does with an unfinished job's directory (config.yaml and no comparison.json)."""
    if (d / SUMMARY).is_file():
        return "partial: trained; the server's inversion and the row remain"
    if (d / CHECKPOINT).is_file():
        return "partial: resumes from its last checkpoint"
    return "partial: no checkpoint yet, runs again from round 0"


def describe(scale: str, out: Path, *, seeds: int | None = None, methods: Sequence[str] | None = None,
             rounds: int | None = None, settings_pattern: str | None = None, only_seeds: Sequence[int] | None = None,
             inversion_steps: int = INVERSION_STEPS) -> list[str]:
    """The --dry-run listing: one line per job to run with its directory's state, then the skipped settings."""
    todo, skipped = jobs(scale, seeds, methods, rounds, settings_pattern)
    chosen = _checked_seeds(only_seeds, todo)
    todo = [j for j in todo if chosen is None or j.seed in chosen]
    lines = [f"mpdp, scale {scale}: {len(todo)} jobs -> {out / 'runs'}"]
    for job in todo:
        state, why = job_state(job, out, inversion_steps)
        state = _partial_words(job.directory(out)) if state == PARTIAL else state
        holder = lock_holder(job.directory(out)) if state != FINISHED else None
        state = f"running in another process ({holder})" if holder else state
        lines.append(f"{job.setting} {job.method} seed {job.seed}: {state}" + (f" ({why})" if why else ""))
    return lines + [f"skipped: {k}: {v}" for k, v in sorted(skipped.items())]


def run_study(scale: str, out: Path, *, seeds: int | None = None, methods: Sequence[str] | None = None,
              rounds: int | None = None, settings_pattern: str | None = None,
              only_seeds: Sequence[int] | None = None, compute: bool = True,
              progress: Callable[[str], None] | None = None,
              command: str = "", inversion_steps: int = INVERSION_STEPS,
              workers: int = 1) -> tuple[Path, Path, list[dict[str, Any]]]:
    """Runs the grid's jobs (`only_seeds`: only these seeds'; compute=False, --tables-only: none; workers > 1: shared
    by that many processes, `dpfl.reproduce.workers`) and writes the tables of every finished run of the grid under
    `out`."""
    if inversion_steps < 0:
        raise ValueError(f"--inversion-steps must be >= 0, got {inversion_steps}")
    todo, skipped = jobs(scale, seeds, methods, rounds, settings_pattern)
    chosen = _checked_seeds(only_seeds, todo)
    states = check_directories(todo, out, inversion_steps)
    runs = [compute and (chosen is None or j.seed in chosen) for j in todo]
    picked = [(job, state == FINISHED) for job, state, run in zip(todo, states, runs, strict=True) if run]
    ran = iter(_rows_in_workers(picked, out, inversion_steps, workers) if workers > 1 and picked
               else _rows_here([job for job, _ in picked], out, inversion_steps, progress))  # in grid order
    rows = []
    for job, state, run in zip(todo, states, runs, strict=True):
        if run:
            row = next(ran)
            if row is not None:  # None: another process held it (its row is that process's)
                rows.append(row)
        elif state == FINISHED:  # a seed not selected this time: its finished row is read back for the tables
            rows.append(json.loads((job.directory(out) / COMPARISON).read_text()))
    if not rows and not compute:
        raise GridError(f"--tables-only: no finished run of this selection under {out / 'runs'}")
    out.mkdir(parents=True, exist_ok=True)
    csv_path = write_text_atomic(out / "results.csv", csv_text(rows, COLUMNS))
    line = computed_and_written(run_environments(out / r["run_dir"] for r in rows if r["status"] == "ok"))
    if len(rows) < len(todo):
        line += f" These tables hold {len(rows)} of the grid's {len(todo)} runs (the others have not finished here)."
    md_path = write_text_atomic(out / "results.md", markdown(scale, rows, skipped, command, line))
    return csv_path, md_path, rows


def _rows_here(todo: Sequence[MPDPJob], out: Path, inversion_steps: int,
               progress: Callable[[str], None] | None) -> list[dict[str, Any] | None]:
    """The rows of `todo` run (or read back if finished) in this process, in order; None for a job another process
    holds."""
    rows: list[dict[str, Any] | None] = []
    extractors: dict[Any, Any] = {}  # trained once per dataset and seed for all the study's jobs
    for done, job in enumerate(todo, 1):
        if progress is not None:
            progress(f"[{done}/{len(todo)}] {job.setting} {job.method} seed {job.seed}")
        try:
            rows.append(run_job(job, out, inversion_steps, extractors))
        except RunDirectoryBusy as err:  # another process sharing --out runs it: its row is that process's
            rows.append(None)
            if progress is not None:
                progress(f"  skipped: {err}")
    return rows


def _rows_in_workers(todo: list[tuple[MPDPJob, bool]], out: Path, inversion_steps: int,
                     workers: int) -> list[dict | None]:
    """The rows of the jobs of `todo` (job, finished before) run by `workers` processes (`rows_in_workers`), in
    order; None for a job every worker found held by another process."""
    names = [f"{j.setting} {j.method} seed {j.seed}" for j, _ in todo]
    return rows_in_workers(partial(_job_row, out, inversion_steps), [j for j, _ in todo], names, workers,
                           finished=[done for _, done in todo])


def _job_row(out: Path, inversion_steps: int, job: MPDPJob, extractors: dict[Any, Any]) -> dict[str, Any]:
    return run_job(job, out, inversion_steps, extractors)


def _mean_or_na(values: Sequence[Any], spec: str) -> str:
    return "n/a" if any(v is None for v in values) else format(statistics.fmean(values), spec)


def _mia_cell(rs: Sequence[dict[str, Any]]) -> str:
    """Membership inference ASR, mean ± std over seeds, with the demasked network's in parentheses (mpdp*).
    Runs made before the attack was added, or whose attacked model diverged (not attacked), have no value: n/a."""
    if any(r.get("mia_asr") is None for r in rs):
        return "n/a"
    cell = mean_std([r["mia_asr"] for r in rs])
    if all(r.get("mia_asr_adaptive") is not None for r in rs):
        cell += f" ({mean_std([r['mia_asr_adaptive'] for r in rs])})"
    return cell


def markdown(scale: str, rows: Sequence[dict[str, Any]], skipped: dict[str, str], command: str,
             provenance_line: str) -> str:
    """results.md; `provenance_line`: `computed_and_written`'s sentence for the runs."""
    lines = [f"# MP-DP comparison ({scale} scale)", "", f"Command: `{command}`" if command else "", "",
             provenance_line, "",
             "Accuracy: the TRUE model on the test set after the last round, mean ± sample std over seeds. Epsilons "
             "of mpdp* are NOMINAL per-round guarantees (Theorems 10/11, assuming the idealised Gaussian model; see "
             "docs/secure.md W1/W2); mpdp_oracle_clip's do NOT hold towards the server, whose view, the upload, its "
             "clip does not bound (see the inversion column); mp_cdp's are dpfl's accountant's, and so are tp_smc's, "
             "which assume its honest clients. Times are per round on "
             "this machine. MIA ASR: "
             "membership inference by a client (strongest of loss, confidence and shadow attacks; 0.5 = guessing) on "
             "the model it received: perturbed for mpdp* (in parentheses: after client 0 demasked it), the plaintext "
             "global model otherwise. Inversion PSNR: the server inverting client 0's upload in a probe round at the "
             "final true model, the strongest of DLG and Inverting Gradients on every view the server has (for mpdp*: "
             "the Eq. (18) recovered gradient, the raw upload at Ŵ and the noise-free correction term Φ; the CSV "
             "has each); higher = more leakage.", ""]
    ok = [r for r in rows if r.get("status") == "ok"]
    for setting in sorted({r["setting"] for r in ok}):
        mine = [r for r in ok if r["setting"] == setting]
        body = []
        for method in METHODS + OPTIONAL_METHODS:
            rs = [r for r in mine if r["method"] == method]
            if not rs:
                continue
            body.append([method, len(rs), mean_std([r["accuracy"] for r in rs]),
                         or_na(statistics.fmean(r["round_seconds"] for r in rs), ".4f"),
                         or_na(statistics.fmean(r["server_seconds"] for r in rs), ".4f"),
                         or_na(statistics.fmean(r["client_seconds"] for r in rs), ".4f"),
                         f"{rs[0]['upload_bytes']:,}",
                         or_na(rs[0]["violation_rate"], ".3f") if rs[0]["violation_rate"] is not None else "n/a",
                         or_na(max(r["epsilon_composed"] for r in rs), ".4g") if rs[0]["epsilon_composed"] is not None
                         else "n/a",
                         mean_std([r.get("demasked_accuracy") for r in rs])
                         if any(r.get("demasked_accuracy") is not None for r in rs)
                         else "n/a", _mia_cell(rs),
                         " / ".join(_mean_or_na([r.get(f"psnr_b{b}") for r in rs], ".1f") for b in (1, 8))])
        stamps = sorted({part.strip() for r in mine for part in (r.get("epsilon_label") or "").split(";")
                         if "UNVERIFIED" in part})  # repeated wherever the epsilon is shown (mpdp.privacy)
        lines += [f"## {setting}" + (" (epsilons UNVERIFIED)" if stamps else ""), ""]
        lines += [f"**{s}**: the epsilons of this setting are not guaranteed by the theorem they are computed with."
                  for s in stamps] + ([""] if stamps else [])
        lines += md_table(["method", "seeds", "accuracy", "round s", "server s", "client s", "upload B/client",
                           "violation rate", "composed ε (max)", "demasked acc. (W3)", "MIA ASR (demasked)",
                           "inversion PSNR dB b1 / b8"], body)
        lines.append("")
    failed = [r for r in rows if r.get("status") != "ok"]
    if failed:
        lines += ["## Failed runs", ""] + [f"- {r['setting']} {r['method']} seed {r['seed']}: {r['status']}"
                                           for r in failed] + [""]
    if skipped:
        lines += ["## Skipped settings", ""] + [f"- {k}: {v}" for k, v in sorted(skipped.items())] + [""]
    return "\n".join(lines)

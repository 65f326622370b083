"""Running a comparison for real (a reduced subset of the Robust-HDP ci grid), resuming it, and failures.

The end-to-end runs use the ci grid with 2 methods, 1 round and logistic regression instead of the thesis
CNN (`extra=["model.name=logr"]`): ~4 s per run instead of ~15 s. The slow test runs the real ci CNN.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from lock_holder import hold_in_another_process, kill
from dpfl.data.errors import DatasetNotFoundError
from dpfl.experiment.run_directory import execute as real_execute
from dpfl.experiment.run_lock import RunDirectoryBusy
from dpfl.reproduce import pfa, robust_hdp
from dpfl.reproduce.runner import FAILED, OK, SKIPPED, ConfigMismatchError, describe_jobs, run_jobs
from dpfl.reproduce.tables import COLUMNS, columns, write_results
from dpfl.results.run_files import read_metrics

SMALL = dict(rounds=1, methods=["weiavg", "oracle"], extra=["model.name=logr"])


def _never(*args, **kwargs):
    raise AssertionError("a finished job was executed again")


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, fmnist):
    out = tmp_path_factory.mktemp("rhdp_ci")
    grid = robust_hdp.grid("ci", **SMALL)
    outcomes = run_jobs(grid.jobs, out)
    write_results(grid, outcomes, out, command="test")
    return grid, out, outcomes


def test_ci_subset_runs_end_to_end_and_writes_the_results(ci_run):
    grid, out, outcomes = ci_run
    assert [(o.job.setting, o.job.method, o.status, o.action) for o in outcomes] == [
        ("fmnist-Dist5", "weiavg", OK, "ran"), ("fmnist-Dist5", "oracle", OK, "ran"),
        ("fmnist-Dist5-misreport", "weiavg", OK, "ran"), ("fmnist-Dist5-misreport", "oracle", OK, "ran")]
    for o in outcomes:
        assert o.run_dir == out / "runs" / o.job.setting / o.job.method / "seed0"
        assert (o.run_dir / "summary.json").is_file()
    with open(out / "results.csv", newline="") as f:
        assert next(csv.reader(f)) == columns("robust-hdp") == [*COLUMNS[:10], "final_test_loss", *COLUMNS[10:]]
    rows = {(r["setting"], r["method"]): r for r in _rows(out)}
    assert len(rows) == 4
    for r in rows.values():
        assert r["status"] == "ok" and r["seed"] == "0"
        assert r["scale"] == "ci (reduced: 1 round instead of 3, overrides model.name=logr)"
        assert 0.0 <= float(r["final_accuracy"]) <= 1.0 and r["best_accuracy"] == r["final_accuracy"]
        assert (r["rounds_run"], r["rounds_planned"], r["stop_reason"]) == ("1", "1", "rounds")
        assert r["meets_budgets"] == "True" and float(r["max_epsilon_spent"]) <= 1.5 + 1e-9
        assert float(r["min_budget"]) == 0.2
        assert 0.0 <= float(r["test_acc_clients_mean_final"]) <= 1.0
        metrics = [m for m in read_metrics(out / r["run_dir"]) if "test_loss" in m]
        assert float(r["final_test_loss"]) == pytest.approx(metrics[-1]["test_loss"]) and metrics[-1]["test_loss"] > 0
        assert float(r["uplink_mib"]) == pytest.approx(6 * 7850 * 4 / 2**20)  # 6 clients upload 7,850 floats
        assert r["run_dir"] == f"runs/{r['setting']}/{r['method']}/seed0"
    # the oracle's weights minimise the analytic noise statistic: never above WeiAvg's on the same run
    honest_w, honest_o = rows[("fmnist-Dist5", "weiavg")], rows[("fmnist-Dist5", "oracle")]
    assert float(honest_o["noise_stat_round1_analytic"]) <= float(honest_w["noise_stat_round1_analytic"])
    assert honest_o["label"] == "privileged reference (reads the true noise)"


def test_results_md_compares_methods_and_the_falsified_budget(ci_run):
    grid, out, _ = ci_run
    md = (out / "results.md").read_text()
    assert "**Scale: ci (reduced: 1 round instead of 3, overrides model.name=logr)**" in md
    assert "fixed, not tuned" in md
    assert "oracle — **privileged reference (reads the true noise)**" in md
    assert "## Round-1 noise statistic (analytic)" in md
    falsified = md.split("## Falsified budget: fmnist-Dist5-misreport against fmnist-Dist5")[1].split("\n## ")[0]
    oracle_row = next(line for line in falsified.splitlines() if line.startswith("| oracle |"))
    # the oracle never reads the reported epsilon: identical curve, zero difference, the same test loss
    cells = [c.strip() for c in oracle_row.strip("|").split("|")]
    assert cells[3:4] == ["+0.0000 ± n/a"] and cells[6:] == ["1", "yes"], oracle_row
    assert cells[4] == cells[5] != "n/a" and float(cells[4].split()[0]) > 0, oracle_row
    for setting in ("fmnist-Dist5", "fmnist-Dist5-misreport"):
        assert f"## {setting}\n" in md
        assert f"](plots/{setting}.png)" in md
        assert (out / "plots" / f"{setting}.png").stat().st_size > 1000
    section = md.split("## fmnist-Dist5\n")[1].split("\n## ")[0]
    assert "| weiavg | 1/1 |" in section


def test_a_second_invocation_skips_finished_jobs(ci_run):
    grid, out, _ = ci_run
    stamps = {o: (o / "summary.json").stat().st_mtime_ns for o in (j.run_dir(out) for j in grid.jobs)}
    outcomes = run_jobs(grid.jobs, out, execute=_never)
    assert {(o.status, o.action) for o in outcomes} == {(OK, "finished before")}
    assert stamps == {o: (o / "summary.json").stat().st_mtime_ns for o in stamps}
    # the results are re-collected from the directories, identical
    before = (out / "results.csv").read_text()
    write_results(grid, outcomes, out, command="test")
    assert (out / "results.csv").read_text() == before


def test_a_changed_config_is_refused_before_anything_runs(ci_run):
    _, out, _ = ci_run
    other = robust_hdp.grid("ci", **{**SMALL, "rounds": 2})
    with pytest.raises(ConfigMismatchError, match=r"different config \(saved 'rounds: 1', this job 'rounds: 2'\)"):
        run_jobs(other.jobs, out, execute=_never)


def test_an_interrupted_job_is_resumed(ci_run, tmp_path):
    """A directory without summary.json (killed after its last checkpoint) is resumed, not restarted or refused."""
    grid, out, _ = ci_run
    job = grid.jobs[0]
    shutil.copytree(job.run_dir(out), job.run_dir(tmp_path))
    (job.run_dir(tmp_path) / "summary.json").unlink()
    listing = describe_jobs(grid, tmp_path)  # --dry-run says how far it got
    assert listing[3].split()[:7] == [job.setting, job.method, "0", "partial:", "round", "1", "of"]
    assert "partial: round 1 of 1 logged" in listing[3] and listing[4].split()[3] == "new"
    calls = []

    def spy(cfg, path, **kw):
        calls.append(kw["resume"])
        return real_execute(cfg, path, **kw)

    [outcome] = run_jobs([job], tmp_path, execute=spy)
    assert (outcome.status, outcome.action, calls) == (OK, "resumed", [True])
    assert (job.run_dir(tmp_path) / "summary.json").is_file()
    assert len(read_metrics(job.run_dir(tmp_path))) == 1  # round 1 was not run twice


def test_a_failing_job_is_recorded_and_the_others_continue(tmp_path, fmnist):
    grid = pfa.grid("ci", seeds=3, rounds=1, methods=["np_fedavg"], settings_pattern="fmnist-logr-*-rdp")
    ran = []

    def flaky(cfg, path, **kw):
        ran.append(cfg.seed)
        if cfg.seed == 1:
            raise RuntimeError("boom in seed 1")
        return real_execute(cfg, path, **kw)

    outcomes = run_jobs(grid.jobs, tmp_path, execute=flaky)
    assert ran == [0, 1, 2]
    assert [o.status for o in outcomes] == [OK, FAILED, OK]
    assert outcomes[1].message.startswith("RuntimeError: boom in seed 1 (traceback: logs/")
    log = tmp_path / "logs" / "fmnist-logr-iid-MixGauss1-M10-rdp.np_fedavg.seed1.log"
    assert "Traceback" in log.read_text() and "boom in seed 1" in log.read_text()
    write_results(grid, outcomes, tmp_path)
    rows = _rows(tmp_path)
    assert [(r["seed"], r["status"]) for r in rows] == [("0", "ok"), ("1", "failed"), ("2", "ok")]
    assert "boom in seed 1" in rows[1]["message"] and rows[1]["final_accuracy"] == ""
    assert rows[0]["meets_budgets"] == "False" and rows[0]["max_epsilon_spent"] == ""  # np_fedavg: no DP at all
    md = (tmp_path / "results.md").read_text()
    assert "| np_fedavg — **non-private reference (no DP)** | 2/3 (failed) |" in md
    # the next invocation retries the failed job only
    ran.clear()
    again = run_jobs(grid.jobs, tmp_path, execute=lambda cfg, path, **kw: ran.append(cfg.seed))
    assert ran == [1] and [o.status for o in again] == [OK, OK, OK]
    assert not log.exists()


def test_settings_of_a_missing_dataset_are_skipped_not_failed(tmp_path):
    grid = robust_hdp.grid("full", datasets=["mnist", "fashion_mnist"], seeds=1, rounds=1,
                           settings_pattern="*-Dist1", methods=["np_fedavg", "weiavg"])
    tried = []

    def fake(cfg, path, **kw):
        tried.append((cfg.data.dataset, cfg.algorithm.name))
        if cfg.data.dataset == "mnist":
            raise DatasetNotFoundError("mnist: not found in /nowhere")
        return {}

    outcomes = run_jobs(grid.jobs, tmp_path, execute=fake)
    assert tried == [("mnist", "weiavg"), ("fashion_mnist", "weiavg"), ("fashion_mnist", "fedavg")]
    assert [o.status for o in outcomes] == [SKIPPED, SKIPPED, OK, OK]
    assert outcomes[1].message == "dataset mnist is not available on this machine (mnist: not found in /nowhere)"


def test_a_missing_mnist_is_skipped_by_the_real_loader(tmp_path):
    from dpfl.data import available

    if any(r["name"] == "mnist" and r.get("source") != "missing" for r in available()):
        pytest.skip("MNIST is available here")
    grid = pfa.grid("full", datasets=["mnist"], seeds=1, rounds=1, settings_pattern="mnist-logr-*MixGauss1-M30*",
                    methods=["np_fedavg", "fedavg"])
    outcomes = run_jobs(grid.jobs, tmp_path)
    assert [o.status for o in outcomes] == [SKIPPED, SKIPPED]
    assert not (tmp_path / "runs").exists()


@pytest.mark.integration
def test_the_real_ci_grid_with_the_thesis_cnn(tmp_path, fmnist):
    """The ci grid as shipped (cnn_rhdp), two methods in both settings, one round: ~1 minute."""
    grid = robust_hdp.grid("ci", rounds=1, methods=["robust_hdp", "fedavg"])
    outcomes = run_jobs(grid.jobs, tmp_path)
    write_results(grid, outcomes, tmp_path)
    assert [o.status for o in outcomes] == [OK] * 4
    md = (tmp_path / "results.md").read_text()
    robust = next(line for line in md.split("## Falsified budget")[1].splitlines() if line.startswith("| robust_hdp |"))
    assert robust.endswith("| yes |")  # Robust-HDP never reads the reported epsilon


def test_a_job_another_process_is_running_is_skipped_and_the_rest_run(tmp_path, fmnist):
    """Two invocations sharing --out: the job whose directory another process holds is skipped (its result is that
    process's), not trained into the same directory; the next invocation collects it once it has finished."""
    grid = pfa.grid("ci", seeds=2, rounds=1, methods=["np_fedavg"], settings_pattern="fmnist-logr-*-rdp")
    busy = grid.jobs[0].run_dir(tmp_path)
    busy.mkdir(parents=True)
    proc = hold_in_another_process(busy)
    try:
        listing = describe_jobs(grid, tmp_path)  # --dry-run says who runs it
        outcomes = run_jobs(grid.jobs, tmp_path)
    finally:
        kill(proc)
    assert f"running in another process (pid {proc.pid} on " in listing[-2] and listing[-1].split()[3] == "new"
    assert "logged" not in listing[-2]  # nothing logged yet: no round to report
    assert [o.status for o in outcomes] == [SKIPPED, OK]
    assert "in use by another process" in outcomes[0].message
    assert not (busy / "config.yaml").exists()
    assert [o.status for o in run_jobs(grid.jobs, tmp_path)] == [OK, OK]


def test_a_job_finished_by_another_process_meanwhile_is_not_run_again(tmp_path, fmnist):
    """States are read again when a job's turn comes: one that another invocation finished in the meantime is
    'finished before', not refused as an existing directory."""
    grid = pfa.grid("ci", seeds=2, rounds=1, methods=["np_fedavg"], settings_pattern="fmnist-logr-*-rdp")
    first, second = grid.jobs
    ran = []

    def and_the_other_process(cfg, path, **kw):
        ran.append(cfg.seed)
        real_execute(second.config, second.run_dir(tmp_path))  # the other invocation finishes job 2 meanwhile
        return real_execute(cfg, path, **kw)

    outcomes = run_jobs(grid.jobs, tmp_path, execute=and_the_other_process)
    assert ran == [0]
    assert [(o.status, o.action) for o in outcomes] == [(OK, "ran"), (OK, "finished before")]


def test_a_twin_finished_by_another_process_meanwhile_is_copied_not_run(tmp_path, fmnist):
    """The non-private reference is one run listed under both calibrations: when another invocation finished the
    first listing while this one could not take it, the second listing is copied, not trained again."""
    grid = pfa.grid("ci", seeds=1, rounds=1, methods=["np_fedavg", "fedavg"], settings_pattern="fmnist-logr-*")
    reference, other, twin = grid.jobs[0], grid.jobs[1], grid.jobs[2]
    assert (reference.method, twin.method, twin.setting) == ("np_fedavg", "np_fedavg", grid.settings[1].name)
    ran = []

    def held_by_another_process(cfg, path, **kw):
        ran.append(path)
        if path == reference.run_dir(tmp_path):  # the other invocation holds it, and finishes it
            real_execute(cfg, path)
            raise RunDirectoryBusy(f"{path} is in use by another process (test)")
        return real_execute(cfg, path, **kw)

    outcomes = run_jobs(grid.jobs, tmp_path, execute=held_by_another_process)
    assert ran == [reference.run_dir(tmp_path), other.run_dir(tmp_path), grid.jobs[3].run_dir(tmp_path)]
    assert outcomes[0].status == SKIPPED and outcomes[2].action.startswith("copied from")


def test_a_job_another_process_finished_while_this_one_prepared_it_is_finished_not_failed(tmp_path, fmnist):
    """Two workers read a job as new; one takes its directory and finishes it while the other still loads the data
    and calibrates. The latecomer's `execute` then finds the directory full: the job is finished (by the other), not
    failed; one the other has only started is skipped."""
    grid = pfa.grid("ci", seeds=2, rounds=1, methods=["np_fedavg"], settings_pattern="fmnist-logr-*-rdp")
    first, second = grid.jobs

    def the_other_finished_it(cfg, path, **kw):
        real_execute(cfg, path)  # the other process, in the time this one prepared the run
        return real_execute(cfg, path, **kw)

    outcomes = run_jobs([first], tmp_path, execute=the_other_finished_it)
    assert [(o.status, o.action) for o in outcomes] == [(OK, "finished before")], outcomes[0].message
    assert not (tmp_path / "logs").exists()

    class _Killed(Exception):
        pass

    def the_other_started_it(cfg, path, **kw):
        with pytest.raises(_Killed):  # the other process wrote its config and a round, and is still running
            real_execute(cfg, path, on_round=lambda row: (_ for _ in ()).throw(_Killed()))
        return real_execute(cfg, path, **kw)

    outcomes = run_jobs([second], tmp_path, execute=the_other_started_it)
    assert [o.status for o in outcomes] == [SKIPPED] and "another process started it" in outcomes[0].message

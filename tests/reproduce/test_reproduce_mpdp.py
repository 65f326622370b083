"""`dpfl reproduce mpdp`: the grid runs, each job an ordinary run directory plus comparison.json (its row), writes
results.csv with the issue's columns, lists what it skipped, and resumes without re-running finished jobs.

The ci grid, the full scale's CIFAR-10 jobs, TP-SMC (homomorphic encryption every round) and the two worker processes
are in the integration tier (`make test-integration`, 8-40 s each); the default tier runs MP-DP end to end in
tests/experiment/test_mpdp_directory.py, the overfit job here and tests/reproduce/test_reproduce_mpdp_pieces.py."""

import csv
import json

import pytest

from cli_runner import cli
from lock_holder import hold_in_another_process, kill


@pytest.mark.integration
def test_reproduce_mpdp_ci_smoke(tmp_path):
    out = tmp_path / "mpdp"
    code, stdout, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", out, "--seeds", 1, "--rounds", 2,
                            "--methods", "mpdp,mp_cdp,fedavg", "--inversion-steps", 5)
    assert code == 0, err
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {"setting", "method", "seed", "epsilon", "accuracy", "round_seconds", "server_seconds",
            "client_seconds"} <= set(rows[0])
    settings = {r["setting"] for r in rows}
    assert {"ci_digits_mlp-eps3", "ci_digits_mlp-eps30", "ci_digits_mlp-eps300", "ci_digits_k100"} <= settings
    assert all(r["status"] == "ok" for r in rows)
    assert {r["epsilon"] for r in rows if r["method"] == "fedavg"} == {""}
    assert all(0 <= float(r["mia_asr"]) <= 1 for r in rows)  # every method's target is attacked
    assert {r["method"] for r in rows if r["mia_asr_adaptive"]} == {"mpdp"}  # demasking exists only for MP-DP
    assert all(r["psnr_b1"] for r in rows)  # the server's inversion ran on every method (K = 100: batch 8 skipped)
    assert {r["setting"] for r in rows if not r["psnr_b8"]} == {"ci_digits_k100"}
    hardened = [r for r in rows if r["setting"].startswith("ci_digits_mlp_hardened")]
    assert {r["method"] for r in hardened} == {"mpdp"}  # its config lists MP-DP's methods only
    assert all(r["psnr_b1_upload"] and not r["psnr_b1_recovered"] and not r["psnr_b1_phi"] for r in hardened)
    md = (out / "results.md").read_text()
    assert "ci_digits_cnn-eps3" in settings and "NOMINAL" in md and "Runs computed by: dpfl " in md
    for row in rows:  # every job: a run directory of the one loop, its row written last
        d = out / row["run_dir"]
        assert all((d / name).is_file() for name in ("config.yaml", "metrics.jsonl", "checkpoint.pt", "privacy.json",
                                                     "summary.json", "comparison.json")), d
        assert json.loads((d / "comparison.json").read_text())["accuracy"] == float(row["accuracy"])
    k100 = out / "runs" / "ci_digits_k100" / "mpdp-seed0"
    mtimes = [(k100 / name).stat().st_mtime_ns for name in ("summary.json", "comparison.json")]
    code, _, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", out, "--seeds", 1, "--rounds", 2,
                       "--methods", "mpdp,mp_cdp,fedavg", "--inversion-steps", 5)
    assert code == 0, err
    assert [(k100 / name).stat().st_mtime_ns for name in ("summary.json", "comparison.json")] == mtimes
    assert list(csv.DictReader((out / "results.csv").open())) == rows


def test_reproduce_mpdp_bad_input_is_one_line(tmp_path):
    code, _, err = cli("reproduce", "mpdp", "--scale", "huge", "--out", tmp_path)
    assert code == 2 and "--scale must be" in err
    code, _, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", tmp_path, "--methods", "magic")
    assert code == 2 and "unknown method" in err
    code, _, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", tmp_path, "--inversion-steps", -1)
    assert code == 2 and "--inversion-steps must be >= 0" in err


@pytest.mark.integration
def test_full_scale_runs_the_cifar_configs_when_the_files_exist(tmp_path, monkeypatch):
    """With (fake, tiny) CIFAR-10 files the full scale's CIFAR-10 settings become jobs with dpfl's norm-free
    tied-residual ResNet20 and run; CIFAR-100 (absent) and BreakHis (no loader) are listed as skipped."""
    from data.fakes import write_cifar10

    from dpfl.reproduce.mpdp import jobs, run_job

    write_cifar10(tmp_path / "data" / "cifar10" / "cifar-10-batches-py", per_batch=20, n_test=6)  # K = 100: 100 records
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "data"))
    todo, skipped = jobs("full", seeds=1, methods=["mpdp"], rounds=1)
    assert {j.setting for j in todo} == {f"{name}-eps{e}" for name in ("full_c10_k5", "full_c10_k100_verified",
                                                                       "full_c10_k100_paper") for e in (1, 3)}
    assert set(skipped) == {"full_c100_k5", "full_breakhis_k5"} and "not found locally" in skipped["full_c100_k5"]
    job = next(j for j in todo if j.setting == "full_c10_k5-eps1")
    assert job.config.model.name == "mpdp_resnet" and job.config.model.options["blocks"] == 3
    row = run_job(job, tmp_path / "out", inversion_steps=2)  # the attacks run through the tied-residual ResNet
    assert row["status"] == "ok" and row["psnr_b1"] is not None and row["mia_asr"] is not None, row
    paper = next(j for j in todo if j.setting == "full_c10_k100_paper-eps3")
    assert paper.config.algorithm.params["mode"] == "unverified"


@pytest.mark.integration
def test_tp_smc_runs_only_on_request_with_the_clients_attack_and_no_inversion_view(tmp_path):
    """TP-SMC is an opt-in method: not in the default grid; named, it runs (here with 256-bit keys and one round: the
    arithmetic is exact at any key size), its plaintext model is attacked by membership inference, and the
    server's inversion is skipped with the reason (it never sees an upload in the clear)."""
    from dpfl.reproduce.mpdp import jobs, markdown, run_job, with_fields
    from dpfl.results.environment import computed_and_written, run_environments

    default, _ = jobs("ci", seeds=1, rounds=1)
    assert "tp_smc" not in {j.method for j in default}
    todo, _ = jobs("ci", seeds=1, methods=["tp_smc"], rounds=1)
    assert {j.method for j in todo} == {"tp_smc"}
    assert not any(j.setting.startswith("ci_digits_mlp_hardened") for j in todo)  # that config lists MP-DP only
    job = next(j for j in todo if j.setting == "ci_digits_mlp-eps30")
    job = type(job)(job.setting, job.method, job.seed, with_fields(job.config, "algorithm.params.tpsmc_key_bits=256"))
    row = run_job(job, tmp_path, inversion_steps=5)
    assert row["status"] == "ok" and 0.0 <= row["accuracy"] <= 1.0
    assert 0.0 <= row["mia_asr"] <= 1.0 and row["psnr_b1"] is None and row["epsilon_composed"] > 30.0
    privacy = json.loads((tmp_path / row["run_dir"] / "privacy.json").read_text())
    assert "never sees a client's upload in the clear" in privacy["inversion"]["skipped"]
    assert "honest" in privacy["stage"]["guarantee"] and privacy["stage"]["key_bits"] == 256
    md = markdown("ci", [row], {}, "test", computed_and_written(run_environments([tmp_path / row["run_dir"]])))
    assert any(line.startswith("| tp_smc | 1 |") and line.rstrip().endswith("n/a / n/a |") for line in md.splitlines())
    assert "Runs computed by: dpfl " in md and "(1 run). Written by: dpfl " in md


@pytest.mark.needs_fmnist
def test_overfit_scale_runs_the_fashion_mnist_membership_stand_in(tmp_path, monkeypatch):
    """`--scale overfit`: one config at three epsilons (FedAvg once per seed), 100 records per client trained full
    batch; a job runs and every method's target is attacked by membership inference."""
    from dpfl.reproduce.mpdp import jobs, run_job

    monkeypatch.setenv("DPFL_OFFLINE", "1")
    todo, skipped = jobs("overfit", seeds=1, rounds=3)
    if "overfit_fmnist_mlp" in skipped:
        pytest.skip("Fashion-MNIST is not on this machine")
    assert {j.setting for j in todo} == {"overfit_fmnist_mlp", "overfit_fmnist_mlp-eps3", "overfit_fmnist_mlp-eps30",
                                         "overfit_fmnist_mlp-eps300"}
    assert len(todo) == 3 * 4 + 1 and not skipped
    job = next(j for j in todo if j.setting == "overfit_fmnist_mlp-eps300" and j.method == "mpdp_oracle_clip")
    assert job.config.data.samples_per_client == job.config.training.batch_size == 100
    assert job.config.data.dataset == "fashion_mnist"
    row = run_job(job, tmp_path, inversion_steps=0)
    assert row["status"] == "ok" and row["mia_asr"] is not None and row["mia_asr_adaptive"] is not None, row
    code, text, err = cli("reproduce", "mpdp", "--scale", "overfit", "--out", tmp_path / "grid", "--dry-run")
    assert code == 0, err
    assert "scale overfit: 39 jobs" in text and "overfit_fmnist_mlp-eps300 mpdp_oracle_clip seed 2: new" in text


def test_a_job_another_process_is_running_is_skipped_and_listed(tmp_path):
    """Two `dpfl reproduce mpdp` on one --out: a job whose directory another process holds is neither run nor
    written (its row is the other process's); --dry-run names the holder; once it is gone the job runs."""
    from dpfl.experiment.run_lock import LOCK_FILE, RunDirectoryBusy
    from dpfl.reproduce.mpdp import describe, jobs, run_job, run_study

    out = tmp_path / "mpdp"
    select = dict(seeds=1, methods=["fedavg"], rounds=1, settings_pattern="ci_digits_k100", inversion_steps=0)
    (job,), _ = jobs("ci", **{k: v for k, v in select.items() if k != "inversion_steps"})
    d = job.directory(out)
    d.mkdir(parents=True)
    proc = hold_in_another_process(d)
    try:
        with pytest.raises(RunDirectoryBusy, match="in use by another process"):
            run_job(job, out, inversion_steps=0)
        assert f"running in another process (pid {proc.pid} on " in describe("ci", out, **select)[1]
        lines: list[str] = []
        assert run_study("ci", out, progress=lines.append, **select)[2] == []
        assert any(line.startswith("  skipped: ") and "in use by another process" in line for line in lines), lines
        assert [p.name for p in d.iterdir()] == [LOCK_FILE]
    finally:
        kill(proc)
    rows = run_study("ci", out, **select)[2]
    assert [r["status"] for r in rows] == ["ok"]


@pytest.mark.integration
def test_workers_share_the_jobs_and_each_runs_once(tmp_path):
    """--workers 2: every job of the selection runs in one of the two processes; the tables hold one ok row each."""
    out = tmp_path / "mpdp"
    code, _, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", out, "--seeds", 1, "--rounds", 2,
                       "--methods", "mpdp,fedavg", "--settings", "ci_digits_k100,ci_digits_mlp",
                       "--inversion-steps", 0, "--workers", 2)
    assert code == 0, err
    from dpfl.reproduce.mpdp import jobs

    planned, _ = jobs("ci", seeds=1, methods=["mpdp", "fedavg"], rounds=2,
                      settings_pattern="ci_digits_k100,ci_digits_mlp")
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(planned) == 3 and sorted((r["setting"], r["method"], r["status"]) for r in rows) == sorted(
        (j.setting, j.method, "ok") for j in planned)
    for row in rows:  # one execution per directory: environment.jsonl has one line
        d = out / row["run_dir"]
        assert len((d / "environment.jsonl").read_text().splitlines()) == 1, d
    code, _, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", out, "--seeds", 1, "--rounds", 2,
                       "--methods", "mpdp,fedavg", "--settings", "ci_digits_k100,ci_digits_mlp",
                       "--inversion-steps", 0, "--workers", 2)  # again: every job read back, said in one line
    assert code == 0 and "all 3 jobs finished before" in err, err
    assert list(csv.DictReader((out / "results.csv").open())) == rows
    code, _, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", out, "--workers", 2, "--dry-run")
    assert code == 2 and "--dry-run runs none" in err

"""`dpfl reproduce mpdp` in pieces: --settings, --only-seeds, --dry-run and --tables-only; each job an ordinary run
directory (config.yaml, metrics.jsonl, checkpoint.pt, privacy.json, summary.json) plus comparison.json, its row,
written last; the directories' config check (one --out, one experiment: a directory of another config is refused
before anything runs); and an unfinished job resumed, not run again, to exactly the results of an uninterrupted one.
The same with a real SIGKILL: tests/experiment/test_mpdp_kill_resume.py."""

import csv
import json
import shutil

import pytest

from cli_runner import cli
from untimed import untimed

from dpfl.experiment.config import config_to_yaml, load_config
from dpfl.reproduce.jobs import config_dir

# one setting, one method, one round, no inversion: about 5 s per run
TINY = ("--scale", "ci", "--settings", "ci_digits_mlp", "--methods", "fedavg", "--inversion-steps", 0, "--seeds", 2)
# what a finished job's directory holds: a run directory of the one round loop, and the job's row
JOB_FILES = {"config.yaml", "metrics.jsonl", "checkpoint.pt", "privacy.json", "summary.json", "environment.jsonl",
             "report.md", "plots", "comparison.json"}


class Killed(BaseException):
    """A kill, in process: not an Exception, so that run_job does not record it as a failed run."""


def _rows(out):
    return list(csv.DictReader((out / "results.csv").read_text().splitlines()))


def _metrics(d):
    return [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]


def _json(path):
    return json.loads(path.read_text())


def _killed_study(tmp_path, monkeypatch, name, replacement):
    """The study's one job run with `dpfl.reproduce.mpdp.<name>` replaced by `replacement`, which raises Killed:
    the study's directory and the job's."""
    import dpfl.reproduce.mpdp as mpdp

    out = tmp_path / "mpdp"
    with monkeypatch.context() as m:
        m.setattr(mpdp, name, replacement)
        with pytest.raises(Killed):
            mpdp.run_study("ci", out, **MPDP_JOB)
    return out, out / "runs" / "ci_digits_mlp-eps3" / "mpdp-seed0"


def _started_rounds(d):
    return [json.loads(line)["started_round"] for line in (d / "environment.jsonl").read_text().splitlines()]


def test_seeds_run_in_pieces_and_the_tables_collect_every_finished_one(tmp_path):
    out = tmp_path / "mpdp"
    code, stdout, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--dry-run")
    assert code == 0, err
    assert "mpdp, scale ci: 2 jobs" in stdout and stdout.count(": new") == 2 and not (out / "runs").exists()

    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 1)
    assert code == 0, err
    assert [(r["setting"], r["method"], r["seed"], r["status"]) for r in _rows(out)] == [
        ("ci_digits_mlp", "fedavg", "1", "ok")]
    assert "1 of the grid's 2 runs" in (out / "results.md").read_text()
    run = out / "runs" / "ci_digits_mlp" / "fedavg-seed1"
    assert {p.name for p in run.iterdir()} == JOB_FILES
    saved = load_config(run / "config.yaml")  # a run config: FedSGD, no privacy, at this seed and length
    assert (saved.algorithm.name, saved.privacy.mechanism, saved.privacy.clip) == ("fedsgd", "none", None)
    assert (saved.seed, saved.training.rounds, saved.model.name) == (1, 1, "mpdp_mlp")
    row = _json(run / "comparison.json")  # the job's row: results.csv's, with the inversion steps it was made with
    assert row["inversion_steps"] == 0 and row["run_dir"] == "runs/ci_digits_mlp/fedavg-seed1"
    assert row["accuracy"] == _json(run / "summary.json")["final_accuracy"] == _metrics(run)[-1]["test_accuracy"]

    code, stdout, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--dry-run")
    assert code == 0, err
    assert "fedavg seed 0: new" in stdout and "fedavg seed 1: finished" in stdout

    mtimes = {name: (run / name).stat().st_mtime_ns for name in ("summary.json", "comparison.json", "privacy.json")}
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 0)
    assert code == 0, err
    assert {name: (run / name).stat().st_mtime_ns for name in mtimes} == mtimes  # seed 1 collected, not run again
    assert sorted(r["seed"] for r in _rows(out)) == ["0", "1"]
    assert "of the grid's" not in (out / "results.md").read_text()

    (out / "results.csv").unlink()
    code, stdout, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--tables-only")
    assert code == 0, err
    assert sorted(r["seed"] for r in _rows(out)) == ["0", "1"]
    assert {name: (run / name).stat().st_mtime_ns for name in mtimes} == mtimes


def test_each_job_runs_the_config_dpfl_run_makes_of_its_file():
    """A job's config.yaml is exactly what `dpfl run <its config> --set ...` runs: its method's algorithm with the
    threat model that algorithm has (mp_cdp: mpdp_central; FedSGD: none, no clip), not the setting's MP-DP one."""
    from dpfl.reproduce.mpdp import jobs

    todo, _ = jobs("ci", seeds=1, rounds=2, settings_pattern="ci_digits_mlp-eps30,ci_digits_mlp,ci_digits_k100")
    assert {j.method for j in todo} == {"mpdp", "mpdp_oracle_clip", "mpdp_naive", "mp_cdp", "fedavg"}
    extra = {"mpdp_oracle_clip": ["algorithm.params.clip_mode=oracle_true"], "fedavg": ["privacy.clip=null"]}
    algorithm = {"mpdp_oracle_clip": "mpdp", "fedavg": "fedsgd"}
    mechanisms = {}
    for job in todo:
        file = config_dir("mpdp") / f"{job.setting.split('-eps')[0]}.yaml"
        eps = job.setting.split("-eps")[1] if "-eps" in job.setting else "3.0"
        user = load_config(file, ["training.rounds=2", f"algorithm.params.epsilon={float(eps)!r}", f"seed={job.seed}",
                                  f"algorithm.name={algorithm.get(job.method, job.method)}",
                                  *extra.get(job.method, [])])
        assert config_to_yaml(job.run_config()) == config_to_yaml(user), (job.setting, job.method)
        mechanisms[job.method] = job.run_config().privacy.mechanism
    assert mechanisms == {"mpdp": "mpdp", "mpdp_oracle_clip": "mpdp", "mpdp_naive": "mpdp", "mp_cdp": "mpdp_central",
                          "fedavg": "none"}


def test_a_directory_of_another_config_is_refused_before_anything_runs(tmp_path):
    out = tmp_path / "mpdp"
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 1)
    assert code == 0, err
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 2, "--out", out)
    assert code == 2 and "holds another run" in err and "saved 'rounds: 1', this job 'rounds: 2'" in err, err
    assert not (out / "runs" / "ci_digits_mlp" / "fedavg-seed0").exists()  # seed 0 (new) did not run either
    code, _, err = cli("reproduce", "mpdp", *TINY[:-4], "--inversion-steps", 3, "--seeds", 2, "--rounds", 1,
                       "--out", out)
    assert code == 2 and "inversion_steps 0, this job 3" in err, err

    run = out / "runs" / "ci_digits_mlp" / "fedavg-seed1"
    (run / "comparison.json").unlink()  # unfinished, and of another config: refused too, not resumed
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 2, "--out", out, "--only-seeds", 1)
    assert code == 2 and "holds another run" in err, err
    assert _started_rounds(run) == [0] and len(_metrics(run)) == 1

    (run / "config.yaml").unlink()  # as a run made before dpfl saved the config
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--tables-only")
    assert code == 2 and "cannot be checked" in err, err


MPDP_JOB = dict(seeds=1, methods=["mpdp"], rounds=3, settings_pattern="ci_digits_mlp-eps3", inversion_steps=0)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The MP-DP job of MPDP_JOB run without interruption: (its directory, its row)."""
    from dpfl.reproduce.mpdp import run_study

    out = tmp_path_factory.mktemp("uninterrupted")
    (row,) = run_study("ci", out, **MPDP_JOB)[2]
    assert row["status"] == "ok", row
    return out / row["run_dir"], row


def _assert_same_job(d, row, ref_dir, ref_row):
    """The same results as the uninterrupted job: metrics rows, privacy.json (the stage block, the client attacks),
    final model and row, timing aside."""
    import torch

    assert untimed(_metrics(d)) == untimed(_metrics(ref_dir))
    privacy, ref_privacy = _json(d / "privacy.json"), _json(ref_dir / "privacy.json")
    assert privacy["stage"]["guarantee"] == "nominal" and privacy["model_hiding"] and privacy["membership"]
    assert privacy["stage"] == ref_privacy["stage"] and untimed(privacy) == untimed(ref_privacy)
    params = torch.load(d / "checkpoint.pt", weights_only=True)["params"]
    ref_params = torch.load(ref_dir / "checkpoint.pt", weights_only=True)["params"]
    assert list(params) == list(ref_params) and all(torch.equal(params[k], ref_params[k]) for k in params)
    assert untimed(row) == untimed(ref_row) == untimed(_json(d / "comparison.json"))


def test_an_unfinished_job_resumes_from_its_checkpoint_to_the_uninterrupted_results(tmp_path, monkeypatch,
                                                                                     uninterrupted):
    """Killed in round 2 (its row logged, the checkpoint still round 1's): --dry-run says it resumes, and the next
    invocation continues it from round 1, not from the start, to the results of the uninterrupted job."""
    import dpfl.reproduce.mpdp as mpdp

    execute = mpdp.execute

    def killed_in_round_2(*args, **kwargs):
        def on_round(row):
            if row["round"] == 2:
                raise Killed
        return execute(*args, **kwargs, on_round=on_round)

    out, d = _killed_study(tmp_path, monkeypatch, "execute", killed_in_round_2)
    assert not (d / "summary.json").exists() and not (d / "comparison.json").exists()
    assert len(_metrics(d)) == 2  # round 2's row, past the checkpoint: cut back on resume
    assert mpdp.describe("ci", out, **MPDP_JOB)[1] == ("ci_digits_mlp-eps3 mpdp seed 0: partial: resumes from its last "
                                                      "checkpoint")

    (row,) = mpdp.run_study("ci", out, **MPDP_JOB)[2]
    assert row["status"] == "ok", row
    assert _started_rounds(d) == [0, 1]  # resumed after round 1, not run again from round 0
    _assert_same_job(d, row, *uninterrupted)
    assert mpdp.describe("ci", out, **MPDP_JOB)[1].endswith(": finished")


def test_a_job_killed_after_its_training_only_computes_its_row(tmp_path, monkeypatch, uninterrupted):
    """Killed after summary.json, before comparison.json: the next invocation trains nothing (metrics.jsonl and
    environment.jsonl untouched) and writes the inversion and the row, the uninterrupted job's."""
    import dpfl.reproduce.mpdp as mpdp

    def killed(*args, **kwargs):
        raise Killed

    out, d = _killed_study(tmp_path, monkeypatch, "_finish_job", killed)
    assert (d / "summary.json").is_file() and not (d / "comparison.json").exists()
    assert "inversion" not in _json(d / "privacy.json")
    assert mpdp.describe("ci", out, **MPDP_JOB)[1].endswith(": partial: trained; the server's inversion and the row "
                                                            "remain")
    metrics = (d / "metrics.jsonl").read_bytes()

    (row,) = mpdp.run_study("ci", out, **MPDP_JOB)[2]
    assert row["status"] == "ok", row
    assert (d / "metrics.jsonl").read_bytes() == metrics and _started_rounds(d) == [0]  # nothing trained again
    assert _json(d / "privacy.json")["inversion"] == {"skipped": "--inversion-steps 0"}
    _assert_same_job(d, row, *uninterrupted)


def test_a_job_that_failed_before_its_run_started_runs_on_the_next_invocation(tmp_path, monkeypatch):
    """A job whose run could not even be built (here: out of memory) leaves only error.txt; the next invocation runs
    it (it used to be refused for ever: 'already exists and is not empty'), and the stale error.txt goes."""
    import dpfl.experiment.run_directory as run_directory
    from dpfl.reproduce.mpdp import run_study

    def out_of_memory(cfg):
        raise MemoryError("out of memory while building the run")

    out = tmp_path / "mpdp"
    with monkeypatch.context() as m:
        m.setattr(run_directory, "build_run", out_of_memory)
        (row,) = run_study("ci", out, seeds=1, methods=["fedavg"], rounds=1, settings_pattern="ci_digits_mlp",
                           inversion_steps=0)[2]
    assert row["status"] == "failed: out of memory while building the run"
    d = out / "runs" / "ci_digits_mlp" / "fedavg-seed0"
    assert {p.name for p in d.iterdir()} == {"error.txt"}

    (row,) = run_study("ci", out, seeds=1, methods=["fedavg"], rounds=1, settings_pattern="ci_digits_mlp",
                       inversion_steps=0)[2]
    assert row["status"] == "ok", row
    assert {p.name for p in d.iterdir()} == JOB_FILES


@pytest.mark.parametrize("finished", [True, False])
def test_a_new_job_another_process_started_meanwhile_is_not_a_failure(tmp_path, monkeypatch, finished):
    """This process finds the job new, and while it builds the run another process starts it (here: its directory
    appears, finished or not): its row is read back when finished, else left to that process (no row, a line), and
    nothing is written into its directory. It used to be a failed row, with error.txt written into the other
    process's run."""
    import dpfl.experiment.run_directory as run_directory
    from dpfl.reproduce.mpdp import run_study

    select = dict(seeds=1, methods=["fedavg"], rounds=1, settings_pattern="ci_digits_mlp", inversion_steps=0)
    other = tmp_path / "other"
    (other_row,) = run_study("ci", other, **select)[2]
    source = other / other_row["run_dir"]
    if not finished:
        (source / "comparison.json").unlink()
    out = tmp_path / "mpdp"
    d = out / other_row["run_dir"]
    build_run = run_directory.build_run

    def meanwhile(cfg):
        shutil.copytree(source, d)
        return build_run(cfg)

    lines: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(run_directory, "build_run", meanwhile)
        rows = run_study("ci", out, progress=lines.append, **select)[2]
    assert {p.name for p in d.iterdir()} == {p.name for p in source.iterdir()}  # nothing added, no error.txt
    if finished:
        assert rows == [other_row]
    else:
        assert rows == [] and any(line.startswith("  skipped: ") and "another process started this job" in line
                                  for line in lines), lines


def test_bad_selections_are_one_line(tmp_path, monkeypatch):
    code, _, err = cli("reproduce", "mpdp", *TINY, "--out", tmp_path, "--only-seeds", 5)
    assert code == 2 and "seed 5 is not among the planned seeds 0..1" in err
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "no-data"))  # no CIFAR files: every full setting is skipped
    code, _, err = cli("reproduce", "mpdp", "--scale", "full", "--out", tmp_path, "--only-seeds", 0)
    assert code == 2 and "plans no run" in err, err
    monkeypatch.undo()
    code, _, err = cli("reproduce", "mpdp", "--scale", "ci", "--out", tmp_path, "--settings", "nope*")
    assert code == 2 and "matches no setting" in err and "ci_digits_k100" in err
    code, _, err = cli("reproduce", "mpdp", *TINY, "--out", tmp_path, "--tables-only")
    assert code == 2 and "no finished run" in err
    code, _, err = cli("reproduce", "mpdp", *TINY, "--out", tmp_path, "--tables-only", "--dry-run")
    assert code == 2 and "choose one" in err
    code, _, err = cli("reproduce", "mpdp", *TINY, "--out", tmp_path, "--tables-only", "--only-seeds", 0)
    assert code == 2 and "--tables-only trains none" in err


def test_an_unverified_epsilon_keeps_its_stamp_in_the_tables():
    from dpfl.reproduce.mpdp import COLUMNS, markdown

    assert "epsilon_label" in COLUMNS  # the CSV carries each run's label, stamps included
    stamp = "UNVERIFIED: Theorem 11 conditions violated (K = 100 too small)"
    row = {"status": "ok", "method": "mpdp", "accuracy": 0.5, "round_seconds": 1.0, "server_seconds": 0.1,
           "client_seconds": 0.01, "upload_bytes": 100, "violation_rate": 0.0, "epsilon_composed": 30.0}
    rows = [{**row, "setting": "paper", "epsilon_label": f"NOMINAL (idealised model); {stamp}"},
            {**row, "setting": "verified", "epsilon_label": "NOMINAL (idealised model)"}]
    md = markdown("full", rows, {}, "", "")
    paper, verified = md.split("## paper")[1].split("## verified")
    assert paper.startswith(" (epsilons UNVERIFIED)") and f"**{stamp}**" in paper
    assert "UNVERIFIED" not in verified


@pytest.mark.integration  # starts two worker processes (~17 s)
def test_workers_on_one_seed_keep_the_other_seeds_finished_rows_in_grid_order(tmp_path):
    """--only-seeds 1 --workers 2 after seed 0 ran alone: seed 1 runs in the workers, seed 0 (not selected) is read
    back, and the tables list both in the grid's order, seed 0 first."""
    out = tmp_path / "mpdp"
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 0)
    assert code == 0, err
    comparison = out / "runs" / "ci_digits_mlp" / "fedavg-seed0" / "comparison.json"
    mtime = comparison.stat().st_mtime_ns
    code, _, err = cli("reproduce", "mpdp", *TINY, "--rounds", 1, "--out", out, "--only-seeds", 1, "--workers", 2)
    assert code == 0, err
    assert [(r["seed"], r["status"]) for r in _rows(out)] == [("0", "ok"), ("1", "ok")]
    assert comparison.stat().st_mtime_ns == mtime  # seed 0 read back, not run again
    for seed in (0, 1):  # one execution each
        assert _started_rounds(out / "runs" / "ci_digits_mlp" / f"fedavg-seed{seed}") == [0]
    assert "of the grid's" not in (out / "results.md").read_text()

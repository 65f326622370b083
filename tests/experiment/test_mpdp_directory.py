"""`dpfl run` on an MP-DP config (scheme: mpdp): a complete run directory, the guarantee with its label, one-line
errors, no resume, nothing written on a bad config or into a directory another process holds."""

import json
import shutil

import yaml
from cli_runner import cli
from lock_holder import hold_in_another_process, kill

from dpfl.experiment.mpdp_directory import is_mpdp_config
from dpfl.experiment.run_lock import LOCK_FILE
from dpfl.reproduce.jobs import config_dir


def test_run_writes_the_run_directory_and_prints_the_nominal_guarantee(tmp_path):
    out = tmp_path / "run"
    code, stdout, err = cli("run", config_dir("mpdp") / "ci_digits_mlp.yaml", "--set", "rounds=3", "--set",
                            "eval_every=1", "--out", out)
    assert code == 0, err
    assert {p.name for p in out.iterdir()} == {"config.yaml", "metrics.jsonl", "privacy.json", "summary.json",
                                                 "environment.jsonl", LOCK_FILE}
    privacy = json.loads((out / "privacy.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert privacy["guarantee"] == "nominal" and privacy["in_ledger"] is False
    assert "NOMINAL, per round and client eps = 3" in stdout and privacy["label"] in stdout
    m = privacy["membership"]  # the client attacks, as measured, are printed from privacy.json
    assert (f"ASR {m['plain']['asr']:.3f} on the model as received, {m['adaptive']['asr']:.3f} after demasking"
            in stdout)
    assert summary["method"] == "mpdp" and summary["rounds_done"] == 3
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    assert yaml.safe_load((out / "config.yaml").read_text())["rounds"] == 3  # the run's config, overrides applied
    code, _, err = cli("run", config_dir("mpdp") / "ci_digits_mlp.yaml", "--out", out)
    assert code == 2 and "already exists" in err  # a finished run is never overwritten
    code, _, err = cli("run", config_dir("mpdp") / "ci_digits_mlp.yaml", "--out", out, "--resume")
    assert code == 2 and "keep no checkpoints" in err


def test_mp_cdp_prints_its_accounted_epsilon(tmp_path):
    code, stdout, err = cli("run", config_dir("mpdp") / "ci_digits_mlp.yaml", "--set", "rounds=2", "--set",
                            "method=mp_cdp", "--out", tmp_path / "cdp")
    assert code == 0, err
    privacy = json.loads((tmp_path / "cdp" / "privacy.json").read_text())
    assert f"eps = {privacy['epsilon_total']:.4g}" in stdout and privacy["accountant"] == "rdp"
    assert f"ASR {privacy['membership']['plain']['asr']:.3f} on the global model" in stdout


def test_tp_smc_runs_as_a_user_runs_it_and_prints_its_assumption(tmp_path):
    """`dpfl run ... --set method=tp_smc` (small keys and model: the encryption is per weight)."""
    code, stdout, err = cli("run", config_dir("mpdp") / "ci_digits_mlp.yaml", "--set", "rounds=1", "--set",
                            "method=tp_smc", "--set", "hidden=[6]", "--set", "tpsmc_key_bits=128",
                            "--out", tmp_path / "tpsmc")
    assert code == 0, err
    privacy = json.loads((tmp_path / "tpsmc" / "privacy.json").read_text())
    assert privacy["accountant"] == "rdp" and privacy["key_bits"] == 128
    assert "TP-SMC (threshold Paillier)" in stdout and f"eps = {privacy['epsilon_total']:.4g}" in stdout
    assert "ASSUMING at least h = 5 of the 5 clients are honest" in stdout


def test_bad_mpdp_configs_are_one_line_and_write_nothing(tmp_path):
    path = tmp_path / "c.yaml"
    shutil.copy(config_dir("mpdp") / "ci_digits_mlp.yaml", path)
    assert is_mpdp_config(path)
    for sets, match in ((["method=magic"], "method: not an allowed value"),
                        (["dropout=0.2"], "dropout: with dropout_policy abort"),
                        (["rounds"], "expected field=value")):
        args = [a for s in sets for a in ("--set", s)]
        code, _, err = cli("run", path, *args, "--out", tmp_path / "x")
        assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_a_directory_another_process_holds_is_refused_and_a_lone_lock_file_is_not(tmp_path):
    """Two `dpfl run` of one MP-DP config into one --out: the second is refused at once and writes nothing (it would
    otherwise run too and overwrite the first's files at its end). The lock file a failed run leaves is no obstacle."""
    out = tmp_path / "run"
    out.mkdir()
    args = ("run", config_dir("mpdp") / "ci_digits_mlp.yaml", "--set", "rounds=1", "--out", out)
    proc = hold_in_another_process(out)
    try:
        code, _, err = cli(*args)
        assert code == 2 and err.count("\n") == 1 and f"in use by another process (pid {proc.pid} on " in err, err
        assert [p.name for p in out.iterdir()] == [LOCK_FILE]
    finally:
        kill(proc)
    code, _, err = cli(*args)
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["rounds_done"] == 1

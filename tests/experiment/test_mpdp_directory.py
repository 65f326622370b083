"""`dpfl run` on an MP-DP config: a run config like any other (configs/mpdp/*.yaml), run by the one round loop into an
ordinary run directory (config.yaml, metrics.jsonl, checkpoint.pt, privacy.json, summary.json, report), privacy.json
holding the method's own statement (`stage`: NOMINAL for MP-DP) and what a curious client's attacks measured, and
the outcome printed from it. An old flat config (`scheme: mpdp`) is converted with one note and runs the same; its flat
`--set`s are refused with the new spelling. One-line errors; nothing written on a bad config or into a directory
another process holds. A killed run resumes exactly: tests/experiment/test_mpdp_kill_resume.py."""

import json
import shutil

import pytest
import torch
import yaml
from cli_runner import cli
from lock_holder import hold_in_another_process, kill
from untimed import untimed

from dpfl.experiment.config import config_to_dict, load_config
from dpfl.experiment.run_lock import LOCK_FILE
from dpfl.reproduce.jobs import config_dir

CONFIG = config_dir("mpdp") / "ci_digits_mlp.yaml"
RUN_FILES = {"config.yaml", "metrics.jsonl", "checkpoint.pt", "privacy.json", "summary.json", "environment.jsonl",
             "report.md", "plots"}  # no LOCK_FILE: a run that ends removes it



# configs/mpdp/ci_digits_mlp.yaml in the old flat schema, as it was until commit 30b229a (`git show
# 30b229a:configs/mpdp/ci_digits_mlp.yaml`), verbatim
OLD_CONFIG = """\
# MP-DP at ci scale (spec bidirectional.md §11): scikit-learn's digits, a bias-free MLP 64-64-32-10 trained with MSE
# on one-hot targets, K = 5 clients on a complete graph (Theorem 10), FedSGD with batch 32, 30 rounds,
# epsilon 3 per round (NOMINAL), delta 1e-5, sigma_Delta = 10 x its admissible minimum.
#   dpfl reproduce mpdp --scale ci --out runs/mpdp-ci     (every method, 2 seeds, several epsilons)
#   dpfl run configs/mpdp/ci_digits_mlp.yaml --set method=mpdp --set clip_mode=oracle_true   (one run)
scheme: mpdp
name: ci_digits_mlp
seed: 0
dataset: digits
hidden: [64, 32]
clients: 5
rounds: 30
batch_size: 32
lr: 0.3
epsilon: 3.0
delta: 1.0e-5
graph: complete
clip: 1.0
eval_every: 5
"""


@pytest.fixture(scope="module")
def old_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("old") / "ci_digits_mlp.yaml"
    path.write_text(OLD_CONFIG)
    assert yaml.safe_load(path.read_text())["scheme"] == "mpdp"
    return path


@pytest.fixture(scope="module")
def new_run(tmp_path_factory):
    """`dpfl run configs/mpdp/ci_digits_mlp.yaml --set training.rounds=2`: (its directory, stdout, stderr)."""
    out = tmp_path_factory.mktemp("new") / "run"
    code, stdout, err = cli("run", CONFIG, "--set", "training.rounds=2", "--out", out)
    assert code == 0, err
    return out, stdout, err


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _json(path):
    return json.loads(path.read_text())


def test_run_writes_the_run_directory_and_prints_the_nominal_guarantee(new_run):
    out, stdout, _ = new_run
    assert {p.name for p in out.iterdir()} == RUN_FILES
    privacy, summary = _json(out / "privacy.json"), _json(out / "summary.json")
    stage = privacy["stage"]  # MP-DP states its own guarantee: NOMINAL, never in dpfl's ledger
    assert privacy["algorithm"] == "mpdp" and privacy["accounted"] is False
    assert stage["guarantee"] == "nominal" and stage["in_ledger"] is False and stage["per_round_epsilon"] == 3.0
    assert stage["theorem"] == "Theorem 10 (complete graph)"
    assert [c["composed"]["epsilon"] for c in stage["per_client"]] == [6.0] * 5  # 2 rounds, basic composition
    hiding, membership = privacy["model_hiding"], privacy["membership"]  # a curious client's attacks, as measured
    assert 0 <= hiding["perturbed_accuracy"] <= 1 and 0 <= hiding["demasked_accuracy"] <= 1
    assert 0 <= membership["plain"]["asr"] <= 1 and 0 <= membership["adaptive"]["asr"] <= 1
    # the outcome states the NOMINAL guarantee, with its label, and what the attacks found, from privacy.json
    assert "method: MP-DP" in stdout
    assert f"guarantee: NOMINAL, per round and client eps = 3, delta = 1e-05 ({stage['label']})" in stdout
    assert "composed over the run per client (nominal, basic): eps from 6 to 6" in stdout
    assert (f"{hiding['perturbed_accuracy']:.3f} as received, {hiding['demasked_accuracy']:.3f} after it demasked"
            in stdout)
    assert (f"ASR {membership['plain']['asr']:.3f} on the model as received, {membership['adaptive']['asr']:.3f} "
            "after demasking" in stdout)
    assert "accountant" not in stdout and "spent" not in stdout  # no accounted epsilon is claimed
    assert summary["rounds_done"] == 2 and summary["epsilon_max"] is None
    assert [row["round"] for row in _metrics(out)] == [1, 2]
    saved = load_config(out / "config.yaml")  # the run config that ran, the override applied
    assert config_to_dict(saved) == config_to_dict(load_config(CONFIG, ["training.rounds=2"]))
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["round"] == 2 and state["aggregator_state"]["secrets"] is None  # the secrets are never stored
    assert state["aggregator_state"]["view"]["round_id"] == 1  # round 2's broadcast (0-based), which the attacks read


def test_a_finished_run_is_not_overwritten_and_resuming_it_trains_nothing(new_run, tmp_path):
    out, _, _ = new_run
    code, _, err = cli("run", CONFIG, "--set", "training.rounds=2", "--out", out)
    assert code == 2 and "already exists" in err and "finished run" in err
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = {name: (copy / name).read_bytes() for name in ("metrics.jsonl", "privacy.json", "summary.json")}
    code, stdout, err = cli("run", CONFIG, "--set", "training.rounds=2", "--out", copy, "--resume")
    assert code == 0, err
    assert {name: (copy / name).read_bytes() for name in before} == before and "NOMINAL" in stdout


def test_a_checkpoint_without_the_server_steps_state_is_refused(new_run, tmp_path):
    """MP-DP's server step keeps explicit state (the last broadcast): a checkpoint without it, or with another
    step's, is not this run's, and a resume says so before changing anything."""
    out, _, _ = new_run
    for state, why in ((None, "it holds no aggregator state"), ({"noise": torch.zeros(3)}, "does not fit")):
        d = tmp_path / f"broken-{why[:6]}"
        shutil.copytree(out, d)
        for name in ("summary.json", "privacy.json"):
            (d / name).unlink()
        checkpoint = torch.load(d / "checkpoint.pt", weights_only=True)
        torch.save({**checkpoint, "aggregator_state": state}, d / "checkpoint.pt")
        before = (d / "checkpoint.pt").read_bytes()
        code, _, err = cli("run", CONFIG, "--set", "training.rounds=2", "--out", d, "--resume")
        assert code == 2 and "does not belong to this run" in err and why in err, err
        assert (d / "checkpoint.pt").read_bytes() == before and not (d / "summary.json").exists()


def test_an_old_flat_config_is_converted_with_one_note_and_runs_the_same(new_run, old_config, tmp_path):
    out, _, _ = new_run
    old = tmp_path / "old"
    code, stdout, err = cli("run", old_config, "--set", "training.rounds=2", "--out", old)
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and err.count("old flat schema") == 1, err
    assert f"{old_config} is an MP-DP config in the old flat schema (scheme: mpdp)" in notes[0]
    assert (old / "config.yaml").read_text() == (out / "config.yaml").read_text()  # the same run config ran
    assert untimed(_metrics(old)) == untimed(_metrics(out))
    privacy, reference = _json(old / "privacy.json"), _json(out / "privacy.json")
    assert privacy["stage"] == reference["stage"] and untimed(privacy) == untimed(reference)
    assert "guarantee: NOMINAL, per round and client eps = 3" in stdout


def test_the_converted_old_config_is_the_shipped_run_config(old_config):
    with pytest.warns(FutureWarning, match="old flat schema"):  # load_config without a notice callback warns
        converted = config_to_dict(load_config(old_config))
    shipped = config_to_dict(load_config(CONFIG))
    converted.pop("name"), shipped.pop("name")
    assert converted == shipped


def test_flat_overrides_of_an_old_config_are_refused_with_the_new_spelling(old_config, tmp_path):
    """`--set rounds=2` on an old config is refused, naming the run config's field; for the method, the algorithm it
    converts to (fedavg: FedSGD, which clips nothing), a spelling that gives the config the old field gave."""
    for flat, new in (("rounds=2", "training.rounds=2"), ("method=mp_cdp", "algorithm.name=mp_cdp"),
                      ("method=fedavg", "algorithm.name=fedsgd --set privacy.clip=null"),
                      ("hidden=[6]", "model.options.hidden=[6]"), ("clip_mode=oracle_true",
                                                                   "algorithm.params.clip_mode=oracle_true")):
        code, _, err = cli("run", old_config, "--set", flat, "--out", tmp_path / "x")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.strip() == f"error: --set {flat}: MP-DP configs are run configs now: write --set {new}", err
    assert not (tmp_path / "x").exists()
    fedavg = tmp_path / "fedavg.yaml"  # the old field, in the file
    fedavg.write_text(old_config.read_text() + "method: fedavg\n")
    with pytest.warns(FutureWarning):
        flat = load_config(fedavg)
        hinted = load_config(old_config, ["algorithm.name=fedsgd", "privacy.clip=null"])
    assert config_to_dict(flat) == config_to_dict(hinted) and flat.algorithm.name == "fedsgd"


def test_mp_cdp_prints_its_accounted_epsilon(tmp_path):
    code, stdout, err = cli("run", CONFIG, "--set", "training.rounds=2", "--set", "algorithm.name=mp_cdp",
                            "--out", tmp_path / "cdp")
    assert code == 0, err
    privacy = _json(tmp_path / "cdp" / "privacy.json")
    stage = privacy["stage"]
    assert stage["accountant"] == "rdp" and stage["guarantee"].startswith("accounted (trusted server")
    assert "method: MP-CDP (trusted server)" in stdout and "NOMINAL" not in stdout
    assert (f"guarantee: per client, eps = {stage['epsilon_total']:.4g} at delta = 1e-05 over 2 rounds, "
            f"{stage['guarantee']}; accountant rdp") in stdout
    assert "model_hiding" not in privacy  # the clients receive the model in the clear
    assert f"ASR {privacy['membership']['plain']['asr']:.3f} on the global model" in stdout


def test_tp_smc_runs_as_a_user_runs_it_and_prints_its_assumption(tmp_path):
    """`dpfl run ... --set algorithm.name=tp_smc` (small keys and model: the encryption is per weight)."""
    code, stdout, err = cli("run", CONFIG, "--set", "training.rounds=1", "--set", "algorithm.name=tp_smc",
                            "--set", "model.options.hidden=[6]", "--set", "algorithm.params.tpsmc_key_bits=128",
                            "--out", tmp_path / "tpsmc")
    assert code == 0, err
    stage = _json(tmp_path / "tpsmc" / "privacy.json")["stage"]
    assert stage["accountant"] == "rdp" and stage["key_bits"] == 128
    assert "TP-SMC (threshold Paillier)" in stdout and f"eps = {stage['epsilon_total']:.4g}" in stdout
    assert "ASSUMING at least h = 5 of the 5 clients are honest" in stdout


def test_bad_mpdp_configs_are_one_line_and_write_nothing(tmp_path):
    for sets, match in ((["algorithm.name=magic"], "algorithm.name: not an allowed value"),
                        (["algorithm.params.dropout=0.2"], "dropout: with dropout_policy abort"),
                        (["algorithm.params.graph=n_out"], "n is required by graph n_out"),
                        (["rounds"], "expected FIELD.PATH=VALUE")):
        args = [a for s in sets for a in ("--set", s)]
        code, _, err = cli("run", CONFIG, *args, "--out", tmp_path / "x")
        assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_a_directory_another_process_holds_is_refused_and_a_lone_lock_file_is_not(tmp_path):
    """Two `dpfl run` of one MP-DP config into one --out: the second is refused at once and writes nothing. The lock
    file a failed run leaves is no obstacle."""
    out = tmp_path / "run"
    out.mkdir()
    args = ("run", CONFIG, "--set", "training.rounds=1", "--out", out)
    proc = hold_in_another_process(out)
    try:
        code, _, err = cli(*args)
        assert code == 2 and err.count("\n") == 1 and f"in use by another process (pid {proc.pid} on " in err, err
        assert [p.name for p in out.iterdir()] == [LOCK_FILE]
    finally:
        kill(proc)
    code, _, err = cli(*args)
    assert code == 0, err
    assert _json(out / "summary.json")["rounds_done"] == 1

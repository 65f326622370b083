"""The `dpfl` command driven as a user drives it: in-process for speed, and as real processes where
signals and the installed entry point matter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpfl.privacy.accountant import epsilon
from dpfl.privacy.events import dpsgd_event
from cli_runner import cli
from untimed import untimed

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"




def small_config(tmp_path: Path, rounds: int = 4, **changes) -> Path:
    cfg = yaml.safe_load(DEMO_CONFIG.read_text())
    cfg["name"] = changes.pop("name", "small")
    cfg["training"]["rounds"] = rounds
    cfg["evaluation"] = {"every": 1}
    for dotted, value in changes.items():
        node = cfg
        *head, last = dotted.split("__")
        for key in head:
            node = node[key]
        node[last] = value
    path = tmp_path / f"{cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _assert_one_line_error(code: int, err: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


# ---- privacy --------------------------------------------------------------------------------------
def test_privacy_epsilon_json_matches_the_accountant():
    code, out, _ = cli("privacy", "epsilon", "--noise-multiplier", "1.1", "--sample-rate", "0.01", "--steps", "500",
                       "--delta", "1e-5", "--json")
    assert code == 0
    got = json.loads(out)
    assert got["epsilon"] == pytest.approx(epsilon(dpsgd_event(1.1, 500, sampling="poisson", sample_rate=0.01), 1e-5))
    assert got["accountant"] == "rdp" and got["relation"] == "add_remove"


def test_privacy_noise_json_meets_the_target():
    code, out, _ = cli("privacy", "noise", "--epsilon", "2", "--delta", "1e-5", "--sample-rate", "0.02", "--steps",
                       "300", "--json")
    assert code == 0
    got = json.loads(out)
    assert 0.999 * 2 <= got["epsilon"] <= 2
    assert epsilon(dpsgd_event(got["noise_multiplier"], 300, sampling="poisson", sample_rate=0.02), 1e-5) <= 2


@pytest.mark.parametrize("args", [
    ["privacy", "epsilon", "--noise-multiplier", "abc", "--sample-rate", "0.1", "--steps", "1", "--delta", "1e-5"],
    ["privacy", "epsilon", "--noise-multiplier", "1", "--sample-rate", "2", "--steps", "1", "--delta", "1e-5"],
    ["privacy", "noise", "--epsilon", "-1", "--sample-rate", "0.1", "--steps", "1", "--delta", "1e-5"],
    ["privacy", "noise", "--epsilon", "1", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5",
     "--accountant", "moments"],
    ["no-such-command"],
    ["run", "does/not/exist.yaml"],
    ["report", "not-a-run-dir"],
])
def test_bad_arguments_give_one_line_and_exit_2(args):
    _assert_one_line_error(*cli(*args)[::2])


@pytest.mark.parametrize("abort", ["typer", "click"])
def test_an_abort_says_aborted_and_exits_130(monkeypatch, abort):
    """Ctrl-C at a prompt raises click's Abort (typer's is the same class or a subclass): one word, exit 130."""
    import typer

    import dpfl.cli

    try:
        from typer._click import exceptions as click_errors
    except ImportError:
        from click import exceptions as click_errors
    error = typer.Abort if abort == "typer" else click_errors.Abort

    def aborting(**_):
        raise error()

    monkeypatch.setattr(dpfl.cli, "app", aborting)
    code, out, err = cli("data", "list")
    assert (code, out, err.strip()) == (130, "", "aborted")


# ---- data -----------------------------------------------------------------------------------------
def test_data_list_json_shows_the_embedded_dataset():
    code, out, _ = cli("data", "list", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)["datasets"]}
    assert rows["digits"]["source"] != "missing"
    assert {"fashion_mnist", "mnist", "cifar10"} <= set(rows)


# ---- run, report, compare -------------------------------------------------------------------------
def test_run_writes_a_complete_run_directory_and_report_and_compare_read_it(tmp_path):
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    assert cli("run", small_config(tmp_path), "--out", out_a)[0] == 0
    code, _, err = cli("run", small_config(tmp_path), "--out", out_b, "--set", "training.rounds=2", "--set", "name=b")
    assert code == 0, err
    for name in ("config.yaml", "metrics.jsonl", "privacy.json", "summary.json", "report.md"):
        assert (out_a / name).exists(), name
    metrics = [json.loads(line) for line in (out_a / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in metrics] == [1, 2, 3, 4]
    privacy = json.loads((out_a / "privacy.json").read_text())
    assert all(c["epsilon_spent"] <= c["epsilon_budget"] for c in privacy["clients"])
    assert metrics[-1]["epsilon"] == [c["epsilon_spent"] for c in privacy["clients"]]
    assert json.loads((out_b / "summary.json").read_text())["rounds_done"] == 2
    assert yaml.safe_load((out_b / "config.yaml").read_text())["training"]["rounds"] == 2

    (out_a / "report.md").unlink()
    assert cli("report", out_a)[0] == 0
    report = (out_a / "report.md").read_text()
    for png in (out_a / "plots").glob("*.png"):
        assert f"plots/{png.name}" in report and png.stat().st_size > 0

    code, out, _ = cli("compare", out_a, out_b, "--out", tmp_path, "--json")
    assert code == 0
    rows = json.loads(out)["runs"]
    assert len(rows) == 2 and Path(json.loads(out)["plot"]).exists()
    code, out, _ = cli("compare", out_a, out_b, "--out", tmp_path, "--label", "four rounds", "--label", "two",
                       "--title", "four rounds against two")
    assert code == 0
    header, _, first, second = out.splitlines()[:4]
    assert header.split()[:2] == ["label", "name"] and first.startswith("four rounds ") and second.startswith("two ")
    code, _, err = cli("compare", out_a, out_b, "--label", "only one")
    _assert_one_line_error(code, err)
    assert "1 label(s) for 2 run directories" in err

    # an existing run directory is never overwritten
    _assert_one_line_error(*cli("run", small_config(tmp_path), "--out", out_a)[::2])


def test_demo_runs_and_prints_per_client_epsilon(tmp_path):
    code, out, err = cli("demo", "--out", tmp_path / "demo")
    assert code == 0, err
    assert "spent ε" in out and "run directory" in out
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    assert summary["rounds_done"] == 30 and summary["final_accuracy"] > 0.6


@pytest.mark.integration  # subprocesses, one SIGKILLed (~25 s); tests/experiment/test_fdp_resume.py resumes in process
def test_a_killed_run_resumes_to_identical_metrics(tmp_path):
    """A real process, a real SIGKILL mid-run, then --resume: the metrics equal an uninterrupted run's."""
    config = small_config(tmp_path, rounds=15, name="killed")
    dpfl = [sys.executable, "-m", "dpfl.cli"]
    reference = tmp_path / "reference"
    assert cli("run", config, "--out", reference)[0] == 0

    victim = tmp_path / "victim"
    proc = subprocess.Popen(dpfl + ["run", str(config), "--out", str(victim)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = victim / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (victim / "summary.json").exists()
    _assert_one_line_error(*cli("run", config, "--out", victim)[::2])  # not resumed by accident

    done = subprocess.run(dpfl + ["run", str(config), "--out", str(victim), "--resume"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

    def rows(path):
        return [untimed(json.loads(line))
                for line in (path / "metrics.jsonl").read_text().splitlines()]

    assert rows(victim) == rows(reference)
    assert json.loads((victim / "privacy.json").read_text())["clients"] == \
        json.loads((reference / "privacy.json").read_text())["clients"]
    again = subprocess.run(dpfl + ["run", str(config), "--out", str(victim), "--resume"],
                           capture_output=True, text=True)
    assert again.returncode == 0 and rows(victim) == rows(reference)  # a finished run stays finished


# ---- malformed input, property-based ---------------------------------------------------------------
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                     st.text(max_size=12), st.lists(st.integers(-3, 3), max_size=3))
_FIELDS = ["name", "seed", "data.dataset", "data.clients", "data.partition", "model.name", "training.rounds",
           "training.batch_size", "training.selection.kind", "training.selection.k", "privacy.delta",
           "privacy.budgets", "privacy.clip", "privacy.mechanism", "algorithm.name", "evaluation.every",
           "nonsense.field"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(_FIELDS), value=_scalars)
def test_malformed_configs_fail_cleanly_and_leave_no_complete_run(tmp_path, field, value):
    cfg = yaml.safe_load(DEMO_CONFIG.read_text())
    node = cfg
    *head, last = field.split(".")
    for key in head:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node
    node[last] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / f"run-{abs(hash((field, repr(value))))}"
    code, _, err = cli("run", path, "--out", out, "--set", "training.rounds=1")
    if code == 0:  # the random value happened to be valid
        assert (out / "summary.json").exists()
        return
    _assert_one_line_error(code, err)
    assert not out.exists()  # a user error leaves nothing behind


@settings(max_examples=30, deadline=None)
@given(text=st.text(max_size=200))
def test_arbitrary_yaml_text_fails_cleanly(text):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.yaml"
        path.write_text(text)
        code, _, err = cli("run", path, "--out", Path(d) / "out")
        _assert_one_line_error(code, err)
        assert not (Path(d) / "out").exists()


@settings(max_examples=30, deadline=None)
@given(args=st.lists(st.sampled_from(["--noise-multiplier", "--sample-rate", "--steps", "--delta", "--accountant",
                                      "-1", "0", "nan", "x", "1e-5", "2", "--json", "--epsilon"]), max_size=8))
def test_malformed_privacy_arguments_fail_cleanly(args):
    code, out, err = cli("privacy", "epsilon", *args)
    if code == 0:
        assert json.loads(out) if "--json" in args else out
        return
    _assert_one_line_error(code, err)


def test_a_clustered_run_reports_its_personal_accuracy_beside_the_servers_model(tmp_path):
    """R-DPCFL's clients use their cluster's model; the server's model (the mean of the cluster models) is not the
    method's metric and may sit near chance, so every place that shows an accuracy says which is which."""
    config = Path(__file__).resolve().parents[1] / "configs" / "rdpcfl" / "ci_digits_rotation.yaml"
    out = tmp_path / "rdpcfl"
    code, stdout, err = cli("run", config, "--out", out, "--set", "training.rounds=3", "--set", "evaluation.every=1")
    assert code == 0, err
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_personal_accuracy"] == metrics[-1]["acc_personal"]
    best = max(metrics, key=lambda row: row["acc_personal"])
    assert (summary["best_personal_accuracy"], summary["best_personal_round"]) == (best["acc_personal"], best["round"])
    report = (out / "report.md").read_text()
    assert f"- **Best personalised accuracy:** {best['acc_personal']:.4f} (round {best['round']})" in report
    assert summary["final_accuracy"] == metrics[-1]["test_accuracy"] != metrics[-1]["acc_personal"]
    assert f"personalised accuracy {metrics[-1]['acc_personal']:.3f}" in stdout
    code, stdout, _ = cli("compare", out, "--out", tmp_path)
    assert code == 0
    header, _, row = stdout.splitlines()[:3]
    column = header.split().index("personal_accuracy")
    assert row.split()[column] == f"{metrics[-1]['acc_personal']:.4f}"
    # a method without personal models keeps the summary and the table it had
    plain = tmp_path / "plain"
    assert cli("run", small_config(tmp_path), "--out", plain)[0] == 0
    plain_summary = json.loads((plain / "summary.json").read_text())
    assert not {"final_personal_accuracy", "best_personal_accuracy", "best_personal_round"} & set(plain_summary)
    assert "personal_accuracy" not in cli("compare", plain, "--out", tmp_path)[1]

"""scripts/regression.py: the diff on small output directories written here (a changed metric, epsilon, CSV cell, a
missing row, a file on one side only; timing fields ignored), the runner on a fake dpfl checkout (a failing job is
recorded and the others go on, finished jobs are not run again, PYTHONPATH picks the tree's dpfl), the job list of
the real configs/ (every YAML once), and one real job (the demo config) run twice from this checkout: identical
outputs, and one edited value found."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from script_module import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reg():
    return load_script("regression")


# ---- diff ----------------------------------------------------------------------------------------------------------
def _write_run(d: Path, *, acc2=0.75, eps=(1.5, 2.0), cell="0.91", rows=3, seconds=1.25, extra=None) -> Path:
    """A small output directory: a `dpfl run` job and a reproduce job with one run directory and results.csv."""
    run = d / "config" / "demo"
    run.mkdir(parents=True)
    metrics = [{"round": 1, "test_accuracy": None, "epsilon": [0.5, 0.7], "seconds": seconds,
                "cpu_seconds": 2 * seconds},
               {"round": 2, "test_accuracy": acc2, "epsilon": [1.0, 1.4], "seconds": seconds}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    privacy = {"accounted": True, "clients": [{"client": i, "epsilon_spent": e} for i, e in enumerate(eps)]}
    (run / "privacy.json").write_text(json.dumps(privacy))
    (run / "summary.json").write_text(json.dumps({"final_accuracy": acc2, "seconds": seconds, "train_seconds": seconds,
                                                  "traffic": {"uplink_bytes": 100}, "out": str(run)}))
    (run / "environment.jsonl").write_text(json.dumps({"when": str(seconds), "torch": "x"}) + "\n")
    grid = d / "reproduce" / "pfa"
    (grid / "runs" / "s1" / "pfa" / "seed0").mkdir(parents=True)
    (grid / "runs" / "s1" / "pfa" / "seed0" / "summary.json").write_text(json.dumps({"final_accuracy": 0.5}))
    lines = ["# dpfl reproduce pfa --scale ci --out " + str(grid), "setting,method,seed,final_accuracy,seconds"]
    lines += [f"s1,m{i},0,{cell if i == 1 else '0.5'},{seconds}" for i in range(rows)]
    (grid / "results.csv").write_text("\n".join(lines) + "\n")
    if extra:
        (run / extra).write_text("{}")
    jobs = {"config/demo": {"status": "ok", "rc": 0, "seconds": seconds},
            "reproduce/pfa": {"status": "ok", "rc": 0, "seconds": seconds}}
    (d / "jobs.json").write_text(json.dumps({"tree": "/somewhere", "jobs": jobs}))
    return d


def test_identical_outputs_but_for_timing_and_their_own_paths_have_no_difference(reg, tmp_path):
    a = _write_run(tmp_path / "a", seconds=1.0)
    b = _write_run(tmp_path / "b", seconds=7.5)  # every timing field and the OUT paths differ
    assert reg.diff_outputs(a, b) == []
    assert reg.main(["diff", str(a), str(b)]) == 0


@pytest.mark.parametrize(("change", "line"), [
    ({"acc2": 0.76}, "config/demo/metrics.jsonl: round=2.test_accuracy: A=0.75 B=0.76"),
    ({"eps": (1.5, 2.0000000000000004)}, "config/demo/privacy.json: clients[1].epsilon_spent: A=2.0 "
                                         "B=2.0000000000000004"),
    ({"cell": "0.92"}, "reproduce/pfa/results.csv: row[setting=s1,method=m1,seed=0].final_accuracy: A=0.91 B=0.92"),
    ({"rows": 2}, "reproduce/pfa/results.csv: row[setting=s1,method=m2,seed=0]: "
                  'A={"setting":"s1","method":"m2","seed":"0","final_accuracy":"0.5"} B=<absent>'),
    ({"extra": "audit.json"}, "config/demo/audit.json: <file>: A=<absent> B=present"),
])
def test_the_diff_names_each_change(reg, tmp_path, capsys, change, line):
    a = _write_run(tmp_path / "a")
    b = _write_run(tmp_path / "b", **change)
    found = reg.diff_outputs(a, b)
    assert line in found
    summary = "config/demo/summary.json: final_accuracy: A=0.75 B=0.76"
    assert found == ([line, summary] if "acc2" in change else [line])
    assert reg.main(["diff", str(a), str(b)]) == 1
    assert line in capsys.readouterr().out.splitlines()


def test_a_missing_metrics_row_a_one_sided_run_directory_and_job(reg, tmp_path):
    a = _write_run(tmp_path / "a")
    b = _write_run(tmp_path / "b")
    m = b / "config" / "demo" / "metrics.jsonl"
    m.write_text(m.read_text().splitlines()[0] + "\n")
    shutil.rmtree(b / "reproduce" / "pfa" / "runs" / "s1" / "pfa")
    record = json.loads((b / "jobs.json").read_text())
    record["jobs"]["reproduce/pfa"]["rc"] = 1
    record["jobs"]["config/other"] = {"status": "skipped", "rc": None, "reason": "dataset x not available here"}
    (b / "jobs.json").write_text(json.dumps(record))
    found = reg.diff_outputs(a, b)
    assert found[0] == "config/other: <job>: A=<absent> B=skipped"
    assert found[1] == "reproduce/pfa: <exit code>: A=0 (ok) B=1 (ok)"
    assert found[2].startswith('config/demo/metrics.jsonl: round=2: A={"round":2,"test_accuracy":0.75')
    assert found[2].endswith("B=<absent>")
    assert found[3:] == ["reproduce/pfa/runs/s1/pfa: <directory>: A=present B=<absent>"]


def test_a_multiline_string_differs_by_its_changed_lines_each_on_one_line(reg, tmp_path):
    """A config embedded as text in a JSON file (the noise table's): one inserted line is one difference, aligned
    (not every later line), and no printed difference spans two lines."""
    a = _write_run(tmp_path / "a")
    b = _write_run(tmp_path / "b")
    text = "name: x\nalgorithm:\n  params: {tol: 1e-7}\nseed: 0\n"
    (a / "config" / "demo" / "table.json").write_text(json.dumps({"config": text, "note": "one\ntwo"}))
    (b / "config" / "demo" / "table.json").write_text(json.dumps({
        "config": text.replace("  params:", "  params: {mu_growth: 1.0}\n  params:"), "note": "one\nthree"}))
    assert reg.diff_outputs(a, b) == [
        "config/demo/table.json: config line -/3: A=<absent> B=  params: {mu_growth: 1.0}",
        "config/demo/table.json: note line 2/2: A=two B=three"]
    assert reg.fmt("a\nb") == "a\\nb"


def test_rtol_allows_a_tolerance_and_nothing_else(reg, tmp_path):
    a = _write_run(tmp_path / "a", acc2=0.75, cell="0.91")
    b = _write_run(tmp_path / "b", acc2=0.75 * (1 + 1e-9), cell="0.9100000001")
    assert len(reg.diff_outputs(a, b)) == 3
    assert reg.diff_outputs(a, b, rtol=1e-6) == []
    assert len(reg.diff_outputs(a, _write_run(tmp_path / "c", acc2=0.8), rtol=1e-6)) == 2


def test_the_ignored_keys_are_timing_environment_and_versions_only(reg):
    ignored = ["seconds", "cpu_seconds", "train_cpu_seconds", "prox_seconds", "secagg_server_seconds", "wall",
               "wall_seconds", "time", "runtime", "training_time", "timestamp", "elapsed", "when", "started",
               "finished_at", "max_rss", "peak_memory", "host", "hostname", "pid", "environment", "cpu_model",
               "cpu_capability", "torch_threads", "omp_num_threads", "python", "torch", "numpy", "platform",
               "version", "flwr_version", "source_commit", "git_sha", "source_modified"]
    kept = ["final_accuracy", "epsilon", "epsilon_spent", "round", "members", "n_members", "start_points",
            "skip_start", "second_stage_rounds", "uplink_mib", "timeout", "test_loss", "stop_reason", "run_dir",
            "noise_multiplier", "rounds_done", "rounds_to_1e-8", "param_norm"]
    assert [k for k in ignored if not reg.ignored_key(k)] == []
    assert [k for k in kept if reg.ignored_key(k)] == []


def test_usage_errors_exit_2(reg, tmp_path):
    assert reg.main(["diff", str(tmp_path / "nope"), str(tmp_path)]) == 2
    with pytest.raises(SystemExit) as e:
        reg.main(["diff", str(tmp_path)])
    assert e.value.code == 2


# ---- the runner, on a fake checkout --------------------------------------------------------------------------------
FAKE_CLI = '''
import json, os, sys
from pathlib import Path

def main(argv):
    if argv[:2] == ["data", "list"]:
        print(json.dumps({"datasets": [{"name": "digits", "source": "embedded"},
                                       {"name": "mnist", "source": "missing"}]}))
        sys.exit(0)
    if argv[:2] == ["reproduce", "--help"]:
        print("Usage: dpfl reproduce [OPTIONS] COMMAND\\n\\nCommands:\\n  toy    A toy study.\\n  merge  Merge.\\n")
        sys.exit(0)
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(" ".join(argv) + "\\n")
    out = Path(argv[argv.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    if "configs/bad.yaml" in argv:
        print("boom", file=sys.stderr)
        sys.exit(3)
    if "configs/clustered.yaml" in argv and "training.rounds=2" in argv:  # as R-DPCFL's two-stage plan refuses
        print("error: privacy.budgets: client 0: rounds must be an integer >= 3, got 2", file=sys.stderr)
        sys.exit(2)
    facts = {"threads": os.environ["OMP_NUM_THREADS"], "cwd": os.getcwd(), "dpfl": __file__}
    (out / "summary.json").write_text(json.dumps(facts))
    sys.exit(0)
'''


@pytest.fixture
def fake_tree(tmp_path, monkeypatch):
    tree = tmp_path / "tree"
    (tree / "src" / "dpfl").mkdir(parents=True)
    (tree / "src" / "dpfl" / "__init__.py").write_text("")
    (tree / "src" / "dpfl" / "cli.py").write_text(FAKE_CLI)
    (tree / "configs").mkdir()
    run = "name: x\ndata: {dataset: digits}\nmodel: {name: logr}\n"
    (tree / "configs" / "good.yaml").write_text(run)
    (tree / "configs" / "bad.yaml").write_text(run)
    (tree / "configs" / "mnist.yaml").write_text(run.replace("digits", "mnist"))
    (tree / "configs" / "clustered.yaml").write_text(run)
    (tree / "configs" / "grid.yaml").write_text("settings: [a, b]\n")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.log"))
    return tree


def test_the_runner_records_a_failure_goes_on_and_skips_finished_jobs(reg, fake_tree, tmp_path, capsys):
    out = tmp_path / "out"
    assert reg.main(["run", str(fake_tree), str(out), "--workers", "2"]) == 1
    record = json.loads((out / "jobs.json").read_text())
    jobs = record["jobs"]
    assert {k: v["status"] for k, v in jobs.items()} == {
        "config/bad": "failed", "config/clustered": "ok", "config/good": "ok", "config/grid": "skipped",
        "config/mnist": "skipped", "reproduce/toy": "ok"}
    # a config that refuses 2 rounds and names its shortest setting runs once more with it (and records it)
    assert jobs["config/clustered"]["command"][:4] == ["dpfl", "run", "configs/clustered.yaml", "--set"]
    assert jobs["config/clustered"]["command"][4] == "training.rounds=3"
    assert jobs["config/bad"]["rc"] == 3 and "boom" in jobs["config/bad"]["stderr_tail"]
    assert jobs["config/mnist"]["reason"] == "dataset mnist not available here"  # from the catalog
    assert jobs["config/grid"]["reason"].startswith("not a config any dpfl command reads")
    assert jobs["config/good"]["command"] == ["dpfl", "run", "configs/good.yaml", "--set", "training.rounds=2",
                                              "--out", "OUT/config/good"]
    assert jobs["reproduce/toy"]["seconds"] > 0
    facts = json.loads((out / "config" / "good" / "summary.json").read_text())
    # PYTHONPATH=<tree>/src wins over the editable install of this checkout's dpfl; cwd is the tree; one thread
    assert facts == {"threads": "1", "cwd": str(fake_tree.resolve()),
                     "dpfl": str(fake_tree.resolve() / "src" / "dpfl" / "cli.py")}
    assert record["dpfl_file"] == str(fake_tree.resolve() / "src" / "dpfl" / "__init__.py")
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert sorted(c.split(" --out ")[0] for c in calls) == [
        "reproduce toy --scale ci", "run configs/bad.yaml --set training.rounds=2",
        "run configs/clustered.yaml --set training.rounds=2", "run configs/clustered.yaml --set training.rounds=3",
        "run configs/good.yaml --set training.rounds=2"]
    capsys.readouterr()
    assert reg.main(["run", str(fake_tree), str(out)]) == 1  # again: only the failed job runs
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 6
    assert "4 jobs, 3 finished before, 1 to run" in capsys.readouterr().out


def test_the_tree_commands_are_read_from_either_help_format(reg):
    rich = textwrap.dedent("""\
        ╭─ Options ──────────────────╮
        │ --help          Show this. │
        ╰────────────────────────────╯
        ╭─ Commands ─────────────────╮
        │ pfa              PFA's     │
        │                  pfa_plus, │
        │ robust-hdp       Robust.   │
        │ fdp-sensitivity  Empirical │
        ╰────────────────────────────╯""")
    assert reg.parse_commands(rich) == ["pfa", "robust-hdp", "fdp-sensitivity"]
    assert reg.parse_commands("Usage: x\n\nOptions:\n  --help  Show.\n\nCommands:\n  pfa  A.\n  merge  B.\n") == [
        "pfa", "merge"]


# ---- the real checkout ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_info(reg):
    return reg.probe_tree(ROOT)


def test_list_names_every_yaml_under_configs_exactly_once(reg, real_info):
    entries = reg.jobs_of(ROOT, real_info)
    yamls = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.y*ml"))
    from_configs = [e.source for e in entries if e.name.startswith("config/")]
    assert sorted(from_configs) == yamls
    assert len({e.name for e in entries}) == len(entries)
    for e in entries:
        assert isinstance(e, reg.Job) or e.reason
    by_name = {e.name: e for e in entries}
    assert by_name["config/demo"].args == ["run", "configs/demo.yaml", "--set", "training.rounds=2"]
    assert by_name["config/mpdp/ci_digits_mlp"].args[-2:] == ["--set", "training.rounds=2"]  # a run config now
    assert by_name["config/attacks/digits_cnn"].args == ["attack", "invert", "configs/attacks/digits_cnn.yaml",
                                                         "--batch", "8"]
    assert "run by job reproduce/splitting" in by_name["config/splitting/convex/ls_heterogeneous"].reason
    families = {e.name for e in entries if e.name.startswith("reproduce/")}
    assert {"reproduce/pfa", "reproduce/fedceo-dlg", "reproduce/rdpcfl-round1-analysis",
            "reproduce/fedceo-search"} <= families and "reproduce/merge" not in families
    # a dataset missing from the catalog skips its configs, whatever the file
    info = reg.TreeInfo(ROOT, "", {"digits"}, real_info.catalog, [], real_info.splitting_scales)
    skipped = {e.name: e for e in reg.jobs_of(ROOT, info)}
    assert skipped["config/demo"].reason == "dataset digits not available here"


def test_the_demo_job_twice_gives_identical_outputs_and_an_edit_is_found(reg, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert reg.main(["run", str(ROOT), str(a), "--only", "demo"]) == 0
    assert reg.main(["run", str(ROOT), str(b), "--only", "demo"]) == 0
    assert sorted(json.loads((a / "jobs.json").read_text())["jobs"]) == ["config/demo"]
    assert (a / "config" / "demo" / "metrics.jsonl").read_text() != (b / "config" / "demo" / "metrics.jsonl"
                                                                     ).read_text()  # timings differ
    capsys.readouterr()
    assert reg.main(["diff", str(a), str(b)]) == 0
    summary = b / "config" / "demo" / "summary.json"
    values = json.loads(summary.read_text())
    before = values["final_accuracy"]
    values["final_accuracy"] = after = before + 1e-12
    summary.write_text(json.dumps(values))
    assert reg.main(["diff", str(a), str(b)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"config/demo/summary.json: final_accuracy: A={before!r} B={after!r}"]
    assert reg.main(["diff", str(a), str(b), "--rtol", "1e-9"]) == 0

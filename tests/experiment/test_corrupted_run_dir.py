"""Damaged run directories: one clear line, exit code 2, and nothing in the directory touched.

A run directory can be damaged in ways a kill never produces: a garbage or truncated `checkpoint.pt`,
`config.yaml`, `privacy.json` or `summary.json`, a garbage line in the middle of `metrics.jsonl`, or a
checkpoint of another run copied in. Every command that reads the damaged file (`dpfl run --resume`,
`dpfl report DIR`, `dpfl compare DIR ...`) must then exit with code 2 and print ONE line, `error: ...`,
naming the file, what is wrong and what the user can do, without a traceback, and must leave every file
of the directory byte for byte as it was. The hints must work: doing what the message says recovers the
run. The trace a kill leaves (a truncated LAST line of metrics.jsonl) is not damage: resume repairs it.

`checkpoint.pt` is resume state, not a result: `report` and `compare` never read it, so a damaged
checkpoint does not stop them (and they leave it alone).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from cli_runner import cli
from untimed import untimed
from dpfl.experiment.config import load_config
from dpfl.experiment.run_directory import FINGERPRINT
from dpfl.results.run_files import truncate_jsonl
from stopped_run import stop_in_round

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
SETS = ["name=damaged", "training.rounds=4", "evaluation.every=1", "checkpoint.every=2", "privacy.noise_multiplier=1.5",
        "privacy.budgets=[2,3,4,6,8,10,12,16,20,30]"]


def _run_args(out: Path, sets: list[str] = SETS, resume: bool = True) -> list[str]:
    return ["run", str(DEMO), "--out", str(out), *[a for s in sets for a in ("--set", s)],
            *(["--resume"] if resume else [])]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """finished: a complete run; unfinished: the same run stopped after round 3 (checkpoint at round 2);
    other_seed: the same config with seed 1 (a checkpoint of the same shapes); other_shape: 5 clients."""
    base = tmp_path_factory.mktemp("runs")
    out = {name: base / name for name in ("finished", "unfinished", "other_seed", "other_shape")}
    assert cli(*_run_args(out["finished"], resume=False))[0] == 0
    stop_in_round(load_config(DEMO, SETS), out["unfinished"], 3)
    assert cli(*_run_args(out["other_seed"], SETS + ["seed=1"], resume=False))[0] == 0
    assert cli(*_run_args(out["other_shape"], SETS + ["training.rounds=2", "data.clients=5",
                                                      "privacy.budgets=[2,3,4,6,8]"], resume=False))[0] == 0
    return out


def _copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "run"))


def _hashes(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


def _refused(result: tuple[int, str, str], *words: str) -> str:
    code, _, err = result
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def _commands(run: Path, tmp_path: Path) -> dict[str, list[str]]:
    return {"resume": _run_args(run), "report": ["report", str(run)],
            "compare": ["compare", str(run), "--out", str(tmp_path / "compare")]}


def _rows(d: Path) -> list[dict[str, Any]]:
    text = (d / "metrics.jsonl").read_text()
    assert text.endswith("\n")
    return untimed([json.loads(line) for line in text.splitlines()])


def _json(d: Path, name: str) -> Any:
    return untimed(json.loads((d / name).read_text()))


# ---- damage ---------------------------------------------------------------------------------------------
def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00\x93garbage\xff\xfe" * 40)


def _text_garbage(path: Path) -> None:
    path.write_text("{{{ this: [is not, valid\n")


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _middle_line(path: Path) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = b"garbage\n"
    path.write_bytes(b"".join(lines))


def _cut_middle_line(path: Path) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1][: len(lines[1]) // 2] + b"\n"
    path.write_bytes(b"".join(lines))


DAMAGE = {"garbage": _garbage, "text_garbage": _text_garbage, "truncated": _truncated, "empty": _empty}
CASES = [
    *[(run, "config.yaml", how) for run in ("finished", "unfinished") for how in DAMAGE],
    *[("finished", name, how) for name in ("privacy.json", "summary.json") for how in DAMAGE],
    *[(run, "metrics.jsonl", how) for run in ("finished", "unfinished") for how in ("middle_line", "cut_middle_line")],
]
HINTS = {"config.yaml": "re-run", "privacy.json": "delete privacy.json", "summary.json": "delete summary.json",
         "metrics.jsonl": "delete metrics.jsonl", "checkpoint.pt": "delete checkpoint.pt"}


@pytest.mark.parametrize("run_name, file, how", CASES, ids=[f"{r}-{f}-{h}" for r, f, h in CASES])
def test_a_damaged_file_stops_every_command_that_reads_it_and_changes_nothing(runs, tmp_path, run_name, file, how):
    run = _copy(runs[run_name], tmp_path)
    {**DAMAGE, "middle_line": _middle_line, "cut_middle_line": _cut_middle_line}[how](run / file)
    before = _hashes(run)
    for command, args in _commands(run, tmp_path).items():
        _refused(cli(*args), file, HINTS[file])
        assert _hashes(run) == before, command
    assert not (tmp_path / "compare").exists()


@pytest.mark.parametrize("how", ["garbage", "truncated", "empty"])
def test_a_damaged_checkpoint_stops_resume_only(runs, tmp_path, how):
    run = _copy(runs["unfinished"], tmp_path)
    DAMAGE[how](run / "checkpoint.pt")
    before = _hashes(run)
    line = _refused(cli(*_run_args(run)), "checkpoint.pt", "corrupt", HINTS["checkpoint.pt"], "round 0")
    assert _hashes(run) == before, line
    # report and compare do not need the checkpoint: they work and leave it (and every input) alone
    assert cli("report", run)[0] == 0 and cli("compare", run, "--out", tmp_path / "compare")[0] == 0
    after = _hashes(run)
    assert {k: v for k, v in after.items() if k in before} == before


def _strip_fingerprint(src: Path, dst: Path) -> None:
    """Another run's checkpoint as an older dpfl wrote it (no config fingerprint)."""
    state = torch.load(src, weights_only=True)
    del state[FINGERPRINT]
    buffer = io.BytesIO()
    torch.save(state, buffer)
    dst.write_bytes(buffer.getvalue())


@pytest.mark.parametrize("source, fingerprint, words", [
    ("other_seed", True, ["checkpoint.pt", "does not belong to this run", "another config"]),
    ("other_shape", False, ["checkpoint.pt", "does not belong to this run"]),
    ("other_seed", False, ["metrics.jsonl", "checkpoint.pt", "not from the same run"]),
    ("finished", True, []),  # the same run's final checkpoint fits: nothing to refuse
], ids=["fingerprint", "shapes", "history", "same-run"])
def test_a_checkpoint_of_another_run_is_refused_before_anything_runs(runs, tmp_path, source, fingerprint, words):
    run = _copy(runs["unfinished"], tmp_path)
    if fingerprint:
        shutil.copyfile(runs[source] / "checkpoint.pt", run / "checkpoint.pt")
    else:
        _strip_fingerprint(runs[source] / "checkpoint.pt", run / "checkpoint.pt")
    before = _hashes(run)
    if not words:
        assert cli(*_run_args(run))[0] == 0
        assert _rows(run) == _rows(runs["finished"])
        return
    _refused(cli(*_run_args(run)), *words)
    assert _hashes(run) == before


def test_a_truncated_last_metrics_line_is_repaired_silently(runs, tmp_path):
    run = _copy(runs["unfinished"], tmp_path)
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b'{"round": 4, "selected": [1, 2')  # a writer killed mid-append
    assert cli("report", run)[0] == 0  # readers skip the partial line
    code, _, err = cli(*_run_args(run))
    assert code == 0, err
    assert _rows(run) == _rows(runs["finished"])
    assert _json(run, "privacy.json") == _json(runs["finished"], "privacy.json")
    assert _json(run, "summary.json") == _json(runs["finished"], "summary.json")


def test_a_config_cut_at_a_line_end_is_refused_by_resume(runs, tmp_path):
    """Still valid YAML, so only resume (which validates it and compares it with CONFIG) can tell."""
    run = _copy(runs["unfinished"], tmp_path)
    lines = (run / "config.yaml").read_text().splitlines(keepends=True)
    for keep in (len(lines) // 3, len(lines) - 1):
        (run / "config.yaml").write_text("".join(lines[:keep]))
        before = _hashes(run)
        _refused(cli(*_run_args(run)), "config.yaml")
        assert _hashes(run) == before


def test_a_changed_config_is_refused_naming_the_first_difference(runs, tmp_path):
    run = _copy(runs["unfinished"], tmp_path)
    before = _hashes(run)
    _refused(cli(*_run_args(run, SETS + ["training.rounds=5"])), "config differs", "training.rounds: saved 4, given 5")
    assert _hashes(run) == before


def test_a_kill_while_config_yaml_was_written_leaves_a_directory_that_can_be_started(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".config.yaml.k1ll3d_x.tmp").write_text("name: dam")  # the temp file of an interrupted atomic write
    _refused(cli(*_run_args(run)), "nothing to resume", "without --resume")
    code, _, err = cli(*_run_args(run, SETS + ["training.rounds=1"], resume=False))
    assert code == 0, err
    assert not list(run.glob(".*.tmp")) and (run / "summary.json").exists()


# ---- the hints work -----------------------------------------------------------------------------------
@pytest.mark.parametrize("run_name, damaged, delete", [
    ("finished", "summary.json", ["summary.json"]),
    ("finished", "privacy.json", ["privacy.json", "summary.json"]),
    ("finished", "metrics.jsonl", ["metrics.jsonl", "summary.json"]),
    ("unfinished", "metrics.jsonl", ["metrics.jsonl"]),
    ("unfinished", "checkpoint.pt", ["checkpoint.pt"]),
])
def test_doing_what_the_message_says_recovers_the_run(runs, tmp_path, run_name, damaged, delete):
    run = _copy(runs[run_name], tmp_path)
    (_middle_line if damaged == "metrics.jsonl" else _garbage)(run / damaged)
    _refused(cli(*_run_args(run)), damaged, HINTS[damaged])
    for name in delete:
        (run / name).unlink()
    code, _, err = cli(*_run_args(run))
    assert code == 0, err
    reference = runs["finished"]
    assert _rows(run) == _rows(reference)
    for name in ("privacy.json", "summary.json"):
        assert _json(run, name) == _json(reference, name), name
    assert sorted(_hashes(run)) == sorted(_hashes(reference))


# ---- the JSONL primitive --------------------------------------------------------------------------------
def test_truncate_jsonl_refuses_a_damaged_middle_line_and_cuts_nothing(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"round": 1}\ngarbage\n{"round": 3}\n{"round": 4')
    before = path.read_bytes()
    for keep in (0, 1, 3):
        with pytest.raises(ValueError, match="line 2"):
            truncate_jsonl(path, keep)
        assert path.read_bytes() == before
    path.write_bytes(b'{"round": 1}\n\n{"round": 3}\n')
    with pytest.raises(ValueError, match="line 2 is empty"):
        truncate_jsonl(path, 1)

"""A local Ray start stays on the machine: every Ray process listens on 127.0.0.1 only, Ray's usage statistics are
off, it is a Ray of its own (whatever RAY_ADDRESS says), and `dpfl run` says which backend and how many actors it
used (issue 65, item 3)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cli_runner import cli
from dpfl.engine.backends.ray import RayBackend
from dpfl.experiment.build import build_run
from dpfl.experiment.config.loading import load_config
from processes import descendants

ray = pytest.importorskip("ray")
# starts Ray (one instance per test): the integration tier
pytestmark = pytest.mark.integration
SETS = ["backend=ray", "ray.actors=2", "training.rounds=1"]


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_addr: str) -> str:
    """/proc/net/tcp{,6}'s local address as text (IPv4, or IPv6 as 32 hex digits; ::ffff:a.b.c.d for a mapped v4)."""
    host = hex_addr.split(":")[0]
    if len(host) == 8:
        return ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))
    words = [host[i:i + 8] for i in range(0, 32, 8)]
    if words[:2] == ["00000000", "00000000"] and words[2] == "FFFF0000":
        return "::ffff:" + _address(words[3])
    return "::1" if host == "00000000000000000000000001000000" else host


def listening(pids: list[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every listening TCP socket the processes hold."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in owner:  # 0A: LISTEN
                    found.append((owner[cols[9]], _address(cols[1])))
    return found


@pytest.fixture
def no_ray():
    if ray.is_initialized():
        pytest.skip("this process already runs Ray")
    yield
    if ray.is_initialized():
        ray.shutdown()


def test_a_local_ray_listens_on_loopback_only_with_usage_stats_off(no_ray, monkeypatch):
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")  # Ray's own lookup would join it (and fail): dpfl starts its own
    seen: dict[str, object] = {}
    close = RayBackend.close

    def snapshot_then_close(self: RayBackend) -> None:  # while Ray still runs: what its processes listen on
        if ray.is_initialized() and "sockets" not in seen:
            from ray._common.usage.usage_lib import usage_stats_enabled

            seen["sockets"] = listening([os.getpid(), *descendants(os.getpid())])
            seen["usage_stats"] = usage_stats_enabled()
        close(self)

    monkeypatch.setattr(RayBackend, "close", snapshot_then_close)
    run = build_run(load_config("configs/demo.yaml", SETS))
    run.run()
    sockets = seen["sockets"]
    assert sockets, "no listening socket found for Ray's processes"
    assert {addr for _, addr in sockets} <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, sockets
    assert seen["usage_stats"] is False
    used = run.backend.describe()
    assert used == {"name": "ray", "actors": 2, "threads_per_actor": 1, "actor_restarts": 0, "ray": "started",
                    "address": None, "node_address": "127.0.0.1", "usage_stats": False}
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ  # restored after the start
    from ray._private import ray_constants

    assert ray_constants.ENABLE_RAY_CLUSTER is True


def test_dpfl_run_says_which_backend_and_how_many_actors(no_ray, tmp_path: Path):
    out = tmp_path / "run"
    code, stdout, stderr = cli("run", "configs/demo.yaml", *[a for s in SETS for a in ("--set", s)], "--out", str(out))
    assert code == 0, stdout + stderr
    assert ("backend: ray, 2 actors x 1 thread on a Ray this run started on 127.0.0.1 (usage statistics off)"
            in stdout), stdout
    assert json.loads((out / "summary.json").read_text())["backend"]["actors"] == 2
    code, stdout, _ = cli("run", "configs/demo.yaml", "--set", "training.rounds=1", "--out", str(tmp_path / "local"))
    assert code == 0 and "backend: local (the whole cohort in this process)" in stdout

"""Run configs/demo.yaml on a Ray this process starts (backend ray, 2 actors, 1 round) and print, as JSON, what the
Ray processes listened on while Ray ran, whether usage statistics were on, the backend's description and the
environment after the start: run by tests/engine/test_ray_local.py in a process of its own (Ray is started at most
once per process: repeated starts and shutdowns in one process have crashed it at shutdown)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from processes import descendants  # noqa: E402


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


def main() -> None:
    import ray

    from dpfl.engine.backends.ray import RayBackend
    from dpfl.experiment.build import build_run
    from dpfl.experiment.config.loading import load_config

    seen: dict[str, object] = {}
    close = RayBackend.close

    def snapshot_then_close(self: RayBackend) -> None:  # while Ray still runs: what its processes listen on
        if ray.is_initialized() and "sockets" not in seen:
            from ray._common.usage.usage_lib import usage_stats_enabled

            seen["sockets"] = listening([os.getpid(), *descendants(os.getpid())])
            seen["usage_stats"] = usage_stats_enabled()
        close(self)

    RayBackend.close = snapshot_then_close  # type: ignore[method-assign]
    run = build_run(load_config(ROOT / "configs" / "demo.yaml", ["backend=ray", "ray.actors=2", "training.rounds=1"]))
    run.run()
    from ray._private import ray_constants

    print(json.dumps({**seen, "describe": run.backend.describe(),
                      "cluster_env_left": "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" in os.environ,
                      "enable_ray_cluster": ray_constants.ENABLE_RAY_CLUSTER}))


if __name__ == "__main__":
    main()

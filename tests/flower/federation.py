"""Run what `dpfl flower guide` prints, as a user would: each long-running process (SuperLink, SuperNodes) in a
session of its own, the submit-and-check steps in one shell, all from a directory that is not the repository.

Shared by tests/flower/test_guide_federation.py (insecure) and test_secure_federation.py (TLS + node auth).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from processes import alive, descendants, tree_env

BIN = Path(sys.executable).parent


def env() -> dict[str, str]:
    """The user's shell: the venv's executables on PATH, this tree's dpfl importable (for `dpfl` and the apps)."""
    return tree_env(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1",
                    FLWR_HOME="/nonexistent-user-flwr-home")  # the guide sets its own


def free_base_port(nodes: int) -> int:
    """A port P with P and P+10..P+10+nodes-1 free on 127.0.0.1 (the guide's layout)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base > 65000:
            continue
        try:
            socks = []
            for p in [base, *range(base + 10, base + 10 + nodes)]:
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free ports")


def guide_steps(text: str) -> dict[int, list[str]]:
    """{step number: its command lines} of the guide's output (comments dropped, heredocs kept whole)."""
    steps: dict[int, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"# (\d)\. ", line)
        if m:
            current = int(m.group(1))
            steps[current] = []
        elif current is not None and line and not line.startswith("#"):
            steps[current].append(line)
        elif current is not None and not line and steps[current] and steps[current][-1] != "TOML" \
                and any(s.endswith("<<'TOML'") for s in steps[current]):
            steps[current].append(line)  # a blank line inside the heredoc
    return steps


def wait_listening(port: int, deadline: float, procs: list[subprocess.Popen], logs: Path) -> None:
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            dead = [p.args for p in procs if p.poll() is not None]
            assert not dead, f"{dead} exited\n{read_logs(logs)}"
            assert time.monotonic() < deadline, f"nothing listens on {port}\n{read_logs(logs)}"
            time.sleep(0.3)


def command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(Path(a).name if i < 2 else a for i, a in
                            enumerate(f.read().decode(errors="replace").split("\0")[:3]))
    except OSError:
        return "?"


def read_logs(folder: Path) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-2500:]}" for f in sorted(folder.glob("*.log")))


class Federation:
    """The processes a test started: `start` one per long-running command, `stop_gracefully` as the guide says."""

    def __init__(self, cwd: Path, logs: Path) -> None:
        self.cwd, self.logs, self.procs = cwd, logs, {}
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, command: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "w")
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.cwd, env=env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def shell(self, script: str, timeout: float) -> subprocess.CompletedProcess:
        """The submit-and-check steps in one bash (the exit status is the last command's: `dpfl flower check`)."""
        return subprocess.run(["bash", "-c", script], cwd=self.cwd, env=env(), capture_output=True, text=True,
                              timeout=timeout)

    def stop_gracefully(self, name: str, timeout: float = 30.0) -> list[str]:
        """SIGTERM to the one process (as Ctrl+C / kill -TERM would), then the processes it had started that are
        still running `timeout` s later (what a user would find orphaned)."""
        proc = self.procs[name]
        children = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(alive(c) for c in children):
            time.sleep(0.2)
        return [f"{c} {command_name(c)}" for c in children if alive(c)]

    def kill_all(self) -> None:
        """Whatever is left (a failed test): every process started here and its descendants."""
        for proc in self.procs.values():
            for pid in [*descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

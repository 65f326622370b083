"""The commands that start each side of a local dpfl Flower federation (`dpfl flower guide`); no Flower import."""

from __future__ import annotations

from pathlib import Path


def guide(nodes: int = 3, port: int = 9092, project: str = "examples/flower", connection: str = "dpfl-local") -> str:
    """Shell commands: a SuperLink, `nodes` SuperNodes (partition-id 0..nodes-1), the connection, `flwr run`."""
    home = "${FLWR_HOME:-$HOME/.flwr}"
    lines = [
        "# 1. the SuperLink (server side; --insecure: no TLS, for a local test only)",
        f"flower-superlink --insecure --port {port} --disable-runtime-dependency-installation",
        "",
        "# 2. one SuperNode per dpfl client (each in its own terminal / machine; partition-id = dpfl client id)",
    ]
    for i in range(nodes):
        lines.append(f"flower-supernode --insecure --superlink 127.0.0.1:{port} --port {port + 10 + i} "
                     f"--node-config 'partition-id={i}'")
    lines += [
        "",
        f"# 3. tell `flwr` where the SuperLink is ({home}/config.toml)",
        f"mkdir -p {home} && cat >> {home}/config.toml <<'TOML'",
        f"[superlink.{connection}]",
        f'address = "127.0.0.1:{port}"',
        "insecure = true",
        "TOML",
        "",
        "# 4. submit the run (the ServerApp writes the run directory `out`; --stream shows its log)",
        f"flwr run {project} {connection} --stream --run-config 'out=\"{Path.cwd() / 'runs' / 'flower'}\"'",
    ]
    return "\n".join(lines)

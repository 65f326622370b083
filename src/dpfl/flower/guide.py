"""The commands that start each side of a local dpfl Flower federation (`dpfl flower guide`); no Flower import.

One number, `nodes`, sets both sides: the SuperNodes printed (partition-id 0..nodes-1) and the run's clients (run
config `nodes`, which sets the config's data.clients). Every path printed is absolute (the Flower project shipped
in the package, the federation's directory), so each command runs from any directory. The last command is
`dpfl flower check`, which exits non-zero when the run failed (`flwr run` exits 0 either way). With a config of the
user's own files (data.silos), each SuperNode is given its own silo (node config `silo`) and the run that config.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent / "project"  # the Flower project (pyproject.toml, dpfl_config.yaml)
CONNECTION = "dpfl-local"


@dataclass(frozen=True)
class Secure:
    """TLS and node authentication (docs/flower.md): the files `dpfl flower keys` writes into `folder`."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def server_cert(self) -> Path:
        return self.folder / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.folder / "server.key"

    def node_key(self, i: int) -> Path:
        return self.folder / f"node{i}"  # OpenSSH private key; node{i}.pub its public key

    def node_public(self, i: int) -> Path:
        return self.folder / f"node{i}.pub"


def _q(path: Path | str) -> str:
    return shlex.quote(str(path))


UNQUOTABLE = set("\"'$`\\\n")  # characters a path may not hold to be printed inside the commands' quotes


def guide(nodes: int = 3, port: int = 9092, project: Path = PROJECT, folder: Path | None = None,
          secure: Secure | None = None, dpfl: str = "dpfl", config: Path | None = None,
          silos: Sequence[str] | None = None) -> str:
    """Shell commands: a SuperLink, `nodes` SuperNodes (partition-id 0..nodes-1), `flwr run`, `dpfl flower check`.

    folder: the federation's directory (Flower's CLI configuration, the run directories); default ./dpfl-flower.
    secure: TLS between SuperLink and SuperNodes (and `flwr`) and SuperNode authentication, else --insecure.
    config: the dpfl config the run gets (run config `config`), instead of the project's; silos: one file or folder
    per node (node config `silo`), the user's own data of that config."""
    if silos is not None and len(silos) != nodes:
        raise ValueError(f"{len(silos)} silos for {nodes} SuperNodes: one each")
    for path in [*(silos or ()), *([str(config)] if config is not None else [])]:
        if UNQUOTABLE & set(str(path)):
            raise ValueError(f"{path}: a path with quotes, $, ` or \\ cannot be printed in the commands; move or "
                             "link it")
    folder = (folder or Path("dpfl-flower")).expanduser().resolve()
    project = Path(project).expanduser().resolve()
    home = folder / "flwr"
    link = f"127.0.0.1:{port}"
    lines = [
        f"# dpfl on Flower on this machine: a SuperLink, {nodes} SuperNode{'s' * (nodes != 1)} (one per dpfl client), "
        "the run, its check.",
        f"# --nodes {nodes} sets both sides: the SuperNodes below (partition-id 0..{nodes - 1}) and the run's clients "
        f"(run config nodes={nodes}).",
        "# Every path is absolute: each command runs from any directory. The SuperLink and each SuperNode run in a "
        "terminal of their own; steps 2, 4 and 5 share one.",
    ]
    if secure is None:
        lines += ["# --insecure: no TLS, no node authentication; for a test on one machine only (docs/flower.md: "
                  "`dpfl flower guide --secure DIR`)."]
        link_tls = "--insecure"
        node_tls = ["--insecure"]
    else:
        lines += [
            "",
            "# 0. certificates and keys: a CA, the SuperLink's certificate for 127.0.0.1/localhost, one key pair per "
            "SuperNode (kept if there)",
            f"{dpfl} flower keys {_q(secure.folder)} --nodes {nodes}",
        ]
        link_tls = (f"--ssl-ca-certfile {_q(secure.ca)} --ssl-certfile {_q(secure.server_cert)} "
                    f"--ssl-keyfile {_q(secure.server_key)} --enable-supernode-auth")
        node_tls = [f"--root-certificates {_q(secure.ca)} --auth-supernode-private-key {_q(secure.node_key(i))}"
                    for i in range(nodes)]
    lines += [
        "",
        "# 1. the SuperLink (the server's side; Fleet, Control and Runtime APIs on one port), in its own terminal",
        f"flower-superlink {link_tls} --port {port} --disable-runtime-dependency-installation",
        "",
        "# 2. in another terminal, for steps 2, 4 and 5: Flower's CLI reads the SuperLink's address from "
        "$FLWR_HOME/config.toml,",
        "#    here this federation's own file (~/.flwr is left alone)",
        f"export FLWR_HOME={_q(home)}",
        'mkdir -p "$FLWR_HOME" && cat > "$FLWR_HOME/config.toml" <<\'TOML\'',
        "[superlink]",
        f'default = "{CONNECTION}"',
        "",
        f"[superlink.{CONNECTION}]",
        f'address = "{link}"',
        *(["insecure = true"] if secure is None else [f'root-certificates = "{secure.ca}"']),
        "TOML",
    ]
    if secure is not None:
        lines += ["#    register each SuperNode's public key with the SuperLink (a node whose key is not registered is "
                  "refused)"]
        lines += [f"flwr supernode register {_q(secure.node_public(i))} {CONNECTION}" for i in range(nodes)]
    lines += ["", "# 3. one SuperNode per dpfl client (partition-id = the dpfl client id), each in its own terminal"]
    if silos is not None:
        lines += ["#    each reads only its own silo (silo=...; on another machine: the path there) and checks it "
                  "against the config's data.schema"]
    for i in range(nodes):
        tls = node_tls[0] if secure is None else node_tls[i]
        own = f' silo="{silos[i]}"' if silos is not None else ""
        lines.append(f"flower-supernode {tls} --superlink {link} --port {port + 10 + i} "
                     f"--node-config 'partition-id={i}{own}'")
    run_config = f"nodes={nodes} out=\\\"$OUT\\\"" + (f" config=\\\"{config}\\\"" if config is not None else "")
    lines += [
        "",
        "# 4. submit the run (step 2's terminal, once 1 and 3 are up); --stream shows the ServerApp's progress",
        f"OUT={_q(folder)}/run-$(date +%Y%m%d-%H%M%S)",
        f"flwr run {_q(project)} {CONNECTION} --stream --run-config \"{run_config}\"",
        "",
        "# 5. the verdict: the privacy report of the finished run (exit 0), or why it failed (exit 1); `flwr run` "
        "exits 0 either way",
        f'{dpfl} flower check "$OUT"',
        "",
        "# stop: Ctrl+C (or kill -TERM <pid>) each SuperNode, then the SuperLink; a SuperNode's flower-superexec and "
        "ClientApp processes end with it",
    ]
    return "\n".join(lines)

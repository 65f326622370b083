"""`dpfl flower`: run a dpfl config as a Flower app (the dpfl[flower] extra; docs/flower.md): the commands that
start a local federation (`guide`), the certificates and keys of a secure one (`keys`), and the verdict on a run
(`check`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dpfl.cli.common import console, errors, fail, user_errors

flower_app = typer.Typer(no_args_is_help=True, help="Run a dpfl config as a Flower app (the dpfl\\[flower] extra; "
                         "docs/flower.md).")


def _require_flwr() -> None:
    from dpfl.flower import FlowerMissing, require_flwr

    try:
        require_flwr()
    except FlowerMissing as e:
        fail(str(e))


@flower_app.command("guide")
def flower_guide(
    nodes: Annotated[Optional[int], typer.Option(help="SuperNodes = dpfl clients: the guide starts this many "
                                                      "SuperNodes (partition-id 0..nodes-1) and the run gets as many "
                                                      "clients (run config nodes, which sets data.clients); default 3, "
                                                      "or one per silo of --config.")] = None,
    config: Annotated[Optional[Path], typer.Option(help="The dpfl config to run instead of the project's; with the "
                                                        "user's own files (data.silos) each SuperNode reads only its "
                                                        "own silo (node config silo=PATH).")] = None,
    port: Annotated[int, typer.Option(help="The SuperLink's port (Fleet, Control and Runtime APIs).")] = 9092,
    folder: Annotated[Optional[Path], typer.Option("--dir", help="The federation's directory: Flower's CLI "
                                                   "configuration and the run directories (default ./dpfl-flower, "
                                                   "printed as an absolute path).")] = None,
    project: Annotated[Optional[Path], typer.Option(help="The Flower project directory (pyproject.toml, dpfl "
                                                         "config); default: the one dpfl ships.")] = None,
    secure: Annotated[Optional[Path], typer.Option("--secure", help="TLS and SuperNode authentication with the "
                                                   "certificates and keys in this folder (`dpfl flower keys` "
                                                   "writes them); default: --insecure, for a local test only.")]
    = None,
) -> None:
    """Print the commands of a local federation: SuperLink, SuperNodes, `flwr run`, `dpfl flower check`."""
    from dpfl.flower.guide import PROJECT, Secure, guide

    _require_flwr()
    silos = None
    if config is not None:
        config = config.expanduser().resolve()
        silos = _silo_paths(config)
        if silos is not None:
            if nodes is not None and nodes != len(silos):
                fail(f"--nodes {nodes}, but {config.name} lists {len(silos)} silos (data.silos): one SuperNode each")
            nodes = len(silos)
    nodes = 3 if nodes is None else nodes
    if nodes < 1 or not 0 < port < 65536 - 10 - nodes:
        fail(f"--nodes must be >= 1 and --port a free port below {65536 - 10 - nodes}")
    project = (project or PROJECT).expanduser().resolve()
    if not (project / "pyproject.toml").is_file():
        fail(f"--project {project} is not a Flower project (no pyproject.toml)")
    try:
        text = guide(nodes, port, project, folder, Secure(secure.expanduser().resolve()) if secure else None,
                     config=config, silos=silos)
    except ValueError as e:
        fail(str(e))
    console.print(text, markup=False, highlight=False)


def _silo_paths(config: Path) -> list[str] | None:
    """The config's silo paths (absolute, as `load_config` resolves them), or None for one of dpfl's datasets."""
    from dpfl.data.silos import FILES
    from dpfl.experiment.config import load_config

    try:
        cfg = load_config(config)
    except user_errors() as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    if cfg.data.dataset != FILES or cfg.data.silos is None:
        return None
    return [s if isinstance(s, str) else s.path for s in cfg.data.silos]


@flower_app.command("keys")
def flower_keys(
    folder: Annotated[Path, typer.Argument(help="Where to write them (created; nothing there is "
                                                "overwritten).")],
    nodes: Annotated[int, typer.Option(help="Key pairs to write, one per SuperNode (node0 .. node<nodes-1>).")] = 3,
    host: Annotated[Optional[list[str]], typer.Option(help="Another name or address the SuperLink's certificate is "
                                                           "valid for (repeatable; 127.0.0.1, ::1 and localhost "
                                                           "always are).")] = None,
) -> None:
    """Write a local CA, the SuperLink's TLS certificate and one authentication key pair per SuperNode (what is
    there already is kept: the step can run again)."""
    from dpfl.flower.keys import write_keys

    if nodes < 1:
        fail("--nodes must be >= 1")
    where = folder.expanduser().resolve()
    try:
        written, kept = write_keys(where, nodes, tuple(host or ()))
    except FileExistsError as e:
        fail(str(e))
    console.print(f"{where}: wrote {', '.join(p.name for p in written) or 'nothing'}"
                  + (f"; kept {', '.join(p.name for p in kept)}" if kept else ""), markup=False, highlight=False)


@flower_app.command("check")
def flower_check(
    out: Annotated[Path, typer.Argument(help="The run directory (run config `out`).")],
    wait: Annotated[float, typer.Option(help="Seconds to wait for the run to finish or fail.")] = 10.0,
) -> None:
    """Exit 0 and print the privacy report if the Flower run in OUT finished; exit 1 with the reason if it failed
    or has not finished (`flwr run` itself exits 0 either way)."""
    from dpfl.flower.verdict import verdict
    from dpfl.results.outcome import print_outcome

    finished, why = verdict(out.expanduser(), wait=max(wait, 0.0))
    if not finished:
        errors.print(f"error: {why}", markup=False, highlight=False)
        raise typer.Exit(1)
    print_outcome(out.expanduser(), console)

"""`dpfl flower`: run a dpfl config as a Flower app (the dpfl[flower] extra; docs/flower.md): the commands that
start a local federation."""

from __future__ import annotations

from typing import Annotated

import typer

from dpfl.cli.common import console, fail

flower_app = typer.Typer(no_args_is_help=True, help="Run a dpfl config as a Flower app (the dpfl[flower] extra; "
                         "docs/flower.md).")


@flower_app.command("guide")
def flower_guide(
    nodes: Annotated[int, typer.Option(help="SuperNodes to start: one per dpfl client (the config's "
                                            "data.clients).")] = 3,
    port: Annotated[int, typer.Option(help="The SuperLink's port (Fleet, Control and Runtime APIs).")] = 9092,
    project: Annotated[str, typer.Option(help="The Flower project directory (pyproject.toml, dpfl "
                                              "config).")] = "examples/flower",
) -> None:
    """Print the commands that start a local federation: SuperLink, SuperNodes, `flwr run`."""
    from dpfl.flower import FlowerMissing, require_flwr
    from dpfl.flower.guide import guide

    try:
        require_flwr()
    except FlowerMissing as e:
        fail(str(e))
    if nodes < 1 or not 0 < port < 65536 - 10 - nodes:
        fail(f"--nodes must be >= 1 and --port a free port below {65536 - 10 - nodes}")
    console.print(guide(nodes, port, project), markup=False, highlight=False)

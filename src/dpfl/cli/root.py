"""The `dpfl` command itself: the top-level commands and the command groups, each from its module, in the order
`dpfl --help` lists them."""

from __future__ import annotations

import typer

from dpfl.cli.attack import attack_app
from dpfl.cli.audit import audit
from dpfl.cli.bench import bench_app
from dpfl.cli.data import data_app
from dpfl.cli.flower import flower_app
from dpfl.cli.privacy import privacy_app
from dpfl.cli.reproduce import reproduce_app
from dpfl.cli.results import compare, confidence, report
from dpfl.cli.run import demo, run

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Differentially private federated learning with per-client privacy ledgers.")

app.command()(run)
app.command()(demo)
app.command()(report)
app.command()(compare)
app.command()(confidence)
app.command()(audit)
app.add_typer(privacy_app, name="privacy")
app.add_typer(data_app, name="data")
app.add_typer(attack_app, name="attack")
app.add_typer(reproduce_app, name="reproduce")
app.add_typer(bench_app, name="bench")
app.add_typer(flower_app, name="flower")

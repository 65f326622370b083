"""`dpfl bench`: measure the cost of dpfl's protocols on this machine (one secure-aggregation round against a plain
sum, `dpfl.algorithms.secure.benchmark`)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from dpfl.cli.common import console, fail, user_errors
from dpfl.results.json_output import emit_json

bench_app = typer.Typer(no_args_is_help=True, help="Measure the cost of dpfl's protocols on this machine.")


@bench_app.command("secagg")
def bench_secagg(
    clients: Annotated[int, typer.Option(help="Clients in the round.")] = 100,
    dim: Annotated[int, typer.Option(help="Parameters per upload (float32).")] = 1_000_000,
    dropout: Annotated[float, typer.Option(help="Share of clients that drop out.")] = 1 / 3,
    stage: Annotated[str, typer.Option(help="Stage they drop before: advertise_keys, share_keys, masked_input "
                                            "(the costly one for the server) or unmasking.")] = "masked_input",
    threshold: Annotated[Optional[int], typer.Option(help="Shamir threshold t (default floor(n/2) + 1).")] = None,
    ring_bits: Annotated[int, typer.Option(help="Ring Z/2^k: 32 or 64.")] = 64,
    frac_bits: Annotated[Optional[int], typer.Option(help="Fixed-point fractional bits (default 32, or 16 for a "
                                                          "32-bit ring).")] = None,
    workers: Annotated[int, typer.Option(help="Server processes for rebuilding masks.")] = 1,
    seed: Annotated[int, typer.Option(help="Data and dropout seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Time one secure-aggregation round (real key agreement, shares and masks; no network) against a plain sum."""
    from dpfl.algorithms.secure.benchmark import run_secagg_benchmark

    for name, value in (("clients", clients), ("dim", dim), ("workers", workers)):
        if value < 1:
            fail(f"--{name} must be >= 1, got {value}")
    try:
        out = run_secagg_benchmark(clients, dim, dropout, stage, threshold, ring_bits, frac_bits, workers, seed)
    except user_errors() as e:
        fail(str(e))
    if as_json:
        emit_json(out)
        return
    table = Table(title=f"secure aggregation: {clients} clients x {dim} parameters, {out['dropped']} dropped before "
                        f"{stage} (t = {out['threshold']}, {ring_bits}-bit ring)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for label, value in (("server seconds", f"{out['server_seconds']:.3f}"),
                         ("  plain float32 sum", f"{out['plain_sum_seconds']:.4f}"),
                         ("client seconds (slowest)", f"{out['client_seconds_max']:.3f}"),
                         ("client seconds (mean)", f"{out['client_seconds_mean']:.3f}"),
                         ("upload bytes per client", f"{out['upload_bytes_per_client']:,}"),
                         ("  plain float32 upload", f"{out['plain_upload_bytes_per_client']:,}"),
                         ("max |error| of the sum", f"{out['max_abs_error']:.3g} (bound {out['error_bound']:.3g})")):
        table.add_row(label, value)
    console.print(table)

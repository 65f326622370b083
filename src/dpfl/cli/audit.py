"""`dpfl audit`: an empirical lower bound on a run's epsilon (canaries, one run) next to the one it reports
(`dpfl.evaluate.audit`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dpfl.cli.common import UserError, fail, say, user_errors
from dpfl.results.formatting import format_epsilon
from dpfl.results.json_output import emit_json


def audit(
    config: Annotated[Path, typer.Argument(help="YAML config of the run to audit.")],
    canaries: Annotated[int, typer.Option(help="Canaries (clients or records), each included with "
                                               "probability 1/2.")] = 200,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a field (repeatable).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write OUT/audit.json too.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Empirical lower bound on the run's epsilon (canaries of its unit, one run, 95% confidence) next to the reported
    one: canary clients for client-level mechanisms and non-private runs, canary records for sample-level ones."""
    from dpfl.evaluate.audit import audit_config
    from dpfl.experiment.config import load_config
    from dpfl.results.run_files import write_json_atomic

    try:
        if canaries < 2:
            raise UserError(f"--canaries must be >= 2, got {canaries}")
        if out is not None and (out / "audit.json").exists():
            raise UserError(f"{out / 'audit.json'} already exists (choose another --out)")
        cfg = load_config(config, list(set_ or []))
        result = audit_config(cfg, canaries)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(out / "audit.json", result)
    except user_errors() as e:
        fail(str(e).splitlines()[0])
    if as_json:
        emit_json(result)
        return
    reported = result["epsilon_reported"]
    say(f"{cfg.name}: {result['unit']}-level audit with {result['canaries']} canaries ({result['included']} "
        f"included), {result['rounds_run']} rounds")
    say(f"empirical lower bound eps >= {result['epsilon_lower_bound']:.3f} at {result['confidence']:.0%} confidence "
        f"(delta {result['delta']:g}; {result['correct']} of {result['guesses']} guesses right)")
    if reported is None:
        say("reported: none (the run is not private)")
    else:
        verdict = ("REFUTED: the run leaks more than it reports" if result["refuted"] else
                   "consistent (the attack did not refute the claim; this does not show the reported epsilon is tight)")
        say(f"reported eps = {format_epsilon(reported)}: {verdict}")

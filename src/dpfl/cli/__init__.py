"""The `dpfl` command: run private federated experiments, inspect privacy, data and results.

User errors (bad config, bad arguments, missing data, an existing run directory) print one line to
stderr and exit with code 2; only bugs show a traceback.

One module per command or group, each holding its commands, their options and the checks of their arguments, over
library functions: `run` (run, demo), `results` (report, compare, confidence), `privacy`, `data`, `reproduce` (the
grid families and merge) with `reproduce_studies` (splitting, mpdp, attacks, fdp-sensitivity) and
`reproduce_options` (their shared options), `audit`, `attack`, `bench` and `flower`; `root` assembles them into
`app`, `common` holds the consoles and the user errors. What they print lives in ``dpfl.results`` (``outcome``: a
finished run; ``fdp_output``: f-DP curves; ``json_output``: --json).
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from dpfl.cli.common import USAGE_ERROR, errors, notices_as_lines
from dpfl.cli.root import app

__all__ = ["app", "main"]


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: click's usage errors become one line on stderr with exit code 2."""
    try:  # typer >= 0.2x vendors click; older versions use click itself
        from typer._click import exceptions as click_errors
    except ImportError:  # pragma: no cover
        from click import exceptions as click_errors
    aborts = (getattr(click_errors, "Abort", typer.Abort), typer.Abort)  # Ctrl-C at a prompt, from either click

    try:
        with notices_as_lines():
            code = app(args=argv, prog_name="dpfl", standalone_mode=False)
    except click_errors.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `dpfl` or `dpfl privacy`: show the help
            errors.print(e.format_message(), markup=False, highlight=False)
            sys.exit(USAGE_ERROR)
        hint = f" (see: {e.ctx.command_path} --help)" if e.ctx is not None else ""
        errors.print(f"error: {e.format_message()}{hint}", markup=False, highlight=False)
        sys.exit(USAGE_ERROR)
    except aborts:
        errors.print("aborted", markup=False)
        sys.exit(130)
    except click_errors.ClickException as e:
        errors.print(f"error: {e.format_message()}", markup=False, highlight=False)
        sys.exit(e.exit_code)
    sys.exit(code or 0)

"""Run the `dpfl` CLI in-process and capture its exit code, stdout and stderr (shared by the CLI tests)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

from dpfl.cli import main


def cli(*args: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()

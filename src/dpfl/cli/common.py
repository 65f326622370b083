"""What every command group shares: the consoles and the user errors (one line on stderr, exit code 2)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console

console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)

USAGE_ERROR = 2
RUN_FAILED = 1  # the run ran and failed (it diverged): its directory holds what it did


class UserError(Exception):
    """An error the user can fix; printed as one line, exit code 2."""


def fail(message: str) -> NoReturn:
    """Print `error: message` on stderr and exit with code 2."""
    errors.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(USAGE_ERROR)


@contextmanager
def notices_as_lines() -> Iterator[None]:
    """A run's notices (`RunNotice`: what its configuration means that a user may not expect) as one `note:` line
    on stderr each, instead of Python's two-line warning; other warnings as Python shows them."""
    from dpfl.experiment.run_checks import RunNotice

    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202
            if issubclass(category, RunNotice):
                errors.print(f"note: {message}", markup=False, highlight=False, soft_wrap=True)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def user_errors():
    """The exception types that are the user's to fix (validated input, files, existing runs)."""
    from dpfl.data.errors import DatasetNotFoundError

    return (UserError, ValueError, FileNotFoundError, DatasetNotFoundError)


def say(text: str) -> None:
    """One line on stdout as it is (no markup, no highlighting)."""
    console.print(text, markup=False, highlight=False)

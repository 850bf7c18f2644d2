"""Shared terminal output and the one-line error convention for every `tide` command."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer
from pydantic import ValidationError
from rich.console import Console

from services.settings import StackSettings
from spark_jobs.model.errors import TidelineError
from spark_jobs.model.settings import one_line

console = Console()
errors = Console(stderr=True, soft_wrap=True)


@contextmanager
def user_errors(exit_code: int = 1, also: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Turn every TidelineError (and `also` these) into one red line and `exit_code` (no traceback for users)."""
    handled: tuple[type[Exception], ...] = (TidelineError, *also)  # docs/errors.md
    try:
        yield
    except handled as exc:
        errors.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(exit_code) from exc
    except ValidationError as exc:
        errors.print(f"[red]error:[/red] {one_line(exc, 'TIDE_')}", highlight=False)
        raise typer.Exit(exit_code) from exc


def load_settings() -> StackSettings:
    with user_errors():
        return StackSettings()


def reporter() -> Callable[[str, str], None]:
    def report(name: str, state: str) -> None:
        console.print(f"  [bold]{name:<14}[/bold] {state}", highlight=False)

    return report


@contextmanager
def terminated_as_exit() -> Iterator[None]:
    """SIGTERM (a `kill`, a CI job's timeout) ends a long command through its tear-down, as Ctrl-C
    does (`tide chaos` stops its driver and connector, `tide bench` its stack); Python's default
    ends it on the spot and leaves those running."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

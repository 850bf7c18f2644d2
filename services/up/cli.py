"""`tide up` and `tide down`: the whole pipeline with a progress display, then how to use it; `tide serve`:
one of its processes in the foreground, as a container runs it."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column

from services.capture import objects
from services.console import console, errors, load_settings, reporter, user_errors
from services.settings import ENV_FILE, StackSettings
from services.stack import runner
from services.stack.runner import Report
from services.up import lifecycle, usage

INTERRUPTED_EXIT = 130  # the shell's code for a command ended by SIGINT


class StepsDisplay:
    """One row per step: waiting, then the latest progress report with a spinner, then what is true."""

    def __init__(self, progress: Progress, plan: list[lifecycle.Step]) -> None:
        self.progress = progress
        self.current: TaskID | None = None
        self.rows: dict[str, TaskID] = {
            step.name: progress.add_task("[dim]waiting", step=step.name, total=1, start=False) for step in plan
        }

    def begin(self, step: str) -> Report:
        row = self.current = self.rows[step]
        self.progress.start_task(row)
        self.progress.update(row, description="starting")

        def report(name: str, state: str) -> None:
            self.progress.update(row, description=f"{name}: {state}")

        return report

    def done(self, step: str, detail: str) -> None:
        self.progress.update(self.rows[step], completed=1, description=f"[green]{detail}[/green]")

    def ended(self, how: str) -> None:
        """The step under way ended otherwise (failed, interrupted): say so and stop the display."""
        if self.current is not None:
            self.progress.update(self.current, description=how)
        self.progress.stop()


def up_command(
    demo: Annotated[
        bool, typer.Option("--demo", help="Also load the small demo data set (skipped if customers has rows).")
    ] = False,
) -> None:
    """Bring the whole pipeline up: stack, migrations, connector, Spark jobs, query API. Idempotent."""
    settings = load_settings()
    with user_errors():
        plan = lifecycle.steps(settings, demo)
    began = time.monotonic()
    columns = (
        SpinnerColumn(finished_text="[green]✓[/green]"),
        TextColumn("[bold]{task.fields[step]}", table_column=Column(min_width=10, no_wrap=True)),
        TextColumn("{task.description}", table_column=Column(ratio=1, overflow="fold")),
        TimeElapsedColumn(),
    )
    with user_errors(), Progress(*columns, console=console) as progress:
        display = StepsDisplay(progress, plan)
        try:
            lifecycle.up(settings, plan, display)
        except lifecycle.Interrupted as exc:
            display.ended("[yellow]interrupted[/yellow]")
            what = f"stopped what it had started ({exc})" if exc.stopped else "had started nothing"
            errors.print(f"[red]interrupted:[/red] tide up {what}", highlight=False)
            raise typer.Exit(INTERRUPTED_EXIT) from None
        except Exception:
            display.ended("[red]failed[/red] (what runs stays up: `tide stack status`, `tide down`)")
            raise
    console.print(f"[green]Tideline is up[/green] in {time.monotonic() - began:.0f}s. "
                  f"Stop everything with: {tide_path()} down", highlight=False, soft_wrap=True)
    print_usage(settings)


def tide_path() -> str:
    """How to call `tide` again from any folder: the script next to this Python, else from PATH."""
    script = Path(sys.executable).parent / "tide"
    return shlex.quote(str(script)) if script.exists() else "tide"


def print_usage(settings: StackSettings) -> None:
    with user_errors():
        pipeline = objects.load_pipeline(settings)
    for section in usage.sections(settings, pipeline, ENV_FILE):
        console.print()
        console.print(section.title, highlight=False, markup=False, soft_wrap=True)
        for command in section.commands:
            # Never wrapped or styled: these lines are pasted as they are.
            console.out(f"  {command}", highlight=False)


def down_command() -> None:
    """Stop everything `tide up` started: the API, the jobs, then the stack. Data stays."""
    settings = load_settings()
    with user_errors():
        stopped = lifecycle.down(settings, reporter())
    console.print("everything stopped" if stopped else "nothing was running")


ServiceName = Annotated[str, typer.Argument(help=", ".join(service.name for service in lifecycle.SERVED))]


def serve_command(service: ServiceName) -> None:
    """Run one of the processes `tide up` starts in the foreground until it stops: a container's command.

    The same preparation, command and health probe as `tide up`; the probe keeps running, and the
    container's health check reads its last pass (docs/docker.md). Exits with the process's code."""
    settings = load_settings()
    with user_errors():
        chosen = lifecycle.process_named(service)
        code = runner.serve(settings, chosen, reporter())
    raise typer.Exit(code)

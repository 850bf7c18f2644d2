"""`tide stack ...`: run the real services as local processes."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from services.console import console, load_settings, reporter, user_errors
from services.stack import jars, process, runner

stack_app = typer.Typer(help="Run PostgreSQL, Redis, Kafka, Kafka Connect and Elasticsearch as local processes.")

Services = Annotated[list[str] | None, typer.Argument(help="Services to act on (default: all).", show_default=False)]


@stack_app.command()
def fetch(
    class_archive: Annotated[bool, typer.Option(
        help="Also write the Spark driver's class archive (a faster start for every driver; docs/apply.md).")] = True,
) -> None:
    """Resolve every JVM jar bundle with Maven (done by `make setup`; `up` then needs no network)."""
    settings = load_settings()
    with user_errors():
        for name in jars.BUNDLES:
            console.print(f"resolving {name} jars")
            jars.ensure(settings, name)
        if class_archive:
            jars.write_class_archive(settings, say=console.print)


@stack_app.command()
def up(services: Services = None) -> None:
    """Start the services (idempotent) and wait until each is healthy."""
    settings = load_settings()
    began = time.monotonic()
    with user_errors():
        runner.up(settings, services, report=reporter())
    console.print(f"[green]stack healthy[/green] in {time.monotonic() - began:.0f}s")
    _print_status(settings)


@stack_app.command()
def down(
    services: Services = None,
    purge: Annotated[bool, typer.Option(help="Also delete the state folder (all data and logs).")] = False,
) -> None:
    """Stop the processes the stack started; data stays unless --purge."""
    settings = load_settings()
    with user_errors():
        runner.down(settings, services, report=reporter())
    if purge:
        process.purge(settings.state_dir)
        console.print(f"removed {settings.state_dir}")


@stack_app.command()
def status() -> None:
    """Show each service with pid, port and health."""
    settings = load_settings()
    if not _print_status(settings):
        raise typer.Exit(1)


@stack_app.command()
def logs(
    service: Annotated[str, typer.Argument(help="Service whose log to print.")],
    lines: Annotated[int, typer.Option("--lines", "-n", min=1)] = 50,
    follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
) -> None:
    """Print the end of a service's log (its path is shown by `status`)."""
    settings = load_settings()
    with user_errors():
        (selected,) = [s for s in runner.select(settings, [service]) if s.name == service]
    path = runner.log_file(settings, selected)
    if not path.exists():
        console.print(f"no log yet at {path}")
        raise typer.Exit(1)
    with open(path, errors="replace") as handle:
        for line in handle.readlines()[-lines:]:
            console.out(line.rstrip("\n"), highlight=False)
        while follow:
            line = handle.readline()
            if line:
                console.out(line.rstrip("\n"), highlight=False)
            else:
                time.sleep(0.5)  # poll: waiting for the log to grow


def _print_status(settings) -> bool:
    table = Table("service", "pid", "port", "health", "log")
    rows = runner.status(settings)
    for row in rows:
        detail = row.detail if len(row.detail) <= 60 else row.detail[:57] + "..."
        health = f"[green]healthy[/green] {detail}" if row.healthy else f"[red]down[/red] {detail}"
        table.add_row(row.name, str(row.pid or "-"), str(row.port or "-"), health, str(row.log))
    console.print(table)
    return all(row.healthy for row in rows)

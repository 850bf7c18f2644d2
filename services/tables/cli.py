"""`tide tables add | remove`: capture a table, or stop capturing it, in one command while everything runs."""

from __future__ import annotations

from typing import Annotated

import typer

from services.capture.connector import snapshot
from services.console import console, load_settings, user_errors
from services.tables import ops

tables_app = typer.Typer(help="Capture one more table, or one fewer, while everything runs.")


def _say(line: str) -> None:
    console.print(f"  {line}", highlight=False)


@tables_app.command()
def add(
    table: Annotated[str, typer.Argument(help="A table of the source schema, with a primary key.")],
    search: Annotated[list[str] | None, typer.Option(
        "--search", help="A column to search as full text (repeatable). Default: its text columns.")] = None,
    no_search: Annotated[bool, typer.Option("--no-search", help="No search view.")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="No cache view.")] = False,
    no_warehouse: Annotated[bool, typer.Option("--no-warehouse", help="No warehouse view.")] = False,
    history: Annotated[bool, typer.Option(help="Keep an SCD2 history table in the warehouse.")] = False,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for the snapshot's rows.")] =
        snapshot.DEFAULT_TIMEOUT_S,
) -> None:
    """Capture TABLE: pipeline.yaml, publication, connector, the running jobs, then a snapshot of its rows."""
    settings = load_settings()
    choice = ops.ViewChoice(search=not no_search, text=search, cache=not no_cache, warehouse=not no_warehouse,
                            history=history)
    with user_errors():
        pipeline = ops.add(settings, table, choice, _say)
        plan = snapshot.prepare(settings, pipeline, table)
        result = snapshot.execute_with_bar(settings, pipeline, plan, timeout)
    console.print(f"[green]{table} captured[/green]: {result.emitted} existing rows snapshotted; the views fill as "
                  "the jobs apply them (`tide status`), then `tide verify --table " + table + "`", highlight=False)


@tables_app.command()
def remove(table: Annotated[str, typer.Argument(help="A table in pipeline.yaml.")]) -> None:
    """Stop capturing TABLE: connector, publication, pipeline.yaml, the running jobs. Its views and topic stay."""
    settings = load_settings()
    with user_errors():
        ops.remove(settings, table, _say)
    console.print(f"[green]{table} no longer captured[/green]", highlight=False)

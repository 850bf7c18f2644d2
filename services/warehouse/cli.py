"""`tide warehouse optimize`: the Delta sinks' table maintenance (services/warehouse/maintenance.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from services.console import console, load_settings, user_errors
from services.warehouse import maintenance
from spark_jobs.sinks.delta.maintenance import DEFAULT_RETAIN_HOURS

warehouse_app = typer.Typer(help="The Delta tables of the warehouse and analytics sinks.")

SinkOption = Annotated[list[str] | None, typer.Option(
    "--sink", help="warehouse or analytics (repeatable); both when not given")]
RetainOption = Annotated[float, typer.Option(
    help="vacuum keeps the files of versions this recent, and older versions stop being readable")]


@warehouse_app.command()
def optimize(sink: SinkOption = None, retain_hours: RetainOption = DEFAULT_RETAIN_HOURS) -> None:
    """Compact every Delta table of the warehouse and analytics sinks, then delete the files no version
    within the retention reads. Their queries pause meanwhile; search and cache run on."""
    settings = load_settings()
    with user_errors():
        sinks = maintenance.check_sinks(sink)
        maintenance.check_retention(retain_hours)
        maintenance.optimize(settings, sinks, retain_hours, lambda line: console.print(line, highlight=False))

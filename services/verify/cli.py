"""`tide verify`: reconcile the views with PostgreSQL and print one summary row per (table, sink).

Exit codes follow diff(1): 0 every view matches, 1 divergences found, 2 verify
could not run (a store unreachable, bad settings or pipeline file).
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from services.console import console, user_errors
from services.settings import StackSettings
from services.verify import Outcome, reconcile_views
from spark_jobs.model.config import load
from spark_jobs.model.settings import SINKS
from spark_jobs.model.sink_registry import spec_of

EXIT_CLEAN, EXIT_DIVERGED, EXIT_FAILED = 0, 1, 2

# The declared sinks (spark_jobs/model/sink_registry.py) as the option's choices; a derived one (analytics)
# is verified as its history and window tables. Built at import, so mypy cannot list the members.
SinkChoice = enum.StrEnum("SinkChoice", [(sink, sink) for sink in SINKS])  # type: ignore[misc]


def verify_command(
    table: Annotated[
        list[str] | None, typer.Option("--table", "-t", help="Only this table (repeatable). Default: every table.")
    ] = None,
    sink: Annotated[
        list[SinkChoice] | None, typer.Option("--sink", "-s", help="Only this view (repeatable). Default: all.")
    ] = None,
    examples: Annotated[int, typer.Option(min=0, max=1000, help="Example keys shown per kind of divergence.")] = 5,
    elasticsearch_url: Annotated[
        str | None, typer.Option(help="Elasticsearch to verify. Default: the local stack's.")
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option(help="Redis to verify, with its db. Default: the local stack's.")
    ] = None,
    warehouse_dir: Annotated[
        Path | None, typer.Option(help="Folder of the Delta tables. Default: the local stack's.")
    ] = None,
) -> None:
    """Compare every row of PostgreSQL with each view: missing, extra and different rows.

    Exit code 0 when every view matches, 1 on any divergence, 2 if verify could not run.
    """
    with user_errors(exit_code=EXIT_FAILED):
        settings = StackSettings()
        outcomes = reconcile_views(
            settings,
            tables=table,
            sinks=[spec_of(choice.value).name for choice in sink] if sink else None,  # typed as declared names
            es_url=elasticsearch_url,
            redis_url=redis_url,
            warehouse_dir=warehouse_dir,
            pipeline=load(settings.pipeline_file),
            examples=examples,
            on_outcome=_progress,
        )
    console.print(summary(outcomes))
    diverged = [outcome for outcome in outcomes if not outcome.clean]
    if diverged:
        console.print(examples_table(diverged))
        console.print(f"[red]{len(diverged)} of {len(outcomes)} views diverge from PostgreSQL[/red]")
        raise typer.Exit(EXIT_DIVERGED)
    console.print(f"[green]all {len(outcomes)} views match PostgreSQL[/green]")


def _progress(outcome: Outcome) -> None:
    state = "[green]ok[/green]" if outcome.clean else "[red]diverges[/red]"
    note = f" ({outcome.note})" if outcome.note else ""
    console.print(f"  {outcome.table} → {outcome.sink}: {outcome.source_rows} rows, {state}{note}", highlight=False)


def summary(outcomes: list[Outcome]) -> Table:
    """One row per (table, sink): row counts on each side and the count of each kind of divergence
    found (all kinds in one column, so the table fits a narrow terminal)."""
    table = Table(title="tide verify", box=box.SIMPLE_HEAD)
    table.add_column("table", overflow="fold")  # a long name wraps rather than lose its unique suffix
    table.add_column("sink")
    table.add_column("pg rows", justify="right")
    table.add_column("sink rows", justify="right")
    table.add_column("result")
    for outcome in outcomes:
        found = ", ".join(f"{d.kind} {d.count}" for d in outcome.divergences)
        result = f"[red]{found}[/red]" if found else "[green]ok[/green]"
        table.add_row(outcome.table, outcome.sink, str(outcome.source_rows), str(outcome.sink_rows), result)
    return table


def examples_table(outcomes: list[Outcome]) -> Table:
    """Example doc ids per kind of each diverging (table, sink): a separate table, so long ids wrap
    in their own wide column instead of squeezing the counts."""
    table = Table("table", "sink", "kind", "example doc ids", title="examples", box=box.SIMPLE_HEAD)
    for outcome in outcomes:
        for divergence in outcome.divergences:
            more = divergence.count - len(divergence.examples)
            shown = ", ".join(escape(example) for example in divergence.examples)
            shown += f" (+{more} more)" if more > 0 else ""
            table.add_row(outcome.table, outcome.sink, divergence.kind, shown)
    return table

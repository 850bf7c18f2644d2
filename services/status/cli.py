"""`tide status [--watch]`: the source and every sink's figures as terminal tables (docs/status.md)."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from services.console import console, load_settings, user_errors
from services.settings import StackSettings
from services.status.collect import collect
from services.status.figures import SinkFigures, Status, TableFigures, age_s
from spark_jobs.model.config import load

STATE_STYLE = {"running": "green", "RUNNING": "green", "paused": "yellow", "PAUSED": "yellow"}


def format_age(seconds: float | None) -> str:
    """An age for a table cell: 0.8s, 42s, 3m05s, 2h07m; '-' when unknown."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _styled(state: str) -> str:
    return f"[{STATE_STYLE.get(state, 'red')}]{state}[/]"


def _freshness_cells(figures: SinkFigures | TableFigures, now_ms: int) -> list[str]:
    return [
        "-" if figures.records_behind is None else str(figures.records_behind),
        "-" if figures.dead_letters is None else str(figures.dead_letters),
        format_age(age_s(now_ms, figures.newest_applied_commit_ms)),
        format_age(age_s(now_ms, figures.oldest_unapplied_commit_ms)),
    ]


def sinks_table(status: Status) -> Table:
    """One row per sink (its totals), then one per table. `tide jobs status` shows this table."""
    table = Table("sink", "query", "records behind", "dead letters", "newest applied", "oldest unapplied",
                  "last error", title="sinks")
    for sink in status.sinks:
        table.add_row(sink.sink, _styled(sink.state), *_freshness_cells(sink, status.taken_at_ms),
                      (sink.last_error or "")[:80])
        for figures in sink.tables:
            table.add_row(f"  {figures.table}", "", *_freshness_cells(figures, status.taken_at_ms), "")
        if sink.follow_up_behind is not None:  # lookups, not changes: the nested views' own query
            table.add_row("  nested views", "", str(sink.follow_up_behind), "-", "-", "-", "")
    return table


def source_table(status: Status) -> Table:
    source = status.source
    table = Table("source", "state", "detail", title="source")
    table.add_row(f"connector {source.connector}", _styled(source.connector_state), "")
    for task in source.tasks:
        table.add_row(f"  task {task.id}", _styled(task.state), (task.error or "")[:80])
    if not source.slot_found:
        table.add_row(f"slot {source.slot}", "[red]unknown[/]" if source.slot_found is None else "[red]absent[/]", "")
    else:
        state = "active" if source.slot_active else "[yellow]inactive[/]"
        table.add_row(f"slot {source.slot}", "[red]lost[/]" if source.slot_wal_status == "lost" else state,
                      f"lag {source.slot_lag_bytes} bytes, wal_status {source.slot_wal_status}")
    return table


def problems_text(status: Status) -> str:
    lines = [f"[yellow]warning:[/yellow] {warning}" for warning in status.source.warnings]
    return "\n".join([*lines, *(f"[red]cannot read:[/red] {problem}" for problem in status.problems)])


def render(status: Status) -> Group:
    return Group(source_table(status), sinks_table(status), problems_text(status))


def read(settings: StackSettings) -> Status:
    with user_errors():
        return collect(settings, load(settings.pipeline_file))


def status_command(
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh the tables until Ctrl-C.")] = False,
    interval: Annotated[float, typer.Option(min=0.5, max=3600, help="Seconds between refreshes with --watch.")] = 2.0,
) -> None:
    """Source (connector, tasks, replication slot) and every sink's lag, freshness, dead letters and state."""
    settings = load_settings()
    if not watch:
        console.print(render(read(settings)))
        return
    with Live(render(read(settings)), console=console, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval)  # the refresh period the user asked for
                live.update(render(read(settings)), refresh=True)
        except KeyboardInterrupt:
            pass


def jobs_status_command() -> None:
    """Each sink's query: state, records behind, dead letters, freshness, last error (see `tide status`)."""
    console.print(sinks_table(read(load_settings())))

"""`tide connector ...`: register, inspect and restart the Debezium PostgreSQL connector."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from services.capture import objects
from services.capture.connector import registration
from services.capture.connector.connect_api import ConnectApi
from services.console import console, load_settings, user_errors
from services.stack import kafka

connector_app = typer.Typer(help="The Debezium PostgreSQL connector in Kafka Connect.")


@connector_app.command()
def apply(
    wait: Annotated[float, typer.Option(help="Seconds to wait for the connector and its task to run.")] = 60.0,
) -> None:
    """Create or update the connector from connectors/tideline-postgres.json and pipeline.yaml (idempotent)."""
    settings = load_settings()
    with user_errors():
        pipeline = objects.load_pipeline(settings)
        registration.apply(settings, pipeline, wait_s=wait)
    console.print(f"connector [bold]{pipeline.source.connector}[/bold] running; tables: {', '.join(pipeline.tables)}")


@connector_app.command()
def status() -> None:
    """Connector and task state, and the replication slot as PostgreSQL sees it."""
    settings = load_settings()
    with user_errors():
        pipeline = objects.load_pipeline(settings)
        with ConnectApi(kafka.connect_url(settings)) as api:
            state = api.status(pipeline.source.connector)
        slot = registration.slot_state(settings, pipeline.source.slot)
    table = Table("what", "state", "detail")
    if state is None:
        table.add_row(f"connector {pipeline.source.connector}", "[red]absent[/red]", "run `tide connector apply`")
    else:
        table.add_row(f"connector {pipeline.source.connector}", state["connector"]["state"],
                      state["connector"]["worker_id"])
        for task in state["tasks"]:
            trace = (task.get("trace") or "").strip().splitlines()
            table.add_row(f"task {task['id']}", task["state"], trace[0][:80] if trace else "")
    if slot is None:
        table.add_row(f"slot {pipeline.source.slot}", "[red]absent[/red]", "created on first connector start")
    else:
        table.add_row(
            f"slot {pipeline.source.slot}",
            "active" if slot.active else "[yellow]inactive[/yellow]",
            f"lag {slot.lag_bytes} bytes, wal_status {slot.wal_status}",
        )
    console.print(table)
    if state is None or state["connector"]["state"] != "RUNNING":
        raise typer.Exit(1)


@connector_app.command()
def restart() -> None:
    """Restart the connector and its tasks (e.g. after a FAILED task or a changed CDC password)."""
    settings = load_settings()
    with user_errors():
        pipeline = objects.load_pipeline(settings)
        with ConnectApi(kafka.connect_url(settings)) as api:
            registration.require_resumable(settings, api, pipeline)
            api.restart(pipeline.source.connector)
            registration.wait_running(api, pipeline.source.connector, 60.0)
    console.print(f"connector {pipeline.source.connector} restarted and running")


@connector_app.command()
def delete(
    drop_slot: Annotated[
        bool, typer.Option(help="Also drop the replication slot (next apply snapshots again).")
    ] = False,
) -> None:
    """Remove the connector (topics stay)."""
    settings = load_settings()
    with user_errors():
        pipeline = objects.load_pipeline(settings)
        existed = registration.delete(settings, pipeline, drop_slot=drop_slot)
    console.print(f"connector {pipeline.source.connector} {'deleted' if existed else 'was not registered'}")

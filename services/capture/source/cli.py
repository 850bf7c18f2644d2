"""`tide init` (pipeline.yaml from a schema) and `tide source check | setup | sql` (the source's side of capture)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import psycopg
import typer

from services.capture import objects
from services.capture.source import dba, introspect, preflight
from services.capture.source import setup as source_setup
from services.console import console, load_settings, user_errors
from services.db.cli import first_line
from services.settings import StackSettings
from services.stack import postgres
from services.stack.service import StackError

source_app = typer.Typer(help="The source PostgreSQL's side of capture: preflight, the objects capture needs, "
                              "the SQL for a DBA.")


def connect(settings: StackSettings) -> psycopg.Connection:
    try:
        return psycopg.connect(postgres.conninfo(settings))
    except psycopg.OperationalError as exc:
        raise StackError(f"cannot connect to PostgreSQL at {postgres.address(settings)}: {first_line(exc)} "
                         "(check TIDE_POSTGRES_URL)") from exc


@source_app.command()
def check() -> None:
    """Run the preflight checks against pipeline.yaml; change nothing. Exit 1 with one line per problem."""
    settings = load_settings()
    with user_errors():
        pipeline = objects.load_pipeline(settings)
        with connect(settings) as conn:
            found = preflight.require_ready(conn, settings, pipeline)
    console.print(f"[green]preflight passed[/green] for {postgres.address(settings)}: wal_level {found.wal_level}, "
                  f"{found.max_replication_slots - found.slots_used} free slot(s), "
                  f"{found.max_wal_senders - found.senders_used} free WAL sender(s), "
                  f"max_slot_wal_keep_size {found.max_slot_wal_keep_mb} MB, {len(found.tables)} table(s) ready",
                  highlight=False)


@source_app.command()
def setup() -> None:
    """Preflight, then make what capture needs (CDC role, grants, signal and heartbeat tables,
    publication), each step stated. Never creates or alters your tables. Idempotent."""
    settings = load_settings()
    with user_errors():
        source_setup.run(settings, objects.load_pipeline(settings), lambda line: console.print(f"  {line}",
                                                                                           highlight=False))


@source_app.command()
def sql() -> None:
    """Print the SQL that makes what capture needs, for a DBA to run by hand (the password is a psql variable)."""
    settings = load_settings()
    with user_errors():
        pipeline = objects.load_pipeline(settings)
    console.out(dba.script(settings, pipeline, settings.postgres_db), highlight=False)


def init_command(
    schema: Annotated[str, typer.Option(help="The schema whose tables to capture.")] = "public",
    output: Annotated[Path | None, typer.Option(help="Where to write. Default: TIDE_PIPELINE_FILE.")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite the file if it exists.")] = False,
) -> None:
    """Write pipeline.yaml from a schema: every table with a primary key, each with search, cache and
    warehouse views; the tables left out are listed with the reason."""
    settings = load_settings()
    path = output or settings.pipeline_file
    with user_errors():
        if path.exists() and not force:
            raise StackError(f"{path} exists: pass --force to overwrite it, or --output (or TIDE_PIPELINE_FILE) "
                             "to write another file")
        with connect(settings) as conn:
            choice = introspect.choose(introspect.read(conn, schema))
        if not choice.captured:
            raise StackError(f"no table of schema {schema} in {postgres.address(settings)} can be captured"
                             + "".join(f"; {name}: {why}" for name, why in choice.skipped.items()))
        path.write_text(introspect.render(schema, choice))
    console.print(f"wrote {path}: {len(choice.captured)} table(s) captured", highlight=False)
    for name, views in choice.captured.items():
        text = ", ".join(views.search.text) if views.search and views.search.text else "none"
        console.print(f"  [green]{name}[/green]: search (full text: {text}), cache, warehouse", highlight=False)
    for name, why in choice.skipped.items():
        console.print(f"  [yellow]skipped {name}[/yellow]: {why}", highlight=False)
    console.print("next: `tide up` (or `tide source check` first)", highlight=False)

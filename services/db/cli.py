"""`tide db ...`: apply, undo and inspect the database migrations (demo schema and CDC prerequisites)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import psycopg
import typer

from services.console import console, load_settings, user_errors
from services.settings import StackSettings
from services.stack import process
from services.stack.service import StackError

db_app = typer.Typer(help="Migrate the PostgreSQL database: demo tables, CDC role, publication.")


@db_app.command()
def migrate(
    revision: Annotated[str, typer.Option(help="Revision to upgrade to.")] = "head",
) -> None:
    """Apply migrations (idempotent); also re-applies the CDC role password and publication table list."""
    settings = load_settings()
    with user_errors(), database_errors(settings):
        from services.db import (
            migrate,  # here, not at import time: `tide stack ...` need not load SQLAlchemy and Alembic
        )

        require_own_database(settings)
        migrate.upgrade(settings, revision)
        _print_current(settings)


@db_app.command()
def downgrade(
    revision: Annotated[str, typer.Argument(help='Revision to go down to ("base" removes every Tideline object).')],
) -> None:
    """Undo migrations down to REVISION."""
    settings = load_settings()
    with user_errors(), database_errors(settings):
        from services.db import migrate

        require_own_database(settings)
        migrate.downgrade(settings, revision)
        _print_current(settings)


@db_app.command()
def current() -> None:
    """Show the revision the database is at."""
    settings = load_settings()
    with user_errors(), database_errors(settings):
        _print_current(settings)


def require_own_database(settings: StackSettings) -> None:
    """Migrations create and drop the demo schema: never in a database Tideline does not own."""
    if settings.source_external:
        raise StackError("TIDE_POSTGRES_URL names your own database, which Tideline never migrates: "
                         "`tide source setup` makes only what capture needs (docs/own-database.md)")


def _print_current(settings: StackSettings) -> None:
    from services.db import migrate

    at, head = migrate.current(settings), migrate.head()
    suffix = " (head)" if at == head else f" (head is {head})"
    console.print(f"database {settings.postgres_db} at revision {at}{suffix}", highlight=False)


@contextmanager
def database_errors(settings: StackSettings) -> Iterator[None]:
    """Database and Alembic failures as one-line StackErrors, for user_errors to print."""
    from alembic.util import CommandError
    from sqlalchemy.exc import DBAPIError, OperationalError

    try:
        yield
    except OperationalError as exc:  # could not connect (or lost the connection)
        host = settings.host_of("postgres")
        where = f"{host}:{settings.postgres_port}"
        if not process.port_in_use(host, settings.postgres_port):
            raise StackError(
                f"cannot reach PostgreSQL at {where}: {first_line(exc.orig)} "
                "— is the stack up? (`tide stack up postgres`)"
            ) from exc
        # Something listens there but said no: wrong credentials, or not our server.
        raise StackError(
            f"PostgreSQL at {where} refused the connection: {first_line(exc.orig)} "
            "— check TIDE_POSTGRES_USER and TIDE_POSTGRES_PASSWORD in .env (or TIDE_POSTGRES_PORT)"
        ) from exc
    except DBAPIError as exc:
        raise StackError(f"migration failed: {first_line(exc.orig)}") from exc
    except psycopg.Error as exc:  # from services.capture.objects, which talks to psycopg directly
        raise StackError(f"migration failed: {first_line(exc)}") from exc
    except CommandError as exc:  # e.g. an unknown revision
        raise StackError(f"alembic: {exc}") from exc


def first_line(exc: BaseException | None) -> str:
    """The first line of an error's message (drivers append hints and context lines), else its type."""
    if exc is None:
        return "(no message)"
    return (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]

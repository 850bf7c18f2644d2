"""Alembic's entry point, run by `services.db.migrate.upgrade/downgrade` (and by the alembic CLI).

Settings come from `config.attributes["settings"]` when called from Python, or
from the environment / `.env` (StackSettings) when the alembic CLI runs it. A
connection passed in `config.attributes["connection"]` is used as is, so the
caller owns the transaction.
"""

from __future__ import annotations

from alembic import context
from alembic.util import CommandError
from sqlalchemy import Connection

from migrations.models import Base
from services.db.migrate import engine
from services.settings import StackSettings

config = context.config
# The alembic CLI passes no settings: read them like every other entry point.
settings: StackSettings = config.attributes.get("settings") or StackSettings()
config.attributes["settings"] = settings


def run() -> None:
    if context.is_offline_mode():
        # 0002 reads the live catalogue (existing roles, tables) and hashes the
        # password with the server's client library: there is no SQL script to print.
        raise CommandError("offline (--sql) migrations are not supported: run `tide db migrate`")
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    with engine(settings).connect() as connection:
        _migrate(connection)


def _migrate(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata)
    with context.begin_transaction():
        context.run_migrations()


run()

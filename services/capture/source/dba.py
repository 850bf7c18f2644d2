"""The capture prerequisites as one SQL script, for a DBA who must run them by hand (`tide source sql`).

The same objects `services.capture.source.setup` makes, from the same settings and pipeline.yaml; the CDC
role's password is a psql variable, so it is never written into the script.
"""

from __future__ import annotations

from psycopg import sql

from services.capture import objects
from services.settings import StackSettings
from spark_jobs.model.config import PipelineConfig

_HEADER = """\
-- Tideline's capture prerequisites for database {database} (printed by `tide source sql`).
-- Run as a superuser (or the tables' owner with CREATEROLE and REPLICATION), e.g.:
--   psql -v cdc_password="$TIDE_CDC_PASSWORD" -d {database} -f tideline-objects.sql
-- Server settings, if preflight reports them (wal_level needs a restart, the cap a reload):
--   ALTER SYSTEM SET wal_level = logical;
--   ALTER SYSTEM SET max_slot_wal_keep_size = '2GB';
-- The replication slot is created by the connector on its first start.
"""


def _text(statement: sql.Composable) -> str:
    return statement.as_string(None) + ";"


def script(settings: StackSettings, pipeline: PipelineConfig, database: str) -> str:
    """The whole script: role, schema and support tables, grants, publication."""
    role = sql.Identifier(settings.cdc_user)
    captured = sql.SQL(", ").join(sql.Identifier(s, t) for s, t in objects.captured_tables(pipeline))
    support = sql.SQL(", ").join(sql.Identifier(s, t) for s, t in objects.support_tables(pipeline))
    statements = [
        sql.SQL("CREATE ROLE {} WITH LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS "
                "PASSWORD :'cdc_password'").format(role),
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), role),
        *objects.support_statements(pipeline),
        *(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), role)
          for schema in objects.schemas(pipeline)),
        sql.SQL("GRANT SELECT ON {} TO {}").format(captured, role),
        sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(support, role),
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {}, {} WITH (publish = {})").format(
            sql.Identifier(pipeline.source.publication), captured, support, sql.Literal(objects.PUBLISH)),
    ]
    return _HEADER.format(database=database) + "\n".join(map(_text, statements)) + "\n"

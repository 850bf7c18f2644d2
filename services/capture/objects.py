"""Capture prerequisites in PostgreSQL: the CDC role, its grants, and the publication.

Each function *sets* state to what settings and pipeline.yaml say (not "adds
to it"), is idempotent, and runs inside the caller's transaction, so callers
(migration 0002, `tide db migrate`, `tide connector apply`) can run them any
number of times. They take a plain psycopg connection: inside Alembic use
`op.get_bind().connection.driver_connection`.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import sql

from services.settings import StackSettings
from services.stack.rows import scalar
from services.stack.service import StackError
from spark_jobs.model.config import PipelineConfig, PipelineConfigError, load

log = logging.getLogger(__name__)

# Debezium's signalling table (ad-hoc and incremental snapshots; Debezium also
# writes its incremental-snapshot watermarks here) and the table its heartbeat
# action query upserts. Both are published so their changes move the slot.
SIGNAL_TABLE = "debezium_signal"
HEARTBEAT_TABLE = "tideline_heartbeat"
PUBLISH = "insert, update, delete, truncate"


class CaptureError(StackError):
    """A capture prerequisite cannot be set up as configured; the message names the fix."""


def load_pipeline(settings: StackSettings) -> PipelineConfig:
    """The pipeline file (TIDE_PIPELINE_FILE), with its error turned into a one-line user error."""
    try:
        return load(settings.pipeline_file)
    except PipelineConfigError as exc:  # already one line naming the file and the field
        raise CaptureError(str(exc)) from exc


def captured_tables(config: PipelineConfig) -> list[tuple[str, str]]:
    """(schema, table) for every table pipeline.yaml captures."""
    return [(config.source.schema_name, table) for table in config.tables]


def support_tables(config: PipelineConfig) -> list[tuple[str, str]]:
    """The signal and heartbeat tables: published too, and written by the CDC role."""
    schema = config.source.support_schema_name
    return [(schema, SIGNAL_TABLE), (schema, HEARTBEAT_TABLE)]


def schemas(config: PipelineConfig) -> list[str]:
    """The captured tables' schema, then the support tables' if it is another."""
    return list(dict.fromkeys([config.source.schema_name, config.source.support_schema_name]))


def published_tables(config: PipelineConfig) -> list[tuple[str, str]]:
    return captured_tables(config) + support_tables(config)


def _names(tables: list[tuple[str, str]]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(schema, table) for schema, table in tables)


def apply(conn: psycopg.Connection, settings: StackSettings, config: PipelineConfig) -> None:
    """Role, grants and publication in line with settings and pipeline.yaml (called by 0002 and every migrate)."""
    sync_role(conn, settings)
    sync_grants(conn, settings.cdc_user, config)
    sync_publication(conn, config)
    sync_replica_identity(conn, config)


# The support tables as migration 0002 creates them, for a database Tideline does not migrate.
_SUPPORT_DDL = {
    SIGNAL_TABLE: "id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048)",
    HEARTBEAT_TABLE: "id integer PRIMARY KEY, beat_at timestamptz NOT NULL",
}


def support_statements(config: PipelineConfig) -> list[sql.Composed]:
    """CREATE SCHEMA / TABLE IF NOT EXISTS for the signal and heartbeat tables (idempotent)."""
    schema = config.source.support_schema_name
    return [
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)),
        *(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(sql.Identifier(schema, table), sql.SQL(columns))
          for table, columns in _SUPPORT_DDL.items()),
    ]


def ensure_support_tables(conn: psycopg.Connection, config: PipelineConfig) -> None:
    for statement in support_statements(config):
        conn.execute(statement)


def sync_role(conn: psycopg.Connection, settings: StackSettings) -> None:
    """Create the CDC role, or reset its attributes and password: LOGIN REPLICATION, never superuser.

    The password is hashed client-side (libpq's SCRAM) so the plaintext is never
    part of a statement the server could log.
    """
    role = settings.cdc_user
    if role in (settings.postgres_user, _current_user(conn)):
        raise CaptureError(
            f"TIDE_CDC_USER ({role}) must not be the database owner (TIDE_POSTGRES_USER): "
            "Debezium gets its own least-privilege role"
        )
    verifier = conn.pgconn.encrypt_password(
        settings.require_cdc_password().encode(), role.encode(), b"scram-sha-256"
    ).decode()
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    verb = "ALTER" if exists else "CREATE"
    conn.execute(
        sql.SQL(
            "{verb} ROLE {role} WITH LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS PASSWORD {pw}"
        ).format(verb=sql.SQL(verb), role=sql.Identifier(role), pw=sql.Literal(verifier))
    )


def sync_grants(conn: psycopg.Connection, role: str, config: PipelineConfig) -> None:
    """Exactly what Debezium needs in this schema, no more.

    SELECT on captured tables (the initial and incremental snapshots read
    them); SELECT/INSERT/UPDATE on the signal table (watermarks) and the
    heartbeat table (the heartbeat upsert). Table grants in the schema are
    revoked first, so a table dropped from pipeline.yaml loses its grant.
    """
    who = sql.Identifier(role)
    database = sql.Identifier(conn.info.dbname)
    conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(database, who))
    for schema in map(sql.Identifier, schemas(config)):
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, who))
        conn.execute(sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}").format(schema, who))
    conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(_names(captured_tables(config)), who))
    conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO {}").format(_names(support_tables(config)), who))


def revoke_grants(conn: psycopg.Connection, role: str, config: PipelineConfig) -> None:
    """Undo sync_grants (used before dropping the role)."""
    who = sql.Identifier(role)
    for schema in map(sql.Identifier, schemas(config)):
        conn.execute(sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}").format(schema, who))
        conn.execute(sql.SQL("REVOKE USAGE ON SCHEMA {} FROM {}").format(schema, who))
    conn.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(sql.Identifier(conn.info.dbname), who))


def sync_publication(conn: psycopg.Connection, config: PipelineConfig) -> None:
    """Make the publication publish exactly pipeline.yaml's tables plus the signal and heartbeat tables.

    Creates it if missing, else `ALTER PUBLICATION ... SET TABLE` (atomic:
    tables outside the list are dropped from it). Debezium should then run
    with `publication.autocreate.mode=disabled`: its role owns no tables and
    could not alter the publication anyway. A missing table is a CaptureError
    naming it (run migrations first, or fix pipeline.yaml).
    """
    tables = published_tables(config)
    found = _existing(conn, tables)
    missing = [f"{s}.{t}" for s, t in tables if (s, t) not in found]
    if missing:
        raise CaptureError(
            f"cannot publish {', '.join(missing)}: no such table (run `tide db migrate`, or fix pipeline.yaml)"
        )
    name = sql.Identifier(config.source.publication)
    table_list = _names(tables)
    exists = conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (config.source.publication,)).fetchone()
    if exists:
        conn.execute(sql.SQL("ALTER PUBLICATION {} SET TABLE {}").format(name, table_list))
        conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish = {})").format(name, sql.Literal(PUBLISH)))
    else:
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = {})").format(
                name, table_list, sql.Literal(PUBLISH)
            )
        )


_REPLICA_IDENTITY = {"default": "d", "full": "f"}  # pipeline.yaml value -> pg_class.relreplident


def sync_replica_identity(conn: psycopg.Connection, config: PipelineConfig) -> None:
    """Each captured table's REPLICA IDENTITY as pipeline.yaml says (only where it differs)."""
    schema = config.source.schema_name
    for table, views in config.tables.items():
        row = conn.execute(
            "SELECT c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (schema, table),
        ).fetchone()
        if row is not None and row[0] != _REPLICA_IDENTITY[views.replica_identity]:
            conn.execute(
                sql.SQL("ALTER TABLE {} REPLICA IDENTITY {}").format(
                    sql.Identifier(schema, table), sql.SQL(views.replica_identity.upper())
                )
            )


def drop_publication(conn: psycopg.Connection, config: PipelineConfig) -> None:
    conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(config.source.publication)))


def drop_role(conn: psycopg.Connection, role: str, config: PipelineConfig) -> None:
    """Revoke what Tideline granted, then drop the role, unless it is still used elsewhere.

    Roles are cluster-wide: if the role still holds privileges or owns objects
    (another database of the cluster, or something an admin gave it), the
    DROP fails; that is rolled back to a savepoint and the role is kept with a
    warning, rather than DROP OWNED destroying what Tideline did not create.
    """
    if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
        return
    revoke_grants(conn, role, config)
    try:
        with conn.transaction():  # a savepoint inside the migration's transaction
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    except psycopg.errors.DependentObjectsStillExist as exc:
        log.warning("kept role %s: it is still used elsewhere (%s)", role, str(exc).splitlines()[0])


def _existing(conn: psycopg.Connection, tables: list[tuple[str, str]]) -> set[tuple[str, str]]:
    rows = conn.execute(
        "SELECT schemaname, tablename FROM pg_tables WHERE schemaname = ANY(%s) AND tablename = ANY(%s)",
        (sorted({s for s, _ in tables}), [t for _, t in tables]),
    ).fetchall()
    return {(schema, table) for schema, table in rows}


def _current_user(conn: psycopg.Connection) -> str:
    return scalar(conn, "SELECT current_user")

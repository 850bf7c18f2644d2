"""What preflight needs to know about the source, read in one place (pure data afterwards).

Everything is read as the user Tideline connects as (TIDE_POSTGRES_URL's, or TIDE_POSTGRES_USER):
only catalogue views and settings every role may read, so reading never fails for lack of privileges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from services.capture import objects
from services.stack.rows import scalar
from spark_jobs.model.config import PipelineConfig


@dataclass(frozen=True)
class Role:
    name: str
    superuser: bool
    create_role: bool
    replication: bool
    login: bool


@dataclass(frozen=True)
class Table:
    """A table pipeline.yaml captures, as the catalogue has it."""

    schema: str
    name: str
    has_primary_key: bool
    replica_identity: str  # pg_class.relreplident: d(efault), f(ull), i(ndex), n(othing)
    owner: str
    owned_by_me: bool  # the connecting user owns it (or is a member of its owner)
    cdc_can_select: bool
    published: bool  # already in the publication

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


# server_version_num from which a CREATEROLE role that has REPLICATION may give it to another role.
CREATEROLE_GRANTS_REPLICATION_FROM = 160000


@dataclass(frozen=True)
class SourceFacts:
    database: str
    server_version: int  # server_version_num, e.g. 150004
    wal_level: str
    max_replication_slots: int
    slots_used: int
    max_wal_senders: int
    senders_used: int
    # max_slot_wal_keep_size in MB; -1 = unbounded; None on a server without the setting (before 13).
    max_slot_wal_keep_mb: int | None
    slot_exists: bool
    slot_active: bool  # the connector streams from it now (through a WAL sender of its own)
    me: Role
    cdc: Role | None  # None: the CDC role does not exist yet
    tables: dict[str, Table]  # by bare name; a table pipeline.yaml names but the schema lacks is absent
    support_tables_exist: bool
    can_create_schema: bool  # CREATE on the database (for the support schema, when it is missing)
    publication_exists: bool

    @property
    def may_grant_replication(self) -> bool:
        """Whether the connecting user may give a role REPLICATION: a superuser; from PostgreSQL 16 on,
        also a CREATEROLE role that has REPLICATION itself (before 16, "must be superuser to create
        replication users")."""
        me = self.me
        return me.superuser or (self.createrole_grants_replication and me.create_role and me.replication)

    @property
    def createrole_grants_replication(self) -> bool:
        return self.server_version >= CREATEROLE_GRANTS_REPLICATION_FROM


_ROLE = "SELECT rolname, rolsuper, rolcreaterole, rolreplication, rolcanlogin FROM pg_roles WHERE rolname = %s"

_TABLES = """
SELECT c.relname,
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       c.relreplident, pg_get_userbyid(c.relowner), pg_has_role(current_user, c.relowner, 'USAGE'),
       CASE WHEN %(cdc_exists)s THEN has_table_privilege(%(cdc)s, c.oid, 'SELECT') ELSE false END,
       EXISTS (SELECT 1 FROM pg_publication_tables p
               WHERE p.pubname = %(publication)s AND p.schemaname = n.nspname AND p.tablename = c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p') AND c.relname = ANY(%(tables)s)
"""


def _setting(conn: psycopg.Connection, name: str) -> str | None:
    row = conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()
    return row[0] if row else None


def _role(conn: psycopg.Connection, name: str) -> Role | None:
    row = conn.execute(_ROLE, (name,)).fetchone()
    return Role(*row) if row else None


def _one(conn: psycopg.Connection, query: str, *args: object) -> Any:
    return scalar(conn, query, args)


def read(conn: psycopg.Connection, cdc_user: str, pipeline: PipelineConfig) -> SourceFacts:
    """The facts preflight checks, for `pipeline` captured by `cdc_user`."""
    source = pipeline.source
    me = _role(conn, scalar(conn, "SELECT current_user"))
    if me is None:  # never: the role this session runs as is in pg_roles
        raise psycopg.ProgrammingError("the connected user has no row in pg_roles")
    cdc = _role(conn, cdc_user)
    rows = conn.execute(_TABLES, {"cdc_exists": cdc is not None, "cdc": cdc_user, "publication": source.publication,
                                  "schema": source.schema_name, "tables": list(pipeline.tables)}).fetchall()
    support = objects.support_tables(pipeline)
    found_support = scalar(
        conn,
        "SELECT count(*) FROM pg_tables "
        "WHERE (schemaname, tablename) IN (SELECT * FROM unnest(%s::text[], %s::text[]))",
        ([s for s, _ in support], [t for _, t in support]),
    )
    # pg_settings gives max_slot_wal_keep_size in MB (its unit) on every server that has it (13 and later).
    keep = conn.execute("SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'").fetchone()
    return SourceFacts(
        database=conn.info.dbname,
        server_version=conn.info.server_version,
        wal_level=_setting(conn, "wal_level") or "",
        max_replication_slots=int(_setting(conn, "max_replication_slots") or 0),
        slots_used=_one(conn, "SELECT count(*) FROM pg_replication_slots"),
        max_wal_senders=int(_setting(conn, "max_wal_senders") or 0),
        senders_used=_one(conn, "SELECT count(*) FROM pg_stat_replication"),
        max_slot_wal_keep_mb=keep[0] if keep else None,
        slot_exists=_one(conn, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)", source.slot),
        slot_active=_one(conn, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND active)",
                         source.slot),
        me=me,
        cdc=cdc,
        tables={row[0]: Table(source.schema_name, *row) for row in rows},
        support_tables_exist=found_support == len(support),
        can_create_schema=_one(conn, "SELECT has_database_privilege(current_database(), 'CREATE')"),
        publication_exists=_one(conn, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %s)",
                                source.publication),
    )

"""Preflight: everything capture needs from the source, checked before anything is created or
registered; one line per problem, each naming its fix.

The checks CDC tools run against PostgreSQL: logical WAL, a free replication slot and WAL sender, a
cap on the WAL a stalled slot may hold, a role that may replicate, and captured tables that can be
keyed and published. `problems` is pure (facts in, lines out) so every message is unit-tested;
`require_ready` reads the facts and raises them all at once.
"""

from __future__ import annotations

import psycopg
from psycopg.conninfo import make_conninfo

from services.capture.source import facts
from services.capture.source.facts import SourceFacts
from services.db.cli import first_line
from services.settings import StackSettings
from services.stack import postgres
from services.stack.service import StackError
from spark_jobs.model.config import PipelineConfig

RESTART = "then restart PostgreSQL"
DBA_SQL = "`tide source sql` prints what a DBA can run instead"
_IDENTITY = {"n": "NOTHING", "i": "USING INDEX", "d": "DEFAULT", "f": "FULL"}


class PreflightError(StackError):
    """The source is not ready for capture; the message has one line per problem with its fix."""

    def __init__(self, where: str, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"preflight found {len(problems)} problem(s) in {where}; nothing was registered:\n{lines}")


def server_problems(found: SourceFacts) -> list[str]:
    """WAL level, slots, WAL senders and the slot WAL cap."""
    problems = []
    if found.wal_level != "logical":
        problems.append(f"wal_level is {found.wal_level}, not logical: nothing can be decoded from the WAL; "
                        f"run ALTER SYSTEM SET wal_level = logical; {RESTART}")
    if not found.slot_exists and found.slots_used >= found.max_replication_slots:
        problems.append(f"max_replication_slots is {found.max_replication_slots}, all {found.slots_used} in use: "
                        f"Tideline needs one slot; run ALTER SYSTEM SET max_replication_slots = "
                        f"{found.slots_used + 4}; {RESTART} (or drop an unused slot)")
    if not found.slot_active and found.senders_used >= found.max_wal_senders:  # an active slot has its sender
        problems.append(f"max_wal_senders is {found.max_wal_senders}, all {found.senders_used} in use: the connector "
                        f"streams through one; run ALTER SYSTEM SET max_wal_senders = {found.senders_used + 4}; "
                        f"{RESTART}")
    if found.max_slot_wal_keep_mb == -1:
        problems.append("max_slot_wal_keep_size is -1 (unbounded): a stopped connector's slot would keep WAL until "
                        "the disk fills; run ALTER SYSTEM SET max_slot_wal_keep_size = '2GB'; SELECT pg_reload_conf();")
    return problems


def role_problems(found: SourceFacts, cdc_user: str) -> list[str]:
    """The CDC role may log in and replicate, or the connecting user may make it so."""
    me, cdc = found.me, found.cdc
    if (cdc is not None and cdc.replication and cdc.login) or found.may_grant_replication:
        return []
    missing = "does not exist" if cdc is None else "lacks " + " and ".join(
        attribute for attribute, held in (("REPLICATION", cdc.replication), ("LOGIN", cdc.login)) if not held)
    createrole = ", nor CREATEROLE with REPLICATION" if found.createrole_grants_replication else ""
    return [f"role {cdc_user} {missing}, and {me.name} may not grant the replication privilege (it is not a "
            f"superuser{createrole}): connect as a role that is, or have a DBA run "
            f"CREATE ROLE {cdc_user} WITH LOGIN REPLICATION ... ({DBA_SQL})"]


def table_problems(found: SourceFacts, pipeline: PipelineConfig, settings: StackSettings) -> list[str]:
    """Each captured table exists, is keyed, publishes its updates and deletes, and can be published."""
    problems = []
    create = "create it" if settings.source_external else "run `tide db migrate`"  # the demo's are migrated
    for name in pipeline.tables:
        table = found.tables.get(name)
        qualified = f"{pipeline.source.schema_name}.{name}"
        if table is None:
            problems.append(f"{qualified} does not exist: {create}, or remove it from pipeline.yaml "
                            f"(`tide tables remove {name}`)")
            continue
        if not table.has_primary_key:
            problems.append(f"{qualified} has no primary key: every view is keyed by it; add one "
                            f"(ALTER TABLE {qualified} ADD PRIMARY KEY (...)) or remove it from pipeline.yaml")
        if table.replica_identity == "n":
            problems.append(f"{qualified} has REPLICA IDENTITY NOTHING: once published, its updates and deletes would "
                            f"fail in your application; run ALTER TABLE {qualified} REPLICA IDENTITY DEFAULT")
        prepared = table.published and table.cdc_can_select  # by a DBA, for one who may not do it
        if not (prepared or table.owned_by_me or found.me.superuser):
            problems.append(f"{qualified} is owned by {table.owner}, not {found.me.name}: only its owner may publish "
                            f"it and let {settings.cdc_user} read it; connect as {table.owner}, or {DBA_SQL}")
    return problems


def support_problems(found: SourceFacts, pipeline: PipelineConfig) -> list[str]:
    """The signal and heartbeat tables exist or can be created."""
    if found.support_tables_exist or found.can_create_schema or found.me.superuser:
        return []
    schema = pipeline.source.support_schema_name
    return [f"the signal and heartbeat tables are missing from schema {schema}, and {found.me.name} may not create "
            f"a schema in database {found.database}: GRANT CREATE ON DATABASE {found.database} TO {found.me.name}, "
            f"or {DBA_SQL}"]


def problems(found: SourceFacts, settings: StackSettings, pipeline: PipelineConfig) -> list[str]:
    """Every problem, server first, then the role, then the tables."""
    return [*server_problems(found), *role_problems(found, settings.cdc_user),
            *table_problems(found, pipeline, settings), *support_problems(found, pipeline)]


def require_ready(conn: psycopg.Connection, settings: StackSettings, pipeline: PipelineConfig) -> SourceFacts:
    """The facts, if the source passes every check; else PreflightError with one line per problem."""
    found = facts.read(conn, settings.cdc_user, pipeline)
    if listed := problems(found, settings, pipeline):
        raise PreflightError(postgres.address(settings), listed)
    return found


def require_cdc_login(settings: StackSettings) -> None:
    """The CDC role logs in as the connector will (a logical replication connection): a wrong
    password or a pg_hba.conf that refuses it is found here, not in the connector's task."""
    conninfo = make_conninfo(postgres.conninfo(settings), user=settings.cdc_user,
                             password=settings.require_cdc_password(), replication="database")
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            # A walsender speaks the simple query protocol only: libpq's PQexec, not psycopg's execute.
            result = conn.pgconn.exec_(b"IDENTIFY_SYSTEM")
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise psycopg.OperationalError(result.error_message.decode(errors="replace"))
    except psycopg.Error as exc:
        raise PreflightError(postgres.address(settings), [
            f"{settings.cdc_user} cannot open a replication connection: {first_line(exc)}; check TIDE_CDC_PASSWORD "
            f"and that pg_hba.conf admits {settings.cdc_user} to database {settings.postgres_db}"]) from exc

"""What capture needs in the source, made so step by step, each step stated; nothing else is touched.

The CDC role (LOGIN REPLICATION), its grants, the signal and heartbeat tables, the publication; the
replication slot is the connector's to create on its first start. Each step looks first: what is
already as needed is left alone, so a database a DBA prepared by hand (`tide source sql`) is used as
it is, by a user who could not have made it. Tables pipeline.yaml captures are never created or
altered (but for REPLICA IDENTITY FULL, when pipeline.yaml asks for it).
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from services.capture import objects
from services.capture.source import preflight
from services.capture.source.facts import SourceFacts
from services.db.cli import first_line
from services.settings import StackSettings
from services.stack import postgres
from services.stack.service import StackError
from spark_jobs.model.config import PipelineConfig

Say = Callable[[str], None]


def _role(conn: psycopg.Connection, settings: StackSettings, found: SourceFacts) -> str:
    role = settings.cdc_user
    if found.may_grant_replication:
        objects.sync_role(conn, settings)
        verb = "set to" if found.cdc is not None else "created with"
        return f"role {role} {verb} LOGIN REPLICATION and TIDE_CDC_PASSWORD"
    return f"role {role} already has LOGIN REPLICATION (left as it is)"


def _support_tables(conn: psycopg.Connection, pipeline: PipelineConfig, found: SourceFacts) -> str:
    names = ", ".join(f"{schema}.{table}" for schema, table in objects.support_tables(pipeline))
    if found.support_tables_exist:
        return f"{names} already there"
    objects.ensure_support_tables(conn, pipeline)
    return f"created {names} (Debezium's signals and heartbeats)"


def _may_manage(found: SourceFacts) -> bool:
    """Whether the connecting user may publish and grant every captured table (owner or superuser)."""
    return found.me.superuser or all(table.owned_by_me for table in found.tables.values())


def _grants(conn: psycopg.Connection, settings: StackSettings, pipeline: PipelineConfig, found: SourceFacts) -> str:
    if not _may_manage(found):  # preflight saw every table readable by the CDC role already
        return f"{settings.cdc_user} may already read every captured table (grants left as they are)"
    objects.sync_grants(conn, settings.cdc_user, pipeline)
    return f"granted {settings.cdc_user} SELECT on {len(pipeline.tables)} table(s), and writes to the support tables"


def _publication(conn: psycopg.Connection, pipeline: PipelineConfig, found: SourceFacts) -> str:
    name = pipeline.source.publication
    if not _may_manage(found):  # preflight saw every table in the publication already
        return f"publication {name} already publishes every captured table (left as it is)"
    existed = found.publication_exists
    objects.sync_publication(conn, pipeline)
    objects.sync_replica_identity(conn, pipeline)
    done = "set to" if existed else "created for"
    return f"publication {name} {done} {len(pipeline.tables)} table(s) and the support tables"


def prepare(conn: psycopg.Connection, settings: StackSettings, pipeline: PipelineConfig,
            say: Say = lambda line: None) -> list[str]:
    """Preflight, then each capture object, in the caller's transaction; the lines said, in order.
    Raises PreflightError (nothing created) when the source is not ready."""
    found = preflight.require_ready(conn, settings, pipeline)
    said = ["preflight passed: wal_level logical, a free slot and WAL sender, "
            f"max_slot_wal_keep_size {found.max_slot_wal_keep_mb} MB, {len(pipeline.tables)} keyed table(s)"]
    say(said[0])
    for step in (lambda: _role(conn, settings, found), lambda: _support_tables(conn, pipeline, found),
                 lambda: _grants(conn, settings, pipeline, found), lambda: _publication(conn, pipeline, found)):
        said.append(step())
        say(said[-1])
    return said


def run(settings: StackSettings, pipeline: PipelineConfig, say: Say = lambda line: None) -> list[str]:
    """`prepare` on a connection of its own, in one transaction (a failed step leaves nothing half
    made), then the CDC role's replication login, tried as the connector will."""
    try:
        with psycopg.connect(postgres.conninfo(settings)) as conn:
            said = prepare(conn, settings, pipeline, say)
    except psycopg.Error as exc:
        raise StackError(f"preparing capture in {postgres.address(settings)} failed, nothing was kept: "
                         f"{first_line(exc)} ({preflight.DBA_SQL})") from exc
    preflight.require_cdc_login(settings)
    said.append(f"{settings.cdc_user} logs in for replication")
    say(said[-1])
    return said

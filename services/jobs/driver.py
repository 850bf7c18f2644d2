"""The Spark apply driver as a managed local process: settings in, pid file and log out."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psycopg

from services.settings import StackSettings
from services.stack import elasticsearch, jars, postgres
from services.stack.service import Service, StackError, Unhealthy
from spark_jobs.aggregates import Catalogue, ColumnInfo, TableInfo
from spark_jobs.config import load
from spark_jobs.settings import JobSettings

STATUS_STALE_S = 30.0


def job_env(settings: StackSettings) -> dict[str, str]:
    """TIDE_JOB_* for spark_jobs.settings.JobSettings, derived from the stack's settings."""
    state = settings.state_dir
    return {
        "TIDE_JOB_PIPELINE_FILE": str(settings.pipeline_file),
        "TIDE_JOB_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TIDE_JOB_ELASTICSEARCH_URL": elasticsearch.url(settings),
        "TIDE_JOB_REDIS_URL": f"redis://{settings.host_of('redis')}:{settings.redis_port}/{settings.job_redis_db}",
        "TIDE_JOB_WAREHOUSE_DIR": str(state / "warehouse"),
        "TIDE_JOB_CHECKPOINT_DIR": str(state / "checkpoints"),
        "TIDE_JOB_JARS_DIR": str(jars.bundle_dir(settings, "spark")),
        "TIDE_JOB_STATUS_FILE": str(status_file(settings)),
        "TIDE_JOB_PAUSED_FILE": str(paused_file(settings)),
        "TIDE_JOB_TRIGGER_INTERVAL": settings.job_trigger_interval,
        "TIDE_JOB_MAX_OFFSETS_PER_TRIGGER": str(settings.job_max_offsets_per_trigger),
        "TIDE_JOB_DRIVER_MEMORY": settings.job_driver_memory,
    }


def job_settings(settings: StackSettings) -> JobSettings:
    """The apply jobs' typed settings for this stack (what `job_env` hands the driver)."""
    env = job_env(settings)
    return JobSettings(**{key.removeprefix("TIDE_JOB_").lower(): value for key, value in env.items()})


def status_file(settings: StackSettings) -> Path:
    return settings.state_dir / "jobs" / "status.json"


def paused_file(settings: StackSettings) -> Path:
    return settings.state_dir / "jobs" / "paused.json"


def read_status(settings: StackSettings) -> dict | None:
    try:
        return json.loads(status_file(settings).read_text())
    except (FileNotFoundError, ValueError):
        return None


def probe(settings: StackSettings) -> str:
    """Healthy once the driver reports every query active, recently."""
    status = read_status(settings)
    if status is None:
        raise Unhealthy("driver has not reported yet")
    age = time.time() - status["written_at_ms"] / 1000
    if age > STATUS_STALE_S:
        raise Unhealthy(f"driver status is {age:.0f}s old")
    # A query an operator paused (`tide jobs pause`) is stopped on purpose, not unhealthy.
    inactive = [sink for sink, query in status["queries"].items() if not query["active"] and not query.get("paused")]
    if inactive:
        errors = "; ".join(f"{s}: {status['queries'][s]['last_error']}" for s in inactive)
        raise Unhealthy(f"queries not running: {errors}")
    return "queries " + ", ".join(status["queries"])


# Each column of the schema's tables: type, its category and numeric scale, enum labels, and its place
# in the primary key (NULL when not in it).
_CATALOGUE = """
SELECT c.relname, a.attname, t.typname, t.typcategory, t.typtype,
       CASE WHEN t.typname = 'numeric' AND a.atttypmod >= 4 THEN (a.atttypmod - 4) & 65535 END AS scale,
       ARRAY(SELECT e.enumlabel FROM pg_enum e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder) AS labels,
       array_position(i.indkey::int2[], a.attnum) AS key_position
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
WHERE n.nspname = %s AND c.relkind IN ('r', 'p')
ORDER BY c.relname, a.attnum
"""


def _column_info(typname: str, category: str, typtype: str, scale: int | None, labels: list[str]) -> ColumnInfo:
    if typname in ("int2", "int4", "int8"):
        return ColumnInfo("integer")
    if scale is not None:
        return ColumnInfo("decimal", scale)
    if typtype == "e":
        return ColumnInfo("enum", values=tuple(labels))
    return ColumnInfo({"N": "number", "D": "time"}.get(category, "other"))


def read_catalogue(conn: psycopg.Connection, schema: str) -> Catalogue:
    """The schema's tables as PostgreSQL's catalogue has them (what the connector captures)."""
    columns: dict[str, dict[str, ColumnInfo]] = {}
    keys: dict[str, list[tuple[int, str]]] = {}
    for table, column, typname, category, typtype, scale, labels, position in conn.execute(_CATALOGUE, (schema,)):
        columns.setdefault(table, {})[column] = _column_info(typname, category, typtype, scale, labels)
        if position is not None:
            keys.setdefault(table, []).append((position, column))
    return {table: TableInfo(found, tuple(c for _, c in sorted(keys.get(table, [])))) for table, found in columns.items()}


def check_schema(settings: StackSettings) -> None:
    """The columns the nested views, cache aggregates and windows name exist in PostgreSQL's catalogue
    with usable types: checked before the driver starts, so a typo is one line at `tide jobs start`
    rather than a failing query later. (Loading the file checks the first two against
    migrations/models.py too, without a database; the catalogue is the truth for any schema.)"""
    pipeline = load(settings.pipeline_file)
    if not (pipeline.windows or pipeline.nested or pipeline.cache_aggregates):
        return
    with psycopg.connect(postgres.conninfo(settings)) as conn:
        catalogue = read_catalogue(conn, pipeline.source.schema_name)
    problems = pipeline.schema_problems(catalogue)
    if problems:
        raise StackError(f"{settings.pipeline_file}: {'; '.join(problems)}")


def prepare(settings: StackSettings) -> None:
    status_file(settings).unlink(missing_ok=True)  # a new driver must report afresh
    check_schema(settings)
    jars.ensure(settings, "spark")


SERVICE = Service(
    name="jobs",
    port_fields=(),
    command=lambda settings: [sys.executable, "-m", "spark_jobs"],
    probe=probe,
    prepare=prepare,
    env=job_env,
)

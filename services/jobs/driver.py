"""The Spark apply driver as a managed local process: settings in, pid file and log out."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from services.settings import StackSettings
from services.stack import elasticsearch, jars, postgres, spark
from services.stack.service import Service, StackError, Unhealthy
from spark_jobs.model import catalogue, config
from spark_jobs.model.config import load
from spark_jobs.model.settings import SINKS, JobSettings
from spark_jobs.runtime import drivers

STATUS_STALE_S = 30.0


def catalogue_conninfo(settings: StackSettings) -> str:
    """How the jobs read PostgreSQL's catalogue: as the CDC role (it may log in and read the catalogue)."""
    return make_conninfo(
        host=settings.host_of("postgres"), port=settings.postgres_port, dbname=settings.postgres_db,
        user=settings.cdc_user, password=settings.require_cdc_password(), connect_timeout=5,
        application_name="tideline-apply",
    )


def job_env(settings: StackSettings) -> dict[str, str]:
    """TIDE_JOB_* for spark_jobs.model.settings.JobSettings, derived from the stack's settings. The catalogue's
    connection is left out when the CDC password is not set (readers of the views need none)."""
    state = settings.state_dir
    conninfo = {"TIDE_JOB_POSTGRES_CONNINFO": catalogue_conninfo(settings)} if settings.cdc_password else {}
    return conninfo | {
        "TIDE_JOB_PIPELINE_FILE": str(settings.pipeline_file),
        "TIDE_JOB_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TIDE_JOB_KAFKA_REPLICATION": str(settings.kafka_replication),
        "TIDE_JOB_ELASTICSEARCH_URL": elasticsearch.url(settings),
        "TIDE_JOB_REDIS_URL": f"redis://{settings.host_of('redis')}:{settings.redis_port}/{settings.job_redis_db}",
        "TIDE_JOB_WAREHOUSE_DIR": str(state / "warehouse"),
        "TIDE_JOB_CHECKPOINT_DIR": str(state / "checkpoints"),
        "TIDE_JOB_JARS_DIR": str(jars.bundle_dir(settings, "spark")),
        "TIDE_JOB_STATUS_FILE": str(status_file(settings)),
        "TIDE_JOB_PAUSED_FILE": str(paused_file(settings)),
        "TIDE_JOB_RELOAD_FILE": str(reload_file(settings)),
        "TIDE_JOB_TRIGGER_INTERVAL": settings.job_trigger_interval,
        "TIDE_JOB_MAX_OFFSETS_PER_TRIGGER": str(settings.job_max_offsets_per_trigger),
        "TIDE_JOB_DRIVER_MEMORY": settings.job_driver_memory,
        "TIDE_JOB_REALTIME_SINKS": json.dumps(settings.job_realtime_sinks),
    } | cluster_env(settings)


def cluster_env(settings: StackSettings) -> dict[str, str]:
    """The cluster profile's jobs: submitted to its master, one executor per worker, the driver reached on
    the stack's host (docs/cluster.md). Nothing without the profile: the jobs run in a local driver."""
    if not settings.spark_cluster:
        return {}
    return {
        "TIDE_JOB_MASTER": spark.master_url(settings),
        "TIDE_JOB_EXECUTORS": str(settings.spark_workers),
        "TIDE_JOB_EXECUTOR_MEMORY": settings.job_executor_memory,
        "TIDE_JOB_DRIVER_HOST": settings.host_of("jobs"),
    }


def job_settings(settings: StackSettings) -> JobSettings:
    """The apply jobs' typed settings for this stack (what `job_env` hands the driver)."""
    env = job_env(settings)
    # Validated from the variables' text, as the driver reads them (BaseSettings' __init__ runs: the
    # environment's other TIDE_JOB_* still apply).
    return JobSettings.model_validate({key.removeprefix("TIDE_JOB_").lower(): value for key, value in env.items()})


def status_file(settings: StackSettings) -> Path:
    return settings.state_dir / "jobs" / "status.json"


def paused_file(settings: StackSettings) -> Path:
    return settings.state_dir / "jobs" / "paused.json"


def reload_file(settings: StackSettings) -> Path:
    return settings.state_dir / "jobs" / "reload.json"


def read_status(settings: StackSettings) -> dict | None:
    """The drivers' reports as one (locally the Delta queries have a driver of their own:
    spark_jobs/runtime/drivers.py); None before any has reported."""
    reports = []
    for path in drivers.status_files(status_file(settings)):
        try:
            reports.append(json.loads(path.read_text()))
        except (FileNotFoundError, ValueError):
            continue
    return merge_reports(reports)


def merge_reports(reports: list[dict]) -> dict | None:
    """Several drivers' reports as one: every query with when its driver reported it, written when the
    oldest was (how stale the whole is), and a reload request handled once every driver handled it,
    with any driver's refusal."""
    if not reports:
        return None
    requests = {(report.get("reload") or {}).get("request") for report in reports}
    errors = [error for report in reports if (error := (report.get("reload") or {}).get("error"))]
    queries = {sink: {**query, "reported_at_ms": report.get("written_at_ms", 0)}
               for report in reports for sink, query in report["queries"].items()}
    return {
        "written_at_ms": min(report.get("written_at_ms", 0) for report in reports),
        "queries": dict(sorted(queries.items(),
                               key=lambda item: SINKS.index(item[0]) if item[0] in SINKS else len(SINKS))),
        "reload": {"request": requests.pop() if len(requests) == 1 else None, "error": "; ".join(errors) or None},
    }


def probe(settings: StackSettings) -> str:
    """Healthy once the drivers report every query active, recently."""
    status = read_status(settings)
    if status is None:
        raise Unhealthy("driver has not reported yet")
    age = time.time() - status["written_at_ms"] / 1000
    if age > STATUS_STALE_S:
        raise Unhealthy(f"driver status is {age:.0f}s old")
    pipeline = load(settings.pipeline_file)
    # Every query the driver runs: all sinks, or those TIDE_JOB_SINKS names (read from the environment).
    unreported = [sink for sink in job_settings(settings).sinks
                  if pipeline.sink_tables(sink) and sink not in status["queries"]]
    if unreported:
        raise Unhealthy(f"no driver reports the {', '.join(unreported)} queries yet")
    # A query an operator paused (`tide jobs pause`) is stopped on purpose, not unhealthy.
    inactive = [sink for sink, query in status["queries"].items() if not query["active"] and not query.get("paused")]
    if inactive:
        errors = "; ".join(f"{s}: {status['queries'][s]['last_error']}" for s in inactive)
        raise Unhealthy(f"queries not running: {errors}")
    return "queries " + ", ".join(status["queries"])


def check_schema(settings: StackSettings) -> None:
    """The columns the nested views, cache aggregates and windows name exist in PostgreSQL's catalogue
    with usable types: checked before the driver starts, so a typo is one line at `tide jobs start`
    rather than a failing query later (the jobs check the same again when their queries start)."""
    pipeline = load(settings.pipeline_file)
    if not (pipeline.windows or pipeline.nested or pipeline.cache_aggregates):
        return
    with psycopg.connect(postgres.conninfo(settings)) as conn:
        found = catalogue.read(conn, pipeline.source.schema_name)
    try:
        config.check_schema(pipeline, found, settings.pipeline_file)
    except config.PipelineConfigError as exc:
        raise StackError(str(exc)) from None


def prepare(settings: StackSettings) -> None:
    for path in drivers.status_files(status_file(settings)):
        path.unlink(missing_ok=True)  # a new driver must report afresh
    check_schema(settings)
    jars.ensure(settings, "spark")


SERVICE = Service(
    name="jobs",
    port_fields=(),
    command=lambda settings: [sys.executable, "-m", "spark_jobs", "--keep-alive"],
    probe=probe,
    prepare=prepare,
    env=job_env,
)

"""Register the Debezium PostgreSQL connector from connectors/tideline-postgres.json and pipeline.yaml.

`apply` checks everything it can *before* it touches anything (pipeline file,
Connect reachable, the source's preflight: logical WAL, a free slot, every table
exists, is keyed and can be published; Connect's own config validation), then
makes the CDC role, grants and publication so (services/capture/source/setup.py), then
PUTs the config (create or update). A failed check registers nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from services.capture.connector import slot_safety
from services.capture.connector.connect_api import ConnectApi, ConnectError
from services.capture.source import preflight
from services.capture.source import setup as source_setup
from services.settings import StackSettings
from services.stack import kafka, postgres
from services.stack.service import StackError
from services.stack.templates import substitute
from services.versions import PROJECT_ROOT
from spark_jobs.model.config import PipelineConfig

TEMPLATE = PROJECT_ROOT / "connectors" / "tideline-postgres.json"


def render_config(settings: StackSettings, pipeline: PipelineConfig,
                  overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The connector config: the committed template with this stack's values; secrets stay `${env:...}`.
    `overrides` replace or add keys last (the benchmark's `--connector KEY=VALUE`, to measure a setting)."""
    source = pipeline.source
    values = {
        "DATABASE_HOST": settings.connector_database_host or settings.host_of("postgres"),
        "DATABASE_PORT": str(settings.postgres_port),
        "DATABASE_NAME": settings.postgres_db,
        "TOPIC_PREFIX": source.topic_prefix,
        "SLOT_NAME": source.slot,
        "PUBLICATION_NAME": source.publication,
        "TABLE_INCLUDE_LIST": ",".join(rf"{source.schema_name}\.{table}" for table in pipeline.tables),
        "SUPPORT_SCHEMA": source.support_schema_name,
        "HEARTBEAT_INTERVAL_MS": str(source.heartbeat_interval_ms),
        "PARTITIONS": str(source.partitions),
        "REPLICATION": str(settings.kafka_replication),
        "MIN_INSYNC": str(settings.kafka_min_insync),
        "COMPACTION_LAG_MS": str(source.compaction_lag_hours * 3_600_000),
    }
    template: dict[str, str] = json.loads(TEMPLATE.read_text())
    config = {key: substitute(value, values, str(TEMPLATE)) for key, value in template.items()}
    excluded = [
        rf"{source.schema_name}\.{table}\.{column}"
        for table, views in pipeline.tables.items()
        for column in views.exclude_columns
    ]
    if excluded:
        config["column.exclude.list"] = ",".join(excluded)
    return {"name": source.connector, **config, **(overrides or {})}


def check_excluded_columns(conn: psycopg.Connection, schema: str, table: str, excluded: list[str]) -> None:
    """Each excluded column exists and is not part of the primary key (rows are keyed by it)."""
    rows = conn.execute(
        """
        SELECT a.attname, EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary
                                  AND a.attnum = ANY(i.indkey))
        FROM pg_attribute a WHERE a.attrelid = format('%%I.%%I', %s::text, %s::text)::regclass
          AND a.attnum > 0 AND NOT a.attisdropped
        """,
        (schema, table),
    ).fetchall()
    in_key: dict[str, bool] = dict(rows)  # column name -> part of the primary key
    unknown = [column for column in excluded if column not in in_key]
    if unknown:
        raise StackError(
            f"pipeline.yaml excludes {', '.join(f'{table}.{c}' for c in unknown)}, which does not exist: "
            "fix exclude_columns"
        )
    keyed = [column for column in excluded if in_key[column]]
    if keyed:
        raise StackError(
            f"pipeline.yaml excludes {', '.join(f'{table}.{c}' for c in keyed)}, part of the primary key "
            "that keys every view: remove it from exclude_columns"
        )


def apply(settings: StackSettings, pipeline: PipelineConfig, wait_s: float = 60.0,
          overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """Create or update the connector (idempotent) and wait until it and its task run."""
    config = render_config(settings, pipeline, overrides)
    with ConnectApi(kafka.connect_url(settings)) as api:
        api.ping()
        require_resumable(settings, api, pipeline)
        with psycopg.connect(postgres.conninfo(settings)) as conn:
            preflight.require_ready(conn, settings, pipeline)  # before anything is changed or registered
            for table, views in pipeline.tables.items():
                if views.exclude_columns:
                    check_excluded_columns(conn, pipeline.source.schema_name, table, views.exclude_columns)
            problems = api.validate(config["connector.class"], config)
            if problems:
                raise ConnectError(f"Kafka Connect rejected the connector config: {' | '.join(problems)}")
            source_setup.prepare(conn, settings, pipeline)
        preflight.require_cdc_login(settings)
        ensure_change_topics(settings, pipeline)
        api.put_config(pipeline.source.connector, config)
        return wait_running(api, pipeline.source.connector, wait_s)


def ensure_change_topics(settings: StackSettings, pipeline: PipelineConfig) -> list[str]:
    """Create every captured table's topic that does not exist yet, as the connector would (its
    `topic.creation.default.*` settings: compacted, no compaction younger than `source.compaction_lag_hours`,
    `source.partitions`, a replica on each of up to three brokers); returns those created. Debezium
    creates a topic only with the table's first record, so an empty table, or the last tables of a long
    snapshot, would have none, and a Spark query subscribed to a missing topic stops at start-up.
    A topic that exists takes the pipeline's compaction lag, so a stack made before the setting, or a
    changed `compaction_lag_hours`, gets it at the next registration."""
    from kafka.admin import KafkaAdminClient, NewTopic

    configs = topic_configs(render_config(settings, pipeline))
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        topics = [pipeline.topic(table) for table in pipeline.tables]
        existing = set(admin.list_topics())
        missing = [topic for topic in topics if topic not in existing]
        if missing:
            admin.create_topics([
                NewTopic(topic, num_partitions=pipeline.source.partitions,
                         replication_factor=settings.kafka_replication, topic_configs=configs)
                for topic in missing
            ])
        hold_for_lag(admin, [topic for topic in topics if topic in existing], configs[COMPACTION_LAG])
    finally:
        admin.close()
    return missing


COMPACTION_LAG = "min.compaction.lag.ms"


def hold_for_lag(admin: Any, topics: list[str], lag_ms: str) -> None:
    """Set `topics`' compaction lag to `lag_ms` where it differs (an incremental change of that one key)."""
    from kafka.admin import ConfigResource, ConfigResourceType

    if not topics:
        return
    found = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic) for topic in topics])
    held = {topic: values[COMPACTION_LAG]["value"] for topic, values in next(iter(found.values())).items()}
    changed = [topic for topic in topics if held.get(topic) != lag_ms]
    if changed:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs={COMPACTION_LAG: lag_ms})
                             for topic in changed])


# The connector's topic-creation keys that NewTopic takes as arguments, not as topic configs.
_TOPIC_SHAPE = ("partitions", "replication.factor")


def topic_configs(config: dict[str, str]) -> dict[str, str]:
    """The topic configs the connector gives each topic it creates (`topic.creation.default.*`)."""
    prefix = "topic.creation.default."
    return {key[len(prefix):]: value for key, value in config.items()
            if key.startswith(prefix) and key[len(prefix):] not in _TOPIC_SHAPE}


def wait_running(api: ConnectApi, name: str, wait_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + wait_s
    while True:
        state = api.status(name)
        if state and state["connector"]["state"] == "RUNNING" and state["tasks"]:
            failed = [task for task in state["tasks"] if task["state"] == "FAILED"]
            if failed:
                trace = failed[0].get("trace", "").strip().splitlines()
                raise ConnectError(f"connector {name} task failed: {trace[0] if trace else 'no trace'}")
            if all(task["state"] == "RUNNING" for task in state["tasks"]):
                return state
        if state and state["connector"]["state"] == "FAILED":
            trace = state["connector"].get("trace", "").strip().splitlines()
            raise ConnectError(f"connector {name} failed: {trace[0] if trace else 'no trace'}")
        if time.monotonic() > deadline:
            raise ConnectError(f"connector {name} not running after {wait_s:.0f}s: {state}")
        time.sleep(0.5)  # poll interval for the connector state


@dataclass(frozen=True)
class SlotState:
    name: str
    active: bool
    lag_bytes: int | None
    wal_status: str | None


def slot_state(settings: StackSettings, slot: str) -> SlotState | None:
    """The replication slot as PostgreSQL sees it: lag = WAL the slot still pins."""
    with psycopg.connect(postgres.conninfo(settings)) as conn:
        row = conn.execute(
            """
            SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, wal_status
            FROM pg_replication_slots WHERE slot_name = %s
            """,
            (slot,),
        ).fetchone()
    return SlotState(slot, row[0], row[1], row[2]) if row else None


def require_resumable(settings: StackSettings, api: ConnectApi, pipeline: PipelineConfig) -> None:
    """Refuse to (re)start the connector where it could only resume with a gap: its slot was
    invalidated, or its slot is gone while Connect still holds an offset to resume from (Debezium
    would create a new slot at the current WAL position and skip every change in between)."""
    source = pipeline.source
    slot = slot_state(settings, source.slot)
    if slot is not None and slot.wal_status == "lost":
        raise StackError(slot_safety.lost_message(source.slot))
    if slot is None and api.offsets(source.connector):
        raise StackError(slot_safety.gone_message(source.slot, source.connector))


def delete(settings: StackSettings, pipeline: PipelineConfig, drop_slot: bool = False) -> bool:
    """Remove the connector. With drop_slot also its stored offsets and replication slot, so the
    next apply starts over with an initial snapshot instead of resuming from a position that is gone."""
    name = pipeline.source.connector
    with ConnectApi(kafka.connect_url(settings)) as api:
        if drop_slot and api.status(name) is not None:
            api.stop(name)
            _wait_until(api, name, "stop", lambda state: state is None or state["connector"]["state"] == "STOPPED")
            api.reset_offsets(name)
        existed = api.delete(name)
        # Connect answers the DELETE before every worker has read it back: a status read right after
        # may still find the connector (seen in CI), and a register right after would race it.
        _wait_until(api, name, "go away", lambda state: state is None)
    if drop_slot:
        _drop_slot_when_released(settings, pipeline.source.slot)
    return existed


def _wait_until(
    api: ConnectApi, name: str, what: str, done: Callable[[dict[str, Any] | None], bool], wait_s: float = 30.0
) -> None:
    """Poll the connector's status until `done` holds for it (None once it is gone)."""
    deadline = time.monotonic() + wait_s
    while not done(api.status(name)):
        if time.monotonic() > deadline:
            raise ConnectError(f"connector {name} did not {what} within {wait_s:.0f}s")
        time.sleep(0.5)  # poll: Connect applies both asynchronously


def _drop_slot_when_released(settings: StackSettings, slot: str, wait_s: float = 30.0) -> None:
    deadline = time.monotonic() + wait_s
    with psycopg.connect(postgres.conninfo(settings), autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
            if row is None:
                return
            if not row[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                return
            if time.monotonic() > deadline:
                raise StackError(f"replication slot {slot} is still in use after the connector was deleted")
            time.sleep(0.5)  # poll: the task releases the slot asynchronously

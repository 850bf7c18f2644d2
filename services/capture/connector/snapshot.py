"""`tide snapshot TABLE [--where SQL]`: re-emit a table, or the rows a filter selects, while streaming continues.

It asks Debezium for an *incremental* snapshot by inserting an
`execute-snapshot` row into the signalling table (`<schema>.debezium_signal`,
the connector's `signal.data.collection`). Debezium reads that row from the
WAL like any change, then reads the table in primary-key chunks between two
watermarks it writes to the same table; a chunk row whose key also changed
inside the window is dropped in favour of the streamed change, so a re-read
never overwrites a newer change. The re-read rows arrive as op=r records in
the table's change topic, interleaved with the stream.

Completion comes from Debezium's notifications (`notification.enabled.channels=sink`,
topic `<topic_prefix>.notifications`): an "Incremental Snapshot" notification
whose id is the signal row's id, with type STARTED, DATA_COLLECTIONS_RESOLVED,
IN_PROGRESS, TABLE_SCAN_COMPLETED, then COMPLETED (or ABORTED). COMPLETED can
be readable before the last re-read rows are, so the command returns only once
Kafka Connect's committed offset proves they were delivered (see _wait_delivered).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import httpx
import psycopg
import typer
from kafka import KafkaConsumer
from kafka.errors import KafkaError
from psycopg import sql
from psycopg.conninfo import make_conninfo
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from services.capture import objects
from services.capture.connector import topics
from services.capture.connector.connect_api import ConnectApi
from services.capture.connector.snapshot_watch import (
    SnapshotError,
    SnapshotProgress,
    assign_from,
    drain,
    follow,
)
from services.console import console, load_settings, user_errors
from services.db.cli import first_line
from services.settings import StackSettings
from services.stack import kafka, postgres
from services.stack.rows import scalar
from spark_jobs.model.config import PipelineConfig

SIGNAL_TYPE = "execute-snapshot"
# debezium_signal.data is varchar(2048) (migration 0002).
SIGNAL_DATA_MAX = 2048
DEFAULT_TIMEOUT_S = 600.0


def check_where(where: str) -> str:
    """The filter, stripped, if it is one SQL expression; else a SnapshotError saying why.

    Debezium pastes the filter into every chunk query as `WHERE <key bounds> AND <filter>`,
    and `estimate_rows` runs it too. So it must not end the statement (`;`), comment out
    what follows (`--`, `/*`), close a parenthesis it did not open, or use a quoting form
    whose end this check cannot see (backslash escapes in E'' strings, dollar quoting).
    What it may *do* is bounded by the CDC role it runs as: SELECT on captured tables.
    """
    text = where.strip()
    if not text:
        raise SnapshotError("--where is empty: give a SQL condition, e.g. --where \"price > 10\"")
    for forbidden in (";", "\\", "$"):
        if forbidden in text:
            raise SnapshotError(f"--where must be a single SQL expression without {forbidden!r}: {where!r}")
    bare = _blank_quoted(text)
    for comment in ("--", "/*"):
        if comment in bare:
            raise SnapshotError(f"--where must not contain a SQL comment ({comment!r}): {where!r}")
    depth = 0
    for char in bare:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            raise SnapshotError(f"--where closes a parenthesis it did not open: {where!r}")
    if depth:
        raise SnapshotError(f"--where has an unclosed parenthesis: {where!r}")
    return text


def _blank_quoted(text: str) -> str:
    """The text with the insides of '...' literals and "..." identifiers blanked (doubled quotes are escapes)."""
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        char = text[i]
        if quote is None:
            quote = char if char in "'\"" else None
            out.append(char)
        elif char == quote and text[i + 1 : i + 2] == quote:
            out.append("  ")
            i += 1
        elif char == quote:
            quote = None
            out.append(char)
        else:
            out.append(" ")
        i += 1
    if quote is not None:
        raise SnapshotError(f"--where has an unterminated {quote} quote: {text!r}")
    return "".join(out)


def signal_data(pipeline: PipelineConfig, table: str, where: str | None) -> dict[str, Any]:
    """The `data` of the execute-snapshot signal for one table, optionally filtered."""
    qualified = f"{pipeline.source.schema_name}.{table}"
    data: dict[str, Any] = {"data-collections": [qualified], "type": "incremental"}
    if where is not None:
        # Parenthesised because Debezium appends it to its key bounds with a bare AND:
        # an unparenthesised `a OR b` would escape the chunk bounds and re-read rows forever.
        data["additional-conditions"] = [{"data-collection": qualified, "filter": f"({where})"}]
    return data


def _cdc_conninfo(settings: StackSettings) -> str:
    return make_conninfo(
        postgres.conninfo(settings), user=settings.cdc_user, password=settings.require_cdc_password()
    )


def estimate_rows(settings: StackSettings, pipeline: PipelineConfig, table: str, where: str | None) -> int:
    """count(*) of what the snapshot will read, run as the CDC role in a read-only transaction.

    The same role and the same filter as Debezium's chunk queries: a filter that
    fails here (syntax, a column that does not exist, a table the role cannot
    read) would fail there too, so it fails before anything is signalled.
    """
    query = sql.SQL("SELECT count(*) FROM {} WHERE {}").format(
        sql.Identifier(pipeline.source.schema_name, table), sql.SQL(f"({where})" if where else "true")
    )
    try:
        with psycopg.connect(_cdc_conninfo(settings)) as conn:
            conn.read_only = True
            conn.execute("SET statement_timeout = '60s'")
            return int(scalar(conn, query))
    except psycopg.OperationalError as exc:
        raise SnapshotError(f"cannot connect to PostgreSQL as {settings.cdc_user}: {first_line(exc)}") from exc
    except psycopg.Error as exc:
        what = f"--where {where!r}" if where else f"counting {table}"
        raise SnapshotError(f"{what} failed as {settings.cdc_user}: {first_line(exc)}") from exc


def require_running(settings: StackSettings, pipeline: PipelineConfig) -> None:
    """A signal only acts once the connector reads it; refuse rather than wait on a stopped connector."""
    name = pipeline.source.connector
    with ConnectApi(kafka.connect_url(settings)) as api:
        state = api.status(name)
    if state is None:
        raise SnapshotError(f"connector {name} is not registered: run `tide connector apply`")
    states = [state["connector"]["state"], *(task["state"] for task in state["tasks"])]
    if not state["tasks"] or any(s != "RUNNING" for s in states):
        raise SnapshotError(f"connector {name} is not running ({', '.join(states)}): see `tide connector status`")


def _insert_signal(settings: StackSettings, pipeline: PipelineConfig, signal_id: str, kind: str, payload: str) -> int:
    """Insert one row into the signalling table as the database owner; returns the WAL position just before it."""
    statement = sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, %s, %s)").format(
        sql.Identifier(pipeline.source.support_schema_name, objects.SIGNAL_TABLE)
    )
    with psycopg.connect(postgres.conninfo(settings)) as conn:
        before = scalar(conn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        conn.execute(statement, (signal_id, kind, payload))
    return int(before)


def send_signal(settings: StackSettings, pipeline: PipelineConfig, data: dict[str, Any]) -> str:
    """Insert the execute-snapshot row; returns its id (Debezium's notifications and watermarks carry it back)."""
    payload = json.dumps(data, separators=(",", ":"))
    if len(payload) > SIGNAL_DATA_MAX:
        raise SnapshotError(
            f"the snapshot signal is {len(payload)} characters, over the {SIGNAL_DATA_MAX} the signal table holds: "
            "shorten --where"
        )
    signal_id = str(uuid.uuid4())
    _insert_signal(settings, pipeline, signal_id, SIGNAL_TYPE, payload)
    return signal_id


def send_end_marker(settings: StackSettings, pipeline: PipelineConfig, signal_id: str) -> int:
    """After COMPLETED: a `log` signal (Debezium only logs it) whose change event follows every re-read row.

    Returns the WAL position before it: once Kafka Connect has committed a source
    offset at or past it, every record Debezium produced before (all op=r rows
    of this snapshot included) has been acknowledged by Kafka.
    """
    message = {"message": f"tide snapshot {signal_id} completed"}
    return _insert_signal(settings, pipeline, f"{signal_id}-end", "log", json.dumps(message))


def committed_lsn(settings: StackSettings, pipeline: PipelineConfig) -> int | None:
    """The WAL position of the connector's last committed source offset (GET /connectors/<name>/offsets)."""
    name = pipeline.source.connector
    url = f"{kafka.connect_url(settings)}/connectors/{name}/offsets"
    try:
        response = httpx.get(url, timeout=10)
    except httpx.HTTPError as exc:
        raise SnapshotError(f"cannot reach Kafka Connect at {kafka.connect_url(settings)}: {exc}") from exc
    if response.status_code != 200:
        raise SnapshotError(f"Kafka Connect GET /connectors/{name}/offsets answered {response.status_code}")
    positions = [entry.get("offset", {}).get("lsn") for entry in response.json().get("offsets", [])]
    return max((int(lsn) for lsn in positions if lsn is not None), default=None)


def _wait_delivered(
    settings: StackSettings,
    pipeline: PipelineConfig,
    consumer: KafkaConsumer,
    progress: SnapshotProgress,
    change_topic: str,
    deadline: float,
    on_progress: Callable[[SnapshotProgress], None],
) -> None:
    """Until Kafka Connect confirms delivery of everything produced before COMPLETED.

    COMPLETED is readable before the last re-read rows: Kafka orders records
    within a partition only, and a small notification overtakes large batches
    of rows still in the producer. Kafka Connect commits a source offset only
    once every earlier record is acknowledged, so a committed offset past our
    end marker proves the rows are in the topic (it commits every
    offset.flush.interval.ms, so this takes up to that long).
    """
    marker = send_end_marker(settings, pipeline, progress.signal_id)
    progress.state = "DELIVERING"
    def delivered() -> bool:
        committed = committed_lsn(settings, pipeline)
        return committed is not None and committed >= marker

    follow(consumer, progress, change_topic, deadline, on_progress, delivered,
           "confirmation from Kafka Connect that the rows were delivered")
    progress.delivered = True
    progress.state = "DELIVERED"


@dataclass(frozen=True)
class SnapshotPlan:
    """A checked request, ready to signal: everything `prepare` could verify without side effects passed."""

    table: str  # bare name, in pipeline.yaml
    where: str | None
    data: dict[str, Any]  # the signal's data
    estimated: int


def prepare(settings: StackSettings, pipeline: PipelineConfig, table: str, where: str | None = None) -> SnapshotPlan:
    """Check everything that can be checked before a signal is written; a failed check signals nothing.

    Table in pipeline.yaml, filter shape, connector running, filter accepted by
    PostgreSQL as the CDC role (which also gives the row estimate), and the
    notifications topic present (without it, completion could not be seen).
    """
    name = topics.require_table(pipeline, table)
    where = check_where(where) if where is not None else None
    data = signal_data(pipeline, name, where)
    require_running(settings, pipeline)
    estimated = estimate_rows(settings, pipeline, name, where)
    notes_topic = topics.notifications_topic(pipeline)
    consumer = topics.open_consumer(settings)
    try:
        if not topics.partitions(consumer, notes_topic):
            raise SnapshotError(
                f"topic {notes_topic} does not exist: Debezium creates it with its first notification "
                "(at the connector's first start); check `tide connector status`"
            )
    finally:
        consumer.close()
    return SnapshotPlan(name, where, data, estimated)


def execute(
    settings: StackSettings,
    pipeline: PipelineConfig,
    plan: SnapshotPlan,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_progress: Callable[[SnapshotProgress], None] = lambda progress: None,
) -> SnapshotProgress:
    """Write the signal row, wait for Debezium's COMPLETED, then for every re-read row to be in Kafka.

    The topics' end offsets are taken *before* the signal, so no notification or
    re-read row can slip past. On return, `emitted` counts every op=r record of
    the table written since the signal. Raises SnapshotError on ABORTED, a failed
    table scan, or the deadline (the snapshot itself then continues in Debezium).
    """
    change_topic, notes_topic = pipeline.topic(plan.table), topics.notifications_topic(pipeline)
    consumer = topics.open_consumer(settings)
    try:
        # A change topic that does not exist yet (a table never written) has no partitions to count.
        assign_from(
            consumer, {**topics.end_offsets(consumer, change_topic), **topics.end_offsets(consumer, notes_topic)}
        )
        signal_id = send_signal(settings, pipeline, plan.data)
        progress = SnapshotProgress(signal_id, f"{pipeline.source.schema_name}.{plan.table}", plan.estimated)
        on_progress(progress)
        deadline = time.monotonic() + timeout_s
        follow(consumer, progress, change_topic, deadline, on_progress, lambda: progress.completed,
               "COMPLETED notification")
        _wait_delivered(settings, pipeline, consumer, progress, change_topic, deadline, on_progress)
        drain(consumer, progress, change_topic, deadline)
        on_progress(progress)
        return progress
    except KafkaError as exc:
        raise SnapshotError(f"reading {change_topic} / {notes_topic} failed: {exc}") from exc
    finally:
        consumer.close()


def run(
    settings: StackSettings,
    pipeline: PipelineConfig,
    table: str,
    where: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_progress: Callable[[SnapshotProgress], None] = lambda progress: None,
) -> SnapshotProgress:
    """`prepare` then `execute`: signal an incremental snapshot of `table` and wait for it to complete."""
    return execute(settings, pipeline, prepare(settings, pipeline, table, where), timeout_s, on_progress)


def execute_with_bar(settings: StackSettings, pipeline: PipelineConfig, plan: SnapshotPlan,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> SnapshotProgress:
    """`execute`, showing a progress bar of the rows re-emitted against the count taken at the start."""
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as bar:
        task = bar.add_task(f"snapshot {plan.table}", total=plan.estimated)

        def show(progress: SnapshotProgress) -> None:
            # Concurrent inserts can push the count past the estimate; at the end the bar shows what was re-emitted.
            total = progress.emitted if progress.delivered else max(progress.estimated, progress.emitted)
            description = f"{progress.table} {progress.state.lower()}"
            bar.update(task, total=total, completed=progress.emitted, description=description)

        return execute(settings, pipeline, plan, timeout_s, on_progress=show)


# `tide snapshot`, `tide topics` and `tide tail` are top-level commands: this app has no
# name, so `app.add_typer(capture_ops_app)` merges its commands into `tide` itself.
capture_ops_app = typer.Typer()
capture_ops_app.add_typer(topics.topics_app)


@capture_ops_app.command("snapshot")
def snapshot_command(
    table: Annotated[str, typer.Argument(help="A table from pipeline.yaml, e.g. products.")],
    where: Annotated[
        str | None, typer.Option(help="Re-emit only rows matching this SQL condition, e.g. \"price > 10\".")
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=1, help="Seconds to wait until every re-read row is in Kafka.")
    ] = DEFAULT_TIMEOUT_S,
) -> None:
    """Re-emit a table (or the rows --where selects) as op=r records while streaming continues."""
    settings = load_settings()
    with user_errors():
        pipeline = objects.load_pipeline(settings)
        plan = prepare(settings, pipeline, table, where)  # before the bar: a refused request shows only its error
        result = execute_with_bar(settings, pipeline, plan, timeout)
    console.print(
        f"snapshot of {result.table} completed: {result.emitted} rows re-emitted "
        f"({result.estimated} counted at the start); signal {result.signal_id}",
        highlight=False,
    )

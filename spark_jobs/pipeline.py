"""The apply pipeline, wired in one place: Kafka change topics → decode → newest per row → one sink.

One streaming query per sink, each with its own checkpoint and therefore its
own consumer position (fan-out): a slow or failing sink never holds back the
others. `supervise` restarts a failed query with back-off while the rest run.

Exactly-once effect = at-least-once delivery (checkpointed offsets, a failed
micro-batch is replayed) + idempotent, version-guarded sink writes.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark import inheritable_thread_target
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from spark_jobs import control, dead_letters
from spark_jobs.changes import Change, DecodeError, decode
from spark_jobs.config import PipelineConfig
from spark_jobs.dead_letters import DeadLetter
from spark_jobs.merge import newest_per_row
from spark_jobs.settings import JobSettings, SinkName
from spark_jobs.sinks.base import BatchSink, PartitionSink, Rejected

log = logging.getLogger("tideline.pipeline")

VIEW_OF_SINK = {"search": "search", "cache": "cache", "warehouse": "warehouse"}


def make_sink(name: SinkName, settings: JobSettings, pipeline: PipelineConfig) -> PartitionSink | BatchSink:
    """The sink module for a sink name (imported here so a job loads only the clients it uses)."""
    if name == "search":
        from spark_jobs.sinks.elasticsearch import ElasticsearchSink

        return ElasticsearchSink(settings.elasticsearch_url, pipeline, settings.es_bulk_size)
    if name == "cache":
        from spark_jobs.sinks.redis import RedisSink

        return RedisSink(settings.redis_url, pipeline)
    if name == "analytics":
        from spark_jobs.sinks.delta_analytics import AnalyticsSink

        return AnalyticsSink(str(settings.warehouse_dir), pipeline)
    from spark_jobs.sinks.delta import DeltaSink

    return DeltaSink(str(settings.warehouse_dir), pipeline)


def tables_with_view(pipeline: PipelineConfig, sink: SinkName) -> list[str]:
    if sink == "analytics":
        return pipeline.analytics_tables()
    return [table for table, views in pipeline.tables.items() if getattr(views, VIEW_OF_SINK[sink]) is not None]


def source(spark: SparkSession, settings: JobSettings, topics: list[str]) -> DataFrame:
    """The change topics as a stream. Earliest on a fresh checkpoint (a new sink starts from the
    beginning of the compacted topics); failOnDataLoss so a gap is an error, never skipped."""
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "true")
        # A task reading a partition up to the batch's end offset waited the consumer's default
        # fetch.max.wait.ms (500 ms) per partition while producers were active: measured 2.5-3 s
        # of a 3 s batch. The offsets Spark asks for always exist, so a short wait costs nothing.
        .option("kafka.fetch.max.wait.ms", "10")
        .option("maxOffsetsPerTrigger", str(settings.max_offsets_per_trigger))
        .load()
        .select("topic", "partition", "offset", "key", "value")
    )


def decode_partition(
    rows: Iterator[Any], sink: str, bootstrap: str, dlq_topic: str, tables: frozenset[str]
) -> Iterator[Change]:
    """Decode one partition of raw records; undecodable ones go to the dead-letter topic at once,
    as `decode:<sink>` (each sink's query reads the topics on its own, so each reports its own)."""
    dead: list[DeadLetter] = []
    for row in rows:
        key, value = _bytes(row.key), _bytes(row.value)
        try:
            change = decode(row.topic, key, value, row.partition, row.offset)
            if change is not None and change.table not in tables:
                raise DecodeError(f"table {change.table} is not configured in pipeline.yaml for this sink")
        except DecodeError as exc:
            dead.append(DeadLetter(f"decode:{sink}", str(exc), row.topic, row.partition, row.offset, key, value))
            continue
        if change is not None:  # tombstones only serve compaction; the delete marker before them carries the delete
            yield change
    dead_letters.send(bootstrap, dlq_topic, dead)


def _bytes(value: Any) -> bytes | None:
    return bytes(value) if value is not None else None


def rejected_letters(sink: str, rejected: list[Rejected]) -> list[DeadLetter]:
    return [
        DeadLetter(f"apply:{sink}", item.reason, *(item.change.origin or ("?", -1, -1)), None, None)
        for item in rejected
    ]


class BatchWriter:
    """The foreachBatch function of one sink's query (picklable: settings and the sink only)."""

    def __init__(
        self, sink_name: SinkName, settings: JobSettings, pipeline: PipelineConfig, sink: Any = None
    ) -> None:
        self.sink_name = sink_name
        self.settings = settings
        self.sink = sink if sink is not None else make_sink(sink_name, settings, pipeline)
        self.tables = frozenset(tables_with_view(pipeline, sink_name))

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self._wait_for_sink(batch_id)
        sink, bootstrap, dlq_topic, tables = self.sink_name, self.settings.kafka_bootstrap, self.settings.dlq_topic, self.tables
        # No shuffle: Debezium keys records by primary key, so every change to a row is in one
        # Kafka partition, hence in one Spark partition; the newest per row is found locally.
        # Fewer, larger tasks: one per Kafka partition (12 for the demo) costs a Python task launch
        # each, per stage; coalescing (no shuffle) keeps every partition's records together.
        records = batch.rdd.coalesce(batch.sparkSession.sparkContext.defaultParallelism)
        changes = records.mapPartitions(lambda rows: decode_partition(rows, sink, bootstrap, dlq_topic, tables))
        # A sink that keeps history needs every change, not only the newest per row: decode once.
        history = getattr(self.sink, "write_history", None)
        changes = changes.persist() if history else changes
        newest = changes.mapPartitions(newest_per_row).persist()
        try:
            # Truncates first, from the driver (a handful per batch): a row change applied
            # concurrently in another partition must already see the raised watermark.
            truncates = newest.filter(lambda change: change.op == "t").collect()
            rows = newest.filter(lambda change: change.op != "t")
            if not history:
                self._apply(batch.sparkSession, truncates, rows, batch_id)
                return
            # History is written beside the batch's other tables (the analytics query's windows),
            # not after them: its tables are its own, and much of a small batch's time is on the
            # driver (Delta logs, commits), which overlaps.
            # `changes` is cached by now (the collect above), so the two never decode a record twice.
            with ThreadPoolExecutor(max_workers=1) as beside:
                pending = beside.submit(inheritable_thread_target(history), batch.sparkSession, changes, batch_id)
                self._apply(batch.sparkSession, truncates, rows, batch_id)
                rejected = pending.result()
            dead_letters.send(bootstrap, dlq_topic, rejected_letters(sink, rejected))
        finally:
            newest.unpersist()
            changes.unpersist()

    def _wait_for_sink(self, batch_id: int, max_backoff_s: float = 30.0) -> None:
        """Hold this query (only this one) until its store answers. Launching tasks against a store
        that is down would fail the job, and aborted tasks can take down Python workers and py4j
        calls that other queries share: measured with Elasticsearch stopped, it stopped Redis too."""
        available = getattr(self.sink, "available", None)
        delay = 1.0
        while available is not None and not available():
            log.warning("%s store unavailable; batch %s waits %.0fs", self.sink_name, batch_id, delay)
            time.sleep(delay)  # back-off while the store is down
            delay = min(delay * 2, max_backoff_s)

    def _apply(self, spark: SparkSession, truncates: list[Change], rows: Any, batch_id: int) -> None:
        sink, sink_name, bootstrap, dlq = self.sink, self.sink_name, self.settings.kafka_bootstrap, self.settings.dlq_topic
        if hasattr(sink, "write_batch"):
            rejected = sink.write_batch(spark, spark.sparkContext.parallelize(truncates, 1), batch_id) if truncates else []
            rejected += sink.write_batch(spark, rows, batch_id)
            dead_letters.send(bootstrap, dlq, rejected_letters(sink_name, rejected))
            return
        if truncates:
            dead_letters.send(bootstrap, dlq, rejected_letters(sink_name, sink.write(truncates)))
        rows.foreachPartition(
            lambda part: dead_letters.send(bootstrap, dlq, rejected_letters(sink_name, sink.write(list(part))))
        )
        if hasattr(sink, "finish_batch"):  # derived documents, after every partition's writes (e.g. nested views)
            sink.finish_batch(truncates, rows)


def build_query(
    spark: SparkSession,
    settings: JobSettings,
    pipeline: PipelineConfig,
    sink: SinkName,
    *,
    instance: Any = None,
    checkpoint: Path | None = None,
    available_now: bool = False,
) -> StreamingQuery:
    """One sink's streaming query: its own checkpoint folder, its own consumer position.

    `instance`, `checkpoint` and `available_now` serve rebuilds: a differently targeted sink,
    a fresh checkpoint (so reading starts at offset zero), and a run that stops once caught up.
    """
    writer = BatchWriter(sink, settings, pipeline, instance)
    writer.sink.setup(pipeline)
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", sink)  # the query's jobs run in its own pool
    topics = [pipeline.topic(table) for table in writer.tables]
    stream = (
        source(spark, settings, topics)
        .writeStream.queryName(f"tideline-{sink}" + ("-rebuild" if checkpoint else ""))
        .foreachBatch(writer)
        .option("checkpointLocation", str(checkpoint or settings.checkpoint_dir / sink))
    )
    # Delta's queries run fewer, larger batches (a fixed cost per commit); the others the short interval.
    delta_intervals = {"warehouse": settings.warehouse_trigger_interval, "analytics": settings.analytics_trigger_interval}
    interval = delta_intervals.get(sink, settings.trigger_interval)
    trigger = {"availableNow": True} if available_now else {"processingTime": interval}
    return stream.trigger(**trigger).start()


@dataclass
class _Supervised:
    query: StreamingQuery | None = None
    retry_at: float = 0.0
    backoff: float = 1.0
    started_at: float = 0.0
    last_error: str | None = None
    logged_batch: int = -1
    paused: bool = False


def _log_progress(sink: str, state: _Supervised) -> None:
    """One line per finished micro-batch: rows, duration and where the time went."""
    progress = state.query.lastProgress if state.query else None
    if progress and progress["batchId"] != state.logged_batch:
        state.logged_batch = progress["batchId"]
        durations = progress.get("durationMs", {})
        log.info(
            "%s batch %s: %s rows in %s ms (add batch %s ms)",
            sink, progress["batchId"], progress.get("numInputRows"),
            durations.get("triggerExecution"), durations.get("addBatch"),
        )


def supervise(spark: SparkSession, settings: JobSettings, pipeline: PipelineConfig, max_backoff_s: float = 30.0) -> None:
    """Run every configured sink's query; restart one that fails (e.g. its store is down) with
    exponential back-off while the others keep running. Returns only if the session stops."""
    supervised = {sink: _Supervised() for sink in settings.sinks if tables_with_view(pipeline, sink)}
    while True:
        now = time.monotonic()
        paused = control.read_paused(settings.paused_file)
        for sink, state in supervised.items():
            if _hold_paused(sink, state, sink in paused):
                continue
            if state.query is not None and state.query.isActive:
                _log_progress(sink, state)
                if now - state.started_at > max_backoff_s:
                    state.backoff = 1.0  # healthy for a while: the next failure retries quickly again
                continue
            if state.query is not None:
                state.last_error = str(state.query.exception() or "stopped")[:500]
                log.error("query %s stopped: %s; restarting in %.0fs", sink, state.last_error, state.backoff)
                state.query, state.retry_at = None, now + state.backoff
                state.backoff = min(state.backoff * 2, max_backoff_s)
            elif now >= state.retry_at:
                try:
                    state.query, state.started_at = build_query(spark, settings, pipeline, sink), now
                except Exception as exc:  # noqa: BLE001 - e.g. the store is down during setup: retry later
                    state.last_error = str(exc)[:500]
                    log.error("cannot start query %s: %s; retrying in %.0fs", sink, exc, state.backoff)
                    state.retry_at = now + state.backoff
                    state.backoff = min(state.backoff * 2, max_backoff_s)
        write_status(settings, supervised)
        try:
            spark.streams.awaitAnyTermination(timeout=5)
        except StreamingQueryException:
            pass  # a query failed: the next pass records its error and restarts it with backoff
        spark.streams.resetTerminated()


def _hold_paused(sink: str, state: _Supervised, paused: bool) -> bool:
    """Stop a query the operator paused (`tide jobs pause`) and keep it stopped; True while paused.
    Stopping between or during a batch is safe: its offsets are not committed, so it is replayed."""
    if paused and not state.paused:
        log.warning("query %s paused by the operator", sink)
        if state.query is not None and state.query.isActive:
            state.query.stop()
        state.query = None
    elif state.paused and not paused:
        log.warning("query %s resumed by the operator", sink)
        state.retry_at, state.backoff = 0.0, 1.0
    state.paused = paused
    return paused


def write_status(settings: JobSettings, supervised: dict[str, _Supervised]) -> None:
    """Each query's state for `tide jobs status` (written atomically: write then rename)."""
    status = {
        "written_at_ms": int(time.time() * 1000),
        "queries": {
            sink: {
                "active": bool(state.query is not None and state.query.isActive),
                "paused": state.paused,
                "last_error": state.last_error,
                "batch_id": (state.query.lastProgress or {}).get("batchId") if state.query else None,
            }
            for sink, state in supervised.items()
        },
    }
    settings.status_file.parent.mkdir(parents=True, exist_ok=True)
    temporary = settings.status_file.with_suffix(".tmp")
    temporary.write_text(json.dumps(status))
    os.replace(temporary, settings.status_file)

"""The apply pipeline, wired in one place: Kafka change topics → decode → newest per row → one sink.

One streaming query per sink, each with its own checkpoint and therefore its own consumer position
(fan-out): a slow or failing sink never holds back the others. spark_jobs/supervise.py runs them and
restarts a failed query with back-off while the rest run.

A micro-batch of the search or cache query is one Spark job: read the topics, decode them
(spark_jobs/changes/stream.py), group by row for the newest change (spark_jobs/changes/newest.py), ship the
sink's bytes from the executors, and write the dead letters, which is the action that runs it all.
The warehouse's MERGEs are Spark jobs of their own (docs/apply.md counts them per query). A query
named in `TIDE_JOB_REALTIME_SINKS` runs in Real-Time Mode instead: long-running tasks and the sink's
JVM writer, no micro-batches (spark_jobs/realtime.py).

Exactly-once effect = at-least-once delivery (checkpointed offsets, a failed micro-batch is replayed,
or planned again smaller if it failed twice: checkpoints.batch_cap) + idempotent, version-guarded sink writes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, overload

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_jobs.changes import dead_letters
from spark_jobs.changes.newest import newest_per_row
from spark_jobs.changes.stream import decode_stream
from spark_jobs.model.catalogue import LiveCatalogue
from spark_jobs.model.config import PipelineConfig
from spark_jobs.model.settings import JobSettings
from spark_jobs.realtime import (
    FOLLOW_UP_RETENTION_MS,
    QueryGroup,
    batch_slots,
    follow_up,
    partitions_read,
    require_slots,
)
from spark_jobs.realtime import start as start_realtime
from spark_jobs.runtime import checkpoints
from spark_jobs.runtime.backoff import wait_until
from spark_jobs.runtime.session import starting_with
from spark_jobs.runtime.topics import ensure_topic
from spark_jobs.sinks.base import Batch, Capability, Sink, build_sink

log = logging.getLogger("tideline.pipeline")


def live_catalogue(settings: JobSettings, pipeline: PipelineConfig) -> LiveCatalogue:
    return LiveCatalogue(settings.require_postgres_conninfo(), pipeline.source.schema_name, list(pipeline.tables),
                         settings.checkpoint_dir / "catalogue.json")


def source(spark: SparkSession, settings: JobSettings, topics: list[str], starting: str,
           max_offsets: int | None) -> DataFrame:
    """The change topics as a stream. Earliest on a fresh checkpoint (a new sink starts from the
    beginning of the compacted topics), unless it continues a retired one (spark_jobs/runtime/checkpoints.py);
    a topic added to a running query's subscription is read from its start too. failOnDataLoss so a
    gap is an error, never skipped. `max_offsets` caps a micro-batch; None for Real-Time Mode, which
    refuses a cap."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", starting)
        .option("failOnDataLoss", "true")
        # Debezium's primary-key change headers (the moved row's old key).
        .option("includeHeaders", "true")
    )
    if max_offsets is not None:
        # A task reading a partition up to the batch's end offset waited the consumer's default
        # fetch.max.wait.ms (500 ms) per partition while producers were active: measured 2.5-3 s
        # of a 3 s batch. The offsets Spark asks for always exist, so a short wait costs nothing.
        # Not in Real-Time Mode: its tasks poll for as long as the query runs, and a fetch returns
        # as soon as a record arrives anyway, so 10 ms would only make idle tasks ask 100 times a second.
        reader = reader.option("kafka.fetch.max.wait.ms", "10").option("maxOffsetsPerTrigger", str(max_offsets))
    return reader.load().select("topic", "partition", "offset", "key", "value", "headers")


@contextmanager
def batch_frames(changes: DataFrame, sink: Sink) -> Iterator[tuple[DataFrame, DataFrame]]:
    """A batch's decoded changes and its newest change per row, for the batch's writes. Both persisted
    (and released after) unless the sink writes in a single pass: its own actions (Delta's MERGEs) would
    each read the topics again, and `newest_per_row` alone reads the changes three times (the union, both
    sides of the key moves' join), each read fetching the batch from Kafka and decoding it again."""
    if sink.can(Capability.SINGLE_PASS):
        yield changes, newest_per_row(changes)
        return
    changes = changes.persist()
    newest = newest_per_row(changes).persist()
    try:
        yield changes, newest
    finally:
        newest.unpersist()
        changes.unpersist()


class BatchWriter:
    """The foreachBatch function of one sink's query; runs on the driver."""

    def __init__(self, sink: Sink, settings: JobSettings, catalogue: LiveCatalogue) -> None:
        self.sink = sink
        self.settings = settings
        self.catalogue = catalogue
        self.tables = sink.tables()

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        self._wait_for_sink(batch_id)
        context = records.sparkSession.sparkContext
        group = f"tideline-{self.sink.name}-{batch_id}"
        context.setJobGroup(group, f"{self.sink.name} batch {batch_id}")  # to count the batch's jobs below
        try:
            self._apply(records, batch_id)
        finally:
            # None unsets it (setLocalProperty's docstring says so; its annotation leaves None out).
            context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        jobs = context.statusTracker().getJobIdsForGroup(group)
        stages = sum(len(info.stageIds) for job in jobs if (info := context.statusTracker().getJobInfo(job)))
        log.info("%s batch %s ran %d Spark jobs, %d stages (skipped ones included)", self.sink.name, batch_id,
                 len(jobs), stages)

    def _apply(self, records: DataFrame, batch_id: int) -> None:
        catalogue = self.catalogue.current()
        # One task per Kafka partition (12 for the demo's 4 topics x 3) would each pay a task's fixed cost
        # (the plan deserialised, a scheduling round) however few records it reads: coalesced, no shuffle.
        records = records.coalesce(records.sparkSession.sparkContext.defaultParallelism)
        with batch_frames(decode_stream(records, self.tables, catalogue), self.sink) as (changes, newest):
            good = F.col("error").isNull()
            batch = Batch(batch_id, records.sparkSession, newest.where(good), changes.where(good), catalogue)
            rejected = self.sink.write(batch)
            letters = dead_letters.letters(newest.where(~good), f"decode:{self.sink.name}")
            if rejected is not None:
                letters = letters.unionByName(dead_letters.letters(rejected, f"apply:{self.sink.name}"))
            dead_letters.write(letters, self.settings.kafka_bootstrap, self.settings.dlq_topic)

    def _wait_for_sink(self, batch_id: int) -> None:
        """Hold this query (only this one) until its store answers. Launching tasks against a store
        that is down would fail the job, and aborted tasks can take down Python workers and py4j
        calls that other queries share: measured with Elasticsearch stopped, it stopped Redis too."""
        if self.sink.can(Capability.WAITS_FOR_STORE):
            wait_until(self.sink.available, f"{self.sink.name} store unavailable; batch {batch_id}")


@overload
def build_query(spark: SparkSession, settings: JobSettings, pipeline: PipelineConfig, sink_name: str, *,
                sink: Sink | None = ..., checkpoint: Path | None = ...,
                available_now: Literal[True]) -> StreamingQuery: ...


@overload
def build_query(spark: SparkSession, settings: JobSettings, pipeline: PipelineConfig, sink_name: str, *,
                sink: Sink | None = ..., checkpoint: Path | None = ...,
                available_now: bool = ...) -> StreamingQuery | QueryGroup: ...


def build_query(
    spark: SparkSession,
    settings: JobSettings,
    pipeline: PipelineConfig,
    sink_name: str,
    *,
    sink: Sink | None = None,
    checkpoint: Path | None = None,
    available_now: bool = False,
) -> StreamingQuery | QueryGroup:
    """One sink's streaming query (a real-time one with a follow-up query is a QueryGroup): its own
    checkpoint folder, its own consumer position. `sink_name` is looked up in the registry.

    `sink`, `checkpoint` and `available_now` serve rebuilds: a differently targeted sink, a fresh
    checkpoint (so reading starts at offset zero), and a run that stops once caught up (never in
    Real-Time Mode, so a plain StreamingQuery).
    """
    sink = sink or build_sink(sink_name, settings, pipeline)
    catalogue = live_catalogue(settings, pipeline)
    realtime = sink_name in settings.realtime_sinks and not available_now
    topics = [pipeline.topic(table) for table in sink.tables()]
    if realtime:
        realtime_slots(spark, settings, pipeline, sink_name)
    columns = catalogue.current()
    sink.setup(spark, columns)
    ensure_topic(settings, settings.dlq_topic)
    # The query's jobs run in its own pool.
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", sink_name)
    checkpoint = checkpoint or settings.checkpoint_dir / sink_name
    starting = checkpoints.starting_offsets(checkpoint, topics, pipeline.source.partitions)
    name = f"tideline-{sink_name}" + ("" if checkpoint.name == sink_name else "-rebuild")
    max_offsets = None if realtime else checkpoints.batch_cap(checkpoint, settings.max_offsets_of(sink_name))
    records = source(spark, settings, topics, starting, max_offsets)
    if realtime:
        query = start_realtime(records, sink, columns, settings, name=name, checkpoint=checkpoint)
        if (topic := sink.follow_up_topic()) is None:
            return query
        ensure_topic(settings, topic, FOLLOW_UP_RETENTION_MS)
        follow_checkpoint = checkpoints.follow_up(checkpoint)
        cap = checkpoints.batch_cap(follow_checkpoint, settings.follow_up_max_offsets_per_trigger)
        return follow_up(query, source(spark, settings, [topic], "earliest", cap), sink, settings,
                         checkpoint=follow_checkpoint)
    stream = (
        records.writeStream.queryName(name)
        .foreachBatch(BatchWriter(sink, settings, catalogue))
        .option("checkpointLocation", str(checkpoint))
    )
    trigger = ({"availableNow": True} if available_now
               else {"processingTime": settings.trigger_interval_of(sink_name)})
    with starting_with(spark, {}):  # not while a real-time query starts with its own conf
        return stream.trigger(**trigger).start()


def realtime_slots(spark: SparkSession, settings: JobSettings, pipeline: PipelineConfig, sink_name: str) -> None:
    """Refuse (SlotsError) a real-time query that would not get a task slot per partition it reads: the
    other real-time queries running hold theirs, and the micro-batch queries keep the configured master's."""
    running = {query.name for query in spark.streams.active}
    held = sum(partitions_read(pipeline, other) for other in settings.realtime_sinks
               if other != sink_name and f"tideline-{other}" in running)
    # The micro-batch queries' slots, follow-up queries of real-time sinks included (local_master adds
    # the real-time slots on top of these).
    reserved = batch_slots(settings)
    require_slots(spark, sink_name, partitions_read(pipeline, sink_name), held, reserved)

"""The apply pipeline, wired in one place: Kafka change topics → decode → newest per row → one sink.

One streaming query per sink, each with its own checkpoint and therefore its own consumer position
(fan-out): a slow or failing sink never holds back the others. `supervise` restarts a failed query
with back-off while the rest run.

A micro-batch of the search or cache query is one Spark job: read the topics, decode them
(spark_jobs/changes/stream.py), group by row for the newest change (spark_jobs/newest.py), ship the
sink's bytes from the executors, and write the dead letters, which is the action that runs it all.
The warehouse's MERGEs are Spark jobs of their own (docs/apply.md counts them per query). A query
named in `TIDE_JOB_REALTIME_SINKS` runs in Real-Time Mode instead: long-running tasks and the sink's
JVM writer, no micro-batches (spark_jobs/realtime.py).

Exactly-once effect = at-least-once delivery (checkpointed offsets, a failed micro-batch is replayed)
+ idempotent, version-guarded sink writes.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_jobs import checkpoints, control, dead_letters, reload
from spark_jobs.backoff import Backoff, wait_until
from spark_jobs.catalogue import Catalogue, LiveCatalogue
from spark_jobs.changes.stream import decode_stream
from spark_jobs.config import PipelineConfig, PipelineConfigError, load
from spark_jobs.files import replace_text
from spark_jobs.newest import newest_per_row
from spark_jobs.keep_alive import RESTART
from spark_jobs.realtime import create_topic, follow_up, outgrown, partitions_read, require_slots, task_slots_of
from spark_jobs.realtime import start as start_realtime
from spark_jobs.session import starting_with
from spark_jobs.settings import JobSettings, SinkName
from spark_jobs.sinks.base import Batch, Capability, Sink
from spark_jobs.sinks.registry import build_sink

log = logging.getLogger("tideline.pipeline")


def live_catalogue(settings: JobSettings, pipeline: PipelineConfig) -> LiveCatalogue:
    return LiveCatalogue(settings.require_postgres_conninfo(), pipeline.source.schema_name, list(pipeline.tables),
                         settings.checkpoint_dir / "catalogue.json")


def source(spark: SparkSession, settings: JobSettings, topics: list[str], starting: str,
           max_offsets: int | None) -> DataFrame:
    """The change topics as a stream. Earliest on a fresh checkpoint (a new sink starts from the
    beginning of the compacted topics), unless it continues a retired one (spark_jobs/checkpoints.py);
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
            context.setLocalProperty("spark.jobGroup.id", None)
        jobs = context.statusTracker().getJobIdsForGroup(group)
        stages = sum(len(info.stageIds) for job in jobs if (info := context.statusTracker().getJobInfo(job)))
        log.info("%s batch %s ran %d Spark jobs, %d stages (skipped ones included)", self.sink.name, batch_id,
                 len(jobs), stages)

    def _apply(self, records: DataFrame, batch_id: int) -> None:
        single_pass = self.sink.can(Capability.SINGLE_PASS)
        catalogue = self.catalogue.current()
        # One task per Kafka partition (12 for the demo's 4 topics x 3) would each pay a task's fixed cost
        # (the plan deserialised, a scheduling round) however few records it reads: coalesced, no shuffle.
        records = records.coalesce(records.sparkSession.sparkContext.defaultParallelism)
        changes = decode_stream(records, self.tables, catalogue)
        if not single_pass and self.sink.can(Capability.EVERY_CHANGE):
            changes = changes.persist()
        newest = newest_per_row(changes)
        if not single_pass:
            newest = newest.persist()
        try:
            good = F.col("error").isNull()
            batch = Batch(batch_id, records.sparkSession, newest.where(good), changes.where(good), catalogue)
            rejected = self.sink.write(batch)
            letters = dead_letters.letters(newest.where(~good), f"decode:{self.sink.name}")
            if rejected is not None:
                letters = letters.unionByName(dead_letters.letters(rejected, f"apply:{self.sink.name}"))
            dead_letters.write(letters, self.settings.kafka_bootstrap, self.settings.dlq_topic)
        finally:
            if not single_pass:
                newest.unpersist()
                changes.unpersist()

    def _wait_for_sink(self, batch_id: int) -> None:
        """Hold this query (only this one) until its store answers. Launching tasks against a store
        that is down would fail the job, and aborted tasks can take down Python workers and py4j
        calls that other queries share: measured with Elasticsearch stopped, it stopped Redis too."""
        if self.sink.can(Capability.WAITS_FOR_STORE):
            wait_until(self.sink.available, f"{self.sink.name} store unavailable; batch {batch_id}")


def build_query(
    spark: SparkSession,
    settings: JobSettings,
    pipeline: PipelineConfig,
    sink_name: SinkName,
    *,
    sink: Sink | None = None,
    checkpoint: Path | None = None,
    available_now: bool = False,
) -> StreamingQuery:
    """One sink's streaming query: its own checkpoint folder, its own consumer position.

    `sink`, `checkpoint` and `available_now` serve rebuilds: a differently targeted sink, a fresh
    checkpoint (so reading starts at offset zero), and a run that stops once caught up.
    """
    sink = sink or build_sink(sink_name, settings, pipeline)
    catalogue = live_catalogue(settings, pipeline)
    realtime = sink_name in settings.realtime_sinks and not available_now
    topics = [pipeline.topic(table) for table in sink.tables()]
    if realtime:
        realtime_slots(spark, settings, pipeline, sink_name)
    columns = catalogue.current()
    sink.setup(spark, columns)
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", sink_name)  # the query's jobs run in its own pool
    checkpoint = checkpoint or settings.checkpoint_dir / sink_name
    starting = checkpoints.starting_offsets(checkpoint, topics, pipeline.source.partitions)
    name = f"tideline-{sink_name}" + ("" if checkpoint.name == sink_name else "-rebuild")
    records = source(spark, settings, topics, starting, None if realtime else settings.max_offsets_of(sink_name))
    if realtime:
        query = start_realtime(records, sink, columns, settings, name=name, checkpoint=checkpoint)
        if (topic := sink.follow_up_topic()) is None:
            return query
        create_topic(settings.kafka_bootstrap, topic)
        follow = source(spark, settings, [topic], "earliest", settings.max_offsets_per_trigger)
        return follow_up(query, follow, sink, settings, checkpoint=checkpoint.with_name(f"{checkpoint.name}-follow-up"))
    stream = (
        records.writeStream.queryName(name)
        .foreachBatch(BatchWriter(sink, settings, catalogue))
        .option("checkpointLocation", str(checkpoint))
    )
    trigger = {"availableNow": True} if available_now else {"processingTime": settings.trigger_interval_of(sink_name)}
    with starting_with(spark, {}):  # not while a real-time query starts with its own conf
        return stream.trigger(**trigger).start()


def realtime_slots(spark: SparkSession, settings: JobSettings, pipeline: PipelineConfig, sink_name: SinkName) -> None:
    """Refuse (SlotsError) a real-time query that would not get a task slot per partition it reads: the
    other real-time queries running hold theirs, and the micro-batch queries keep the configured master's."""
    running = {query.name for query in spark.streams.active}
    held = sum(partitions_read(pipeline, other) for other in settings.realtime_sinks
               if other != sink_name and f"tideline-{other}" in running)
    # The micro-batch queries' slots, follow-up queries of real-time sinks included (local_master adds
    # the real-time slots on top of these).
    reserved = task_slots_of(settings.master) or 0
    require_slots(spark, sink_name, partitions_read(pipeline, sink_name), held, reserved)


@dataclass
class _Supervised:
    query: StreamingQuery | None = None
    retry_at: float = 0.0
    # A query that ran 30 s was healthy: its next failure restarts quickly again.
    backoff: Backoff = field(default_factory=lambda: Backoff(healthy_after_s=30.0))
    started_at: float = 0.0
    last_error: str | None = None
    logged_batch: int = -1
    paused: bool = False
    # The catalogue a real-time query was planned with (its plan keeps it until the query restarts).
    catalogue: Catalogue | None = None


def _log_progress(sink: str, state: _Supervised) -> None:
    """One line per finished micro-batch: rows, duration and where the time went."""
    progress = state.query.lastProgress if state.query else None
    if progress and progress["batchId"] != state.logged_batch:
        state.logged_batch = progress["batchId"]
        log.info("%s", progress_line(sink, progress))


def progress_line(sink: str, progress: dict) -> str:
    """`<sink> batch N: R rows in T ms (add batch A ms; ...)`: the trigger's whole time, the time in the
    foreachBatch function (the sink's work) and each of the streaming engine's own steps (Kafka's end
    offsets, the offset log, planning, the commit log), which a small batch can spend as long in."""
    durations = progress.get("durationMs") or {}
    steps = "".join(f"; {name} {ms}" for name, ms in sorted(durations.items())
                    if name not in ("triggerExecution", "addBatch"))
    return (f"{sink} batch {progress['batchId']}: {progress.get('numInputRows')} rows in "
            f"{durations.get('triggerExecution')} ms (add batch {durations.get('addBatch')} ms{steps})")


@dataclass
class _Reloads:
    """The last request to re-read pipeline.yaml the driver handled, and why it was refused, if it was."""

    handled: str | None
    error: str | None = None


def _reload(settings: JobSettings, pipeline: PipelineConfig, supervised: dict[str, _Supervised]) -> PipelineConfig:
    """Re-read pipeline.yaml's tables: stop each query whose tables changed, set its checkpoint aside
    if a table left it, and let the loop start it again on its new topics. The others run on.
    Raises PipelineConfigError (nothing changed) if the new file cannot replace the old one."""
    new = load(settings.pipeline_file)
    if problem := reload.refusal(pipeline, new):
        raise PipelineConfigError(problem)
    for sink, change in reload.changes(pipeline, new, list(settings.sinks)).items():
        log.warning("query %s: tables %s -> %s", sink, sorted(change.before), sorted(change.after))
        state = supervised.pop(sink, None)
        if state is not None and state.query is not None and state.query.isActive:
            state.query.stop()
        if change.removed:
            checkpoints.retire(settings.checkpoint_dir / sink)
        if change.after:
            supervised[sink] = _Supervised(paused=state.paused if state else False)
    return new


def supervise(spark: SparkSession, settings: JobSettings, pipeline: PipelineConfig) -> None:
    """Run every configured sink's query; restart one that fails (e.g. its store is down) with
    exponential back-off while the others keep running; re-read pipeline.yaml's tables when asked
    (`tide tables add | remove`). Returns only if the session stops."""
    supervised = {sink: _Supervised() for sink in settings.sinks if pipeline.sink_tables(sink)}
    catalogue = live_catalogue(settings, pipeline)
    # A request written before this driver started is already in the pipeline it loaded.
    reloads = _Reloads(control.read_reload(settings.reload_file))
    while True:
        now = time.monotonic()
        if (request := control.read_reload(settings.reload_file)) != reloads.handled:
            try:
                pipeline, reloads.error = _reload(settings, pipeline, supervised), None
                catalogue = live_catalogue(settings, pipeline)
                _restart_if_outgrown(spark, settings, pipeline, supervised)
            except PipelineConfigError as exc:
                reloads.error = str(exc)
                log.error("pipeline.yaml not re-read: %s", exc)
            reloads.handled = request
        paused = control.read_paused(settings.paused_file)
        due: list[str] = []
        for sink, state in supervised.items():
            if _hold_paused(sink, state, sink in paused):
                continue
            if state.query is not None and state.query.isActive:
                checkpoints.drop_retired(settings.checkpoint_dir / sink)
                _log_progress(sink, state)
                if sink in settings.realtime_sinks:
                    _restart_on_new_catalogue(sink, state, catalogue.current(), pipeline.sink_tables(sink))
                continue
            if state.query is not None:
                state.last_error = str(state.query.exception() or "stopped")[:500]
                state.query.stop()  # a query group's other query may still run: its name must be free again
                wait = state.backoff.after(now - state.started_at)
                log.error("query %s stopped: %s; restarting in %.0fs", sink, state.last_error, wait)
                state.query, state.retry_at = None, now + wait
            elif now >= state.retry_at:
                due.append(sink)
        _start_all(spark, settings, pipeline, {sink: supervised[sink] for sink in due}, catalogue)
        write_status(settings, supervised, pipeline, reloads)
        try:
            spark.streams.awaitAnyTermination(timeout=5)
        except StreamingQueryException:
            pass  # a query failed: the next pass records its error and restarts it with backoff
        spark.streams.resetTerminated()


def _start_all(spark: SparkSession, settings: JobSettings, pipeline: PipelineConfig,
               due: dict[str, _Supervised], catalogue: LiveCatalogue) -> None:
    """Start the `due` queries at once, one thread each: a query's start is mostly waiting (on the
    stores' set-up requests, on the Delta log's reads, on Spark jobs of one task), so they overlap
    on 2 cores; measured at a driver start: 24 s one after the other. Real-time queries start one
    at a time among themselves, as each counts the task slots the others already hold."""
    if not due:
        return
    realtime_lock = threading.Lock()

    def start_one(sink: str, state: _Supervised) -> None:
        began = time.monotonic()
        try:
            if sink in settings.realtime_sinks:
                with realtime_lock:
                    state.catalogue = catalogue.current()
                    state.query = build_query(spark, settings, pipeline, sink)
            else:
                state.catalogue, state.query = None, build_query(spark, settings, pipeline, sink)
            state.started_at = began
            log.info("query %s started in %.1f s", sink, time.monotonic() - began)
        except Exception as exc:  # noqa: BLE001 - e.g. the store is down during setup: retry later
            state.last_error = str(exc)[:500]
            wait = state.backoff.after()
            log.error("cannot start query %s: %s; retrying in %.0fs", sink, exc, wait)
            state.retry_at = time.monotonic() + wait

    with ThreadPoolExecutor(max_workers=len(due), thread_name_prefix="query-start") as pool:
        for future in [pool.submit(start_one, sink, state) for sink, state in due.items()]:
            future.result()


def _restart_if_outgrown(spark: SparkSession, settings: JobSettings, pipeline: PipelineConfig,
                         supervised: dict[str, _Supervised]) -> None:
    """End the driver, asking the keep-alive to start it again, when the reloaded `pipeline` gives the
    real-time queries more partitions than the session has task slots: a local session's slots are
    fixed when it starts (`realtime.local_master`), and a query with fewer would be refused. The
    restarted driver starts every query with the new tables (the reload is already done: stopped
    queries, retired checkpoints)."""
    master = spark.sparkContext.master
    if (wanted := outgrown(master, settings, pipeline)) is None:
        return
    log.warning("pipeline.yaml's real-time queries need %s, this session has %s: the driver stops, to be "
                "started again with them", wanted, master)
    for state in supervised.values():
        if state.query is not None and state.query.isActive:
            state.query.stop()
    spark.stop()
    sys.exit(RESTART)


def _restart_on_new_catalogue(sink: str, state: _Supervised, catalogue: Catalogue, tables: list[str]) -> None:
    """Stop a real-time query whose tables' columns changed at the source (the loop starts it again at
    once, planned with the new catalogue): its decoder's time columns and the cache's column types
    were fixed when it was planned. The epoch in flight is replayed."""
    if state.query is None or state.catalogue is None or not columns_changed(state.catalogue, catalogue, tables):
        return
    log.warning("query %s: the source's columns changed; restarting it with the new catalogue", sink)
    state.query.stop()
    state.query, state.retry_at = None, 0.0


def columns_changed(planned: Catalogue, current: Catalogue, tables: list[str]) -> bool:
    """Whether any of `tables` has other columns (or types) in `current` than in `planned`."""
    return any(current.get(table) != planned.get(table) for table in tables)


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
        state.retry_at = 0.0
        state.backoff.reset()
    state.paused = paused
    return paused


# A query that refuses its plan or subscription stops within a second or two of its first batch's start
# (the loop would see it stopped sooner: a termination ends its wait at once).
RUNNING_AFTER_S = 5.0


def _running(state: _Supervised) -> bool:
    """Whether the query has made progress, or has been in a batch (a real-time query's first epoch,
    which reports progress only at its end) for RUNNING_AFTER_S: its plan and subscription were taken."""
    query = state.query
    if query is None or not query.isActive:
        return False
    if query.lastProgress is not None:
        return True
    return bool(query.status.get("isTriggerActive")) and time.monotonic() - state.started_at >= RUNNING_AFTER_S


def write_status(settings: JobSettings, supervised: dict[str, _Supervised], pipeline: PipelineConfig,
                 reloads: _Reloads) -> None:
    """Each query's state and tables for `tide jobs status` and `tide tables` (written atomically:
    write then rename), and the last reload request handled."""
    status = {
        "written_at_ms": int(time.time() * 1000),
        "queries": {
            sink: {
                "active": bool(state.query is not None and state.query.isActive),
                "paused": state.paused,
                "last_error": state.last_error,
                "batch_id": (state.query.lastProgress or {}).get("batchId") if state.query else None,
                "running": _running(state),
                "tables": pipeline.sink_tables(sink),
            }
            for sink, state in supervised.items()
        },
        "reload": {"request": reloads.handled, "error": reloads.error},
    }
    replace_text(settings.status_file, json.dumps(status))

"""Real-Time Mode: a sink's query as long-running tasks that write each change as it arrives.

A micro-batch pays its planning and jobs whatever its size (docs/apply.md, "Fixed cost per batch");
in Real-Time Mode the query is planned once, each task reads one Kafka partition for as long as the
query runs, and the sink's JVM writer (spark_jobs/jars/src) ships every change within milliseconds.
The plan is the decoder and the sink's request columns only: Real-Time Mode refuses shuffles,
`coalesce`, Python functions and `foreachBatch`, so there is no newest-per-row step (a row's changes
arrive in order within its partition) and the writer sends the dead letters itself.

Every task runs at once, so the query needs one task slot per partition it reads; with fewer it starts
without an error and the partitions left over are never read. `require_slots` refuses that at start.
Offsets are checkpointed at the end of each epoch (`realtime_epoch`), after the writer's `close` has
flushed everything; a query stopped mid-epoch replays that epoch, which the version guard makes safe.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.changes import dead_letters
from spark_jobs.model.config import PipelineConfig
from spark_jobs.model.errors import ConfigurationError
from spark_jobs.model.settings import JobSettings
from spark_jobs.runtime.backoff import wait_until
from spark_jobs.runtime.session import GENERATED_CODE, starting_with
from spark_jobs.sinks.base import LetterTopic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from spark_jobs.model.catalogue import Catalogue
    from spark_jobs.sinks.base import Sink

log = logging.getLogger("tideline.realtime")

# What Catalyst's ComputeCurrentTime turns into a literal when a plan is optimized.
_CLOCK = re.compile(r"\b(current_timestamp|current_date|current_time|now|localtimestamp)\(")
_LOCAL = re.compile(r"^local\[(\d+|\*)(,\d+)?\]$")
# A cluster's task slots for the micro-batch queries: what local[4] gives them locally.
CLUSTER_BATCH_SLOTS = 4


class SlotsError(ConfigurationError):
    """A real-time query would get fewer task slots than the Kafka partitions it reads."""


def partitions_read(pipeline: PipelineConfig, sink: str) -> int:
    """The Kafka partitions `sink`'s query reads (each change topic has `source.partitions`)."""
    return len(pipeline.sink_tables(sink)) * pipeline.source.partitions


def needed_slots(settings: JobSettings, pipeline: PipelineConfig) -> int:
    """Task slots the configured real-time queries hold: one per partition of each topic they read."""
    return sum(partitions_read(pipeline, sink) for sink in settings.realtime_sinks if sink in settings.sinks)


def local_master(settings: JobSettings, pipeline: PipelineConfig) -> str | None:
    """The master a local driver runs: `master`'s slots (the micro-batch queries') plus one per partition
    the real-time queries read. A cluster master (or None) is left as it is."""
    found = _LOCAL.match(settings.master or "")
    extra = needed_slots(settings, pipeline)
    if not found or not extra or found.group(1) == "*":
        return settings.master
    return f"local[{int(found.group(1)) + extra}{found.group(2) or ''}]"


def is_cluster(master: str | None) -> bool:
    """Whether `master` names a cluster manager (spark://, k8s://, yarn), not a local one or spark-submit's."""
    return bool(master) and task_slots_of(master) is None


def cluster_slots(settings: JobSettings, pipeline: PipelineConfig) -> int:
    """Task slots the jobs ask a cluster master for: the micro-batch queries' (CLUSTER_BATCH_SLOTS) and one
    per partition the real-time queries read, rounded up to an equal number per executor."""
    per_executor = -(-(CLUSTER_BATCH_SLOTS + needed_slots(settings, pipeline)) // settings.executors)
    return per_executor * settings.executors


def cluster_conf(settings: JobSettings, pipeline: PipelineConfig) -> dict[str, str]:
    """A cluster master's share for the jobs: `executors` executors of equal cores (standalone starts an
    executor only with all its cores, and more than one per worker only when they are set), together
    `cluster_slots`. Nothing for a local master or spark-submit's: there they are decided elsewhere."""
    if not is_cluster(settings.master):
        return {}
    slots = cluster_slots(settings, pipeline)
    conf = {"spark.cores.max": str(slots), "spark.executor.cores": str(slots // settings.executors),
            "spark.executor.memory": settings.executor_memory}
    return conf | ({"spark.driver.host": settings.driver_host} if settings.driver_host else {})


def batch_slots(settings: JobSettings) -> int:
    """The task slots kept for the micro-batch queries: a local master's own, or CLUSTER_BATCH_SLOTS."""
    return task_slots_of(settings.master) or CLUSTER_BATCH_SLOTS


def session_slots(spark: SparkSession) -> int | None:
    """The session's task slots: a local master's, or the cores asked of a cluster (spark.cores.max, what
    cluster_conf sets); None when a cluster manager decides and nothing says how many."""
    slots, cores = task_slots_of(spark.sparkContext.master), spark.sparkContext.getConf().get("spark.cores.max")
    if slots is not None or cores is None:
        return slots
    conf = spark.sparkContext.getConf()
    return int(cores) // int(conf.get("spark.task.cpus", "1") or 1)


def outgrown(master: str | None, settings: JobSettings, pipeline: PipelineConfig) -> str | None:
    """The local master a driver needs for `pipeline` when it is larger than `master` (the session's):
    a reload added tables, and so partitions, to a real-time query. None when `master` suffices or is
    not local (a cluster manager's slots are not counted)."""
    wanted = local_master(settings, pipeline)
    have, need = task_slots_of(master), task_slots_of(wanted)
    return wanted if have is not None and need is not None and need > have else None


def task_slots_of(master: str | None) -> int | None:
    """Task slots of a local master (local[N], local[*]); None when a cluster manager decides."""
    found = _LOCAL.match(master or "")
    if not found:
        return None
    return (os.cpu_count() or 1) if found.group(1) == "*" else int(found.group(1))


def require_slots(spark: SparkSession, sink: str, partitions: int, held: int, reserved: int) -> None:
    """Refuse to start `sink`'s query when the slots left (after `held` by other real-time queries and
    `reserved` for the micro-batch queries) are fewer than the `partitions` it reads."""
    slots = session_slots(spark)
    if slots is None:
        log.warning("%s: cannot count a cluster's task slots; it needs %d free for its partitions", sink, partitions)
        return
    free = slots - held - reserved
    if free < partitions:
        raise SlotsError(
            f"the real-time {sink} query reads {partitions} Kafka partitions but only {max(free, 0)} of "
            f"{spark.sparkContext.master}'s {slots} task slots are free ({held} held by other real-time queries, "
            f"{reserved} kept for the micro-batch queries): give the driver more slots (TIDE_JOB_MASTER, or a "
            "cluster's TIDE_JOB_EXECUTORS and its workers' cores) or "
            "run it as micro-batches (remove it from TIDE_JOB_REALTIME_SINKS)")


def start(records: DataFrame, sink: Sink, catalogue: Catalogue, settings: JobSettings, *, name: str,
          checkpoint: Path) -> StreamingQuery:
    """`records` (the Kafka source, no batch limit) decoded and shipped by `sink`'s JVM writer, as a
    Real-Time Mode query. PySpark's `foreach` takes Python writers only, so the JVM writer is attached
    through the query's Java DataStreamWriter, and the Java query wrapped as PySpark's."""
    from pyspark.sql.streaming import StreamingQuery

    from spark_jobs.changes.stream import decode_stream

    spark = records.sparkSession
    rows = sink.writer_rows(decode_stream(records, sink.tables(), catalogue, tombstones=True), catalogue)
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "a running session's context has its JVM gateway"
    writer = sink.writer(jvm, LetterTopic(settings.kafka_bootstrap, settings.dlq_topic))
    stream = (
        optimized(rows).writeStream().queryName(name).foreach(writer).outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(jvm.org.apache.spark.sql.streaming.Trigger.RealTime(settings.realtime_epoch))
    )
    with starting_with(spark, GENERATED_CODE):
        java_query = stream.start()
    return StreamingQuery(java_query)


def optimized(rows: DataFrame) -> Any:
    """`rows` as a Java Dataset over its optimized plan. Spark plans each epoch of a real-time query
    again from the plan it was started with, while no task reads (docs/apply.md, "Epochs"); handed an
    optimized plan, its optimizer has nothing left to do (the cache's plan: 17-33 ms instead of 66-82 ms
    on an idle machine). Refused for a plan that reads the clock, which optimizing freezes."""
    plan = rows._jdf.queryExecution().analyzed()
    if _CLOCK.search(plan.treeString(True, False, 2**31 - 1, False, False)):  # every field, none elided
        raise ValueError("a real-time plan that reads the clock cannot be planned once: take the time in the "
                         "sink's writer, or run the sink as micro-batches")
    jvm = rows.sparkSession.sparkContext._jvm
    assert jvm is not None, "a running session's context has its JVM gateway"
    session = rows.sparkSession._jsparkSession
    # The optimizer itself: a streaming plan's QueryExecution refuses to be optimized outside a query.
    return jvm.org.apache.spark.sql.classic.Dataset.ofRows(session, session.sessionState().optimizer().execute(plan))


class FollowUpWriter:
    """The foreachBatch function of a real-time sink's follow-up query (on the driver): waits for the
    store, applies the batch (`Sink.follow_up`) and writes what it rejected as dead letters."""

    def __init__(self, sink: Sink, settings: JobSettings) -> None:
        self.sink = sink
        self.settings = settings

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        wait_until(self.sink.available, f"{self.sink.name} store unavailable; follow-up batch {batch_id}")
        rejected = dead_letters.letters(self.sink.follow_up(records), f"apply:{self.sink.name}")
        dead_letters.write(rejected, self.settings.kafka_bootstrap, self.settings.dlq_topic)


class QueryGroup:
    """A real-time query and its follow-up micro-batch query, supervised as one: active while both are,
    stopped together (the supervisor then starts both again), progress from the real-time one."""

    def __init__(self, main: StreamingQuery, follow: StreamingQuery) -> None:
        self.queries = (main, follow)

    @property
    def isActive(self) -> bool:  # noqa: N802 - StreamingQuery's name
        return all(query.isActive for query in self.queries)

    @property
    def lastProgress(self) -> dict | None:  # noqa: N802 - StreamingQuery's name
        return self.queries[0].lastProgress

    @property
    def status(self) -> dict:
        return self.queries[0].status

    def exception(self) -> object:
        return next((error for query in self.queries if (error := query.exception()) is not None), None)

    def stop(self) -> None:
        for query in self.queries:
            if query.isActive:
                query.stop()


# A follow-up topic's records matter until the follow-up query has read them: a day covers a stopped driver.
FOLLOW_UP_RETENTION_MS = 24 * 3600 * 1000


def follow_up(main: StreamingQuery, records: DataFrame, sink: Sink, settings: JobSettings, *,
              checkpoint: Path) -> QueryGroup:
    """Start `sink`'s follow-up query on `records` (its `follow_up_topic`, as micro-batches on the
    micro-batch queries' trigger) beside its real-time query `main`."""
    stream = (
        records.writeStream.queryName(f"{main.name}-follow-up")
        .foreachBatch(FollowUpWriter(sink, settings))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=settings.trigger_interval)
    )
    with starting_with(records.sparkSession, {}):  # a micro-batch query: the session's own conf
        return QueryGroup(main, stream.start())


class WriterTimes:
    """Logs, every `every_s`, how long the JVM writers' steps took (dev.tideline.writers.WriterTimes: a
    row's wait in its buffer, a chunk's ship, each Elasticsearch request, a write's wait to become
    searchable): where a change's time goes between Kafka and the store. A local driver only; on a
    cluster the writers run in the executors' JVMs, whose times stay there."""

    def __init__(self, spark: SparkSession, settings: JobSettings, every_s: float = 60.0) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None, "a running session's context has its JVM gateway"
        # None: nothing to read here (no real-time query, or its writers run in the executors' JVMs).
        read_here = settings.realtime_sinks and not is_cluster(spark.sparkContext.master)
        self._times = jvm.dev.tideline.writers.WriterTimes if read_here else None
        self._every_s = every_s
        self._next_at = time.monotonic() + every_s

    def log_due(self, now: float) -> None:
        if self._times is None or now < self._next_at:
            return
        self._next_at = now + self._every_s
        if line := self._times.drain():
            log.info("writer times over %.0f s: %s", self._every_s, line)


__all__ = ["CLUSTER_BATCH_SLOTS", "FollowUpWriter", "QueryGroup", "SlotsError", "WriterTimes", "batch_slots",
           "cluster_conf", "cluster_slots", "follow_up", "is_cluster", "local_master", "needed_slots",
           "outgrown", "partitions_read", "require_slots", "start", "task_slots_of"]

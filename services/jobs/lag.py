"""How far each sink's query is behind the end of its topics, from the real systems:
the offsets in the query's checkpoint (what Spark committed) against Kafka's end offsets. A real-time
query commits only at its epochs' ends (seconds apart), so its writers also publish what they applied
as the offsets of a consumer group of the query's own (spark_jobs/jars' AppliedPositions)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from services.jobs import driver
from services.settings import StackSettings
from spark_jobs.model.config import PipelineConfig
from spark_jobs.model.settings import JobSettings
from spark_jobs.runtime.checkpoints import Offsets, committed_offsets, follow_up, furthest, query_id

__all__ = ["applied_offsets", "committed_offsets", "end_offsets", "follow_up_behind", "follow_up_topic", "positions",
           "records_behind", "sink_positions"]

# AppliedPositions.GROUP_PREFIX: a real-time query's group is this and its query id.
APPLIED_GROUP_PREFIX = "tideline-applied-"


def applied_offsets(settings: StackSettings, checkpoints: dict[str, Path],
                    bootstrap_timeout_ms: int = 30_000) -> dict[str, Offsets]:
    """{query: {topic: {partition: next offset}}} its writers published as applied, for the real-time
    queries whose checkpoints are given; a query not started yet or not published to has {}."""
    groups = {name: APPLIED_GROUP_PREFIX + query for name, path in checkpoints.items()
              if (query := query_id(path)) is not None}
    if not groups:
        return {name: {} for name in checkpoints}
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, bootstrap_timeout_ms=bootstrap_timeout_ms)
    try:
        found = admin.list_group_offsets(list(groups.values()))
    finally:
        admin.close()
    result: dict[str, Offsets] = {}
    for name in checkpoints:
        offsets: Offsets = {}
        for tp, committed in found.get(groups.get(name, ""), {}).items():
            if committed.offset >= 0:
                offsets.setdefault(tp.topic, {})[tp.partition] = committed.offset
        result[name] = offsets
    return result


def positions(settings: StackSettings, checkpoints: dict[str, Path], realtime: Iterable[str],
              bootstrap_timeout_ms: int = 30_000) -> dict[str, Offsets]:
    """{query: offsets it has applied}: its checkpoint's or, for a real-time query (in `realtime`), the
    further of those and what its writers published as applied since its last epoch."""
    committed = {name: committed_offsets(path) for name, path in checkpoints.items()}
    live = {name: checkpoints[name] for name in realtime if name in checkpoints}
    if not live:
        return committed
    applied = applied_offsets(settings, live, bootstrap_timeout_ms)
    return {name: furthest(offsets, applied.get(name, {})) for name, offsets in committed.items()}


def sink_positions(settings: StackSettings, sinks: Iterable[str], bootstrap_timeout_ms: int = 30_000
                   ) -> dict[str, Offsets]:
    """`positions` of `sinks`' queries as the driver of `settings` runs them (its checkpoints, its
    real-time sinks): what a test or a benchmark waits on to know a sink has applied the topics."""
    jobs = driver.job_settings(settings)
    return positions(settings, {sink: jobs.checkpoint_dir / sink for sink in sinks}, jobs.realtime_sinks,
                     bootstrap_timeout_ms)


def end_offsets(settings: StackSettings, topics: list[str], bootstrap_timeout_ms: int = 30_000,
                consumer: KafkaConsumer | None = None) -> dict[str, dict[int, int]]:
    """{topic: {partition: end offset}}; with a new consumer each call unless one is given (to poll often)."""
    own = consumer is None
    consumer = consumer or KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap,
                                         bootstrap_timeout_ms=bootstrap_timeout_ms)
    try:
        partitions = [TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or ()]
        ends = consumer.end_offsets(partitions) if partitions else {}
    finally:
        if own:
            consumer.close()
    result: dict[str, dict[int, int]] = {}
    for tp, offset in ends.items():
        result.setdefault(tp.topic, {})[tp.partition] = offset
    return result


def records_behind(committed: dict[str, dict[int, int]], ends: dict[str, dict[int, int]]) -> int:
    """Records in `ends` not yet committed. A partition already past an (earlier) end counts 0, not
    a negative number that would cancel another partition's lag."""
    return sum(
        max(0, end - committed.get(topic, {}).get(part, 0))
        for topic, parts in ends.items() for part, end in parts.items()
    )


def follow_up_topic(jobs: JobSettings, pipeline: PipelineConfig, sink: str) -> str | None:
    """The topic `sink`'s follow-up query reads when it runs in Real-Time Mode (search's nested views'
    lookups, spark_jobs/realtime.py), or None: it has nothing to follow up."""
    from spark_jobs.sinks.base import build_sink

    return build_sink(sink, jobs, pipeline).follow_up_topic()


def follow_up_behind(settings: StackSettings, jobs: JobSettings, sink: str, topic: str,
                     consumer: KafkaConsumer | None = None) -> int:
    """Records of `topic` that `sink`'s follow-up query has not committed: until it has, the nested
    documents those lookups reach are behind their rows."""
    ends = end_offsets(settings, [topic], consumer=consumer)
    return records_behind(committed_offsets(follow_up(jobs.checkpoint_dir / sink)), ends)

"""How far each sink's query is behind the end of its topics, from the real systems:
the offsets in the query's checkpoint (what Spark committed) against Kafka's end offsets."""

from __future__ import annotations

from kafka import KafkaConsumer, TopicPartition

from services.settings import StackSettings
from spark_jobs.checkpoints import committed_offsets

__all__ = ["committed_offsets", "end_offsets", "records_behind"]


def end_offsets(settings: StackSettings, topics: list[str], bootstrap_timeout_ms: int = 30_000,
                consumer: KafkaConsumer | None = None) -> dict[str, dict[int, int]]:
    """{topic: {partition: end offset}}; with a new consumer each call unless one is given (to poll often)."""
    own = consumer is None
    consumer = consumer or KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, bootstrap_timeout_ms=bootstrap_timeout_ms)
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
        max(0, end - committed.get(topic, {}).get(part, 0)) for topic, parts in ends.items() for part, end in parts.items()
    )

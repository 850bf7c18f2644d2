"""How far each sink's query is behind the end of its topics, from the real systems:
the offsets in the query's checkpoint (what Spark committed) against Kafka's end offsets."""

from __future__ import annotations

import json
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from services.settings import StackSettings


def committed_offsets(checkpoint: Path) -> dict[str, dict[int, int]]:
    """{topic: {partition: next offset}} after the newest committed micro-batch; {} before the first."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")] if (checkpoint / "commits").is_dir() else []
    if not commits:
        return {}
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    source = json.loads(lines[2])  # line 0: version, line 1: batch metadata, then one line per source
    return {topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in source.items()}


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

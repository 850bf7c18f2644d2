"""What the dead-letter topic holds, per sink: read from Kafka up to its end offsets (no consumer group)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from kafka import KafkaConsumer, TopicPartition

from services.settings import StackSettings


def read_letters(
    settings: StackSettings, topic: str, max_records: int = 1_000_000, bootstrap_timeout_ms: int = 30_000
) -> list[dict]:
    """Every dead letter now in `topic`, oldest first per partition; [] if the topic does not exist."""
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                             bootstrap_timeout_ms=bootstrap_timeout_ms)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        if not partitions:
            return []
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        letters: list[dict] = []
        while any(consumer.position(tp) < end for tp, end in ends.items()) and len(letters) < max_records:
            for records in consumer.poll(timeout_ms=1000).values():
                letters += [json.loads(record.value) for record in records if record.value]
        return letters
    finally:
        consumer.close()


def count_by_sink_and_topic(letters: Iterable[dict]) -> dict[tuple[str, str], int]:
    """Distinct failed records per (sink, origin topic) ("decode:<sink>" and "apply:<sink>" stages).
    A record sent twice (delivery is at least once) counts once: it is known by its origin
    topic/partition/offset."""
    seen: dict[tuple[str, str], set[tuple]] = {}
    for letter in letters:
        sink = letter.get("stage", "").partition(":")[2] or "?"
        topic = letter.get("topic") or "?"
        seen.setdefault((sink, topic), set()).add((letter.get("partition"), letter.get("offset")))
    return {key: len(origins) for key, origins in seen.items()}


def count_by_sink(letters: Iterable[dict]) -> dict[str, int]:
    """Distinct failed records per sink: the per-topic counts added up."""
    totals: dict[str, int] = {}
    for (sink, _), count in count_by_sink_and_topic(letters).items():
        totals[sink] = totals.get(sink, 0) + count
    return totals

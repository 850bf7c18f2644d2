"""Reading change topics back in tests: every record up to the end offsets, decoded and folded per key."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from services.settings import StackSettings
from spark_jobs.changes import Change, decode, decode_key
from spark_jobs.config import PipelineConfig


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def read_topic(settings: StackSettings, topic: str, timeout: float = 30.0) -> list[Record]:
    """All records from the beginning to the end offsets as of the call, in (partition, offset) order.
    Fails after `timeout` seconds without progress: a large topic may take longer than that in all."""
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            return []  # not created yet: the connector creates topics on its first record
        assignment = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(assignment)
        ends = consumer.end_offsets(assignment)
        consumer.seek_to_beginning(*assignment)
        records: list[Record] = []
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic} to its end offsets made no progress for {timeout}s")
            for tp, batch in consumer.poll(timeout_ms=500).items():
                records += [Record(tp.partition, r.offset, r.key, r.value) for r in batch if r.offset < ends[tp]]
                deadline = time.monotonic() + timeout
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def changes(settings: StackSettings, topic: str) -> list[tuple[Record, Change | None]]:
    return [(record, decode(topic, record.key, record.value)) for record in read_topic(settings, topic)]


def key_of(record: Record) -> tuple:
    return tuple(sorted(decode_key(record.key).items()))


def fold(decoded: list[tuple[Record, Change | None]]) -> dict[tuple, dict[str, Any] | None]:
    """Latest row per key, as a sink would hold it: unchanged-TOAST columns keep their earlier value."""
    rows: dict[tuple, dict[str, Any] | None] = {}
    for record, change in decoded:
        if change is None or change.op == "t":
            continue
        key = key_of(record)
        if change.op == "d":
            rows[key] = None
            continue
        previous = rows.get(key) or {}
        rows[key] = {**change.after, **{c: previous.get(c) for c in change.unavailable}}
    return rows


def unique_pipeline(base: PipelineConfig, label: str) -> PipelineConfig:
    """The same tables with a connector, slot and topic prefix of their own (tests share one Connect)."""
    suffix = f"{label}{uuid.uuid4().hex[:6]}"
    source = base.source.model_copy(
        update={"connector": f"test-{suffix}", "slot": f"test_{suffix}", "topic_prefix": f"test{suffix}"}
    )
    return base.model_copy(update={"source": source})

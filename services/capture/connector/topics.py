"""`tide topics` and `tide tail`: look at the change topics Debezium writes, without touching them.

Everything here reads Kafka with a group-less consumer (no committed offsets,
no consumer group to clean up), so inspecting a topic never moves the
position of a Spark query or of anything else.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from rich.table import Column, Table

from services.capture import objects
from services.console import console, load_settings, user_errors
from services.settings import StackSettings
from services.stack.service import StackError
from spark_jobs.changes import Change, DecodeError, decode, decode_key
from spark_jobs.model.config import PipelineConfig

# Debezium's default `topic.heartbeat.prefix`; the heartbeat topic is <prefix>.<topic.prefix>.
HEARTBEAT_TOPIC_PREFIX = "__debezium-heartbeat"


class TopicError(StackError):
    """Kafka is unreachable or a topic cannot be read; the message names the fix."""


def require_table(pipeline: PipelineConfig, table: str) -> str:
    """The bare table name if pipeline.yaml captures it (`products` or `public.products`), else a TopicError."""
    schema = pipeline.source.schema_name
    name = table.removeprefix(f"{schema}.")
    if name not in pipeline.tables:
        raise TopicError(
            f"unknown table {table!r}: pipeline.yaml captures {', '.join(pipeline.qualified_tables())}"
        )
    return name


def notifications_topic(pipeline: PipelineConfig) -> str:
    """Where Debezium publishes its notifications (`notification.sink.topic.name` in the connector template)."""
    return f"{pipeline.source.topic_prefix}.notifications"


def heartbeat_topic(pipeline: PipelineConfig) -> str:
    return f"{HEARTBEAT_TOPIC_PREFIX}.{pipeline.source.topic_prefix}"


def open_consumer(settings: StackSettings) -> KafkaConsumer:
    """A group-less, never-committing consumer: reading through it changes no one's position."""
    try:
        return KafkaConsumer(
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=None,
            enable_auto_commit=False,
            client_id="tide-inspect",
            request_timeout_ms=15_000,
        )
    except KafkaError as exc:
        raise TopicError(
            f"cannot reach Kafka at {settings.kafka_bootstrap} ({exc.__class__.__name__}): "
            "is the stack up? (`tide stack up`)"
        ) from exc


def partitions(consumer: KafkaConsumer, topic: str) -> list[TopicPartition]:
    """The topic's partitions, or [] if the topic does not exist."""
    numbers = consumer.partitions_for_topic(topic) or set()
    return [TopicPartition(topic, number) for number in sorted(numbers)]


def end_offsets(consumer: KafkaConsumer, topic: str) -> dict[TopicPartition, int]:
    """The offset the next record of each partition will get ({} if the topic does not exist)."""
    parts = partitions(consumer, topic)
    return dict(consumer.end_offsets(parts)) if parts else {}


@dataclass(frozen=True)
class TopicSummary:
    """One topic as `tide topics` shows it; `partitions` is None when the topic does not exist."""

    name: str
    kind: str  # "change", "notifications" or "heartbeat"
    partitions: int | None
    # Sum over partitions of end - beginning offsets: the records Kafka still holds, except that
    # compaction leaves gaps in a compacted topic's offsets, so there it is an upper bound.
    messages: int
    end_offsets: dict[int, int]


def summarize_topic(consumer: KafkaConsumer, name: str, kind: str) -> TopicSummary:
    parts = partitions(consumer, name)
    if not parts:
        return TopicSummary(name, kind, None, 0, {})
    beginning = consumer.beginning_offsets(parts)
    end = consumer.end_offsets(parts)
    return TopicSummary(
        name=name,
        kind=kind,
        partitions=len(parts),
        messages=sum(end[tp] - beginning[tp] for tp in parts),
        end_offsets={tp.partition: end[tp] for tp in parts},
    )


def summarize(settings: StackSettings, pipeline: PipelineConfig) -> list[TopicSummary]:
    """Every configured table's change topic (present or not), then the notifications and heartbeat topics."""
    consumer = open_consumer(settings)
    try:
        rows = [summarize_topic(consumer, pipeline.topic(table), "change") for table in pipeline.tables]
        for name, kind in ((notifications_topic(pipeline), "notifications"), (heartbeat_topic(pipeline), "heartbeat")):
            summary = summarize_topic(consumer, name, kind)
            if summary.partitions is not None:
                rows.append(summary)
        return rows
    except KafkaError as exc:
        raise TopicError(f"reading topic offsets from {settings.kafka_bootstrap} failed: {exc}") from exc
    finally:
        consumer.close()


@dataclass(frozen=True)
class TailEvent:
    """One record of a change topic: a change, a tombstone (change and error None) or an undecodable record."""

    partition: int
    offset: int
    key: dict[str, Any]
    change: Change | None
    error: str | None = None

    @property
    def is_tombstone(self) -> bool:
        return self.change is None and self.error is None


def _event(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> TailEvent:
    try:
        change = decode(topic, key, value)
        return TailEvent(partition, offset, change.key if change else decode_key(key), change)
    except DecodeError as exc:
        # Shown, not raised: a tail that stops on one bad record would hide everything after it.
        return TailEvent(partition, offset, {}, None, str(exc))


def tail(
    settings: StackSettings,
    pipeline: PipelineConfig,
    table: str,
    from_beginning: bool = False,
    max_events: int | None = None,
) -> Iterator[TailEvent]:
    """Yield the table's change events as they arrive (from the end, or from the beginning), until max_events.

    Order is per partition (= per key), not across partitions: that is all Kafka orders.
    """
    topic = pipeline.topic(require_table(pipeline, table))
    consumer = open_consumer(settings)
    try:
        parts = partitions(consumer, topic)
        if not parts:
            raise TopicError(f"topic {topic} does not exist: is the connector registered? (`tide connector status`)")
        consumer.assign(parts)
        if from_beginning:
            consumer.seek_to_beginning(*parts)
        else:
            consumer.seek_to_end(*parts)
        seen = 0
        while max_events is None or seen < max_events:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    yield _event(topic, record.partition, record.offset, record.key, record.value)
                    seen += 1
                    if max_events is not None and seen >= max_events:
                        return
    except KafkaError as exc:
        raise TopicError(f"reading {topic} from {settings.kafka_bootstrap} failed: {exc}") from exc
    finally:
        consumer.close()


# Longer strings are cut in `tail` output (a TOASTed description would bury the event).
LONG_TEXT = 60


def _shorten(value: Any) -> Any:
    if isinstance(value, str) and len(value) > LONG_TEXT:
        return f"{value[:LONG_TEXT]}…(+{len(value) - LONG_TEXT} chars)"
    if isinstance(value, dict):
        return {key: _shorten(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shorten(item) for item in value]
    return value


def _compact(value: Any) -> str:
    return json.dumps(_shorten(value), separators=(",", ":"), default=str, ensure_ascii=False)


def _timestamp(ms: int | None) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") if ms is not None else "-"


def format_event(event: TailEvent) -> str:
    """One line per record: position, op, key, images, then where it came from in the WAL."""
    where = f"p{event.partition}@{event.offset}"
    if event.error is not None:
        return f"{where} undecodable: {event.error}"
    if event.change is None:
        return f"{where} tombstone key={_compact(event.key)}"
    change = event.change
    images = " ".join(
        f"{name}={_compact(image)}" for name, image in (("before", change.before), ("after", change.after)) if image
    )
    snapshot = f" snapshot={change.snapshot}" if change.snapshot and change.snapshot != "false" else ""
    # Unchanged TOASTed columns are absent from `after`; say so, or the row looks truncated.
    toast = f" unchanged_toast={','.join(sorted(change.unavailable))}" if change.unavailable else ""
    return (
        f"{where} op={change.op} key={_compact(change.key)} {images}{toast} "
        f"lsn={change.lsn if change.lsn is not None else '-'} txId={change.tx_id if change.tx_id is not None else '-'} "
        f"ts={_timestamp(change.commit_ts_ms)}{snapshot}"
    )


topics_app = typer.Typer()


@topics_app.command("topics")
def topics_command() -> None:
    """The change topics of the configured tables: partitions, message count and end offsets."""
    settings = load_settings()
    with user_errors():
        pipeline = objects.load_pipeline(settings)
        summaries = summarize(settings, pipeline)
    # Names and numbers are what users copy into other tools: never truncated; one offset per line keeps it narrow.
    table = Table(
        Column("topic", no_wrap=True, min_width=max(len(s.name) for s in summaries)),
        Column("partitions", justify="right", no_wrap=True),
        Column("messages", justify="right", no_wrap=True),
        Column("end offsets", no_wrap=True),
    )
    for summary in summaries:
        if summary.partitions is None:
            table.add_row(summary.name, "[yellow]absent[/yellow]", "-", "-")
            continue
        offsets = "\n".join(f"{partition}:{offset}" for partition, offset in sorted(summary.end_offsets.items()))
        table.add_row(summary.name, str(summary.partitions), str(summary.messages), offsets)
    console.print(table)


@topics_app.command("tail")
def tail_command(
    table: Annotated[str, typer.Argument(help="A table from pipeline.yaml, e.g. products.")],
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the oldest record Kafka holds.")
    ] = False,
    max_events: Annotated[int | None, typer.Option("--max", min=1, help="Stop after this many records.")] = None,
) -> None:
    """Print the table's change events as they arrive (Ctrl-C stops)."""
    settings = load_settings()
    with user_errors():
        pipeline = objects.load_pipeline(settings)
        try:
            for event in tail(settings, pipeline, table, from_beginning, max_events):
                console.print(format_event(event), markup=False, highlight=False, soft_wrap=True)
        except KeyboardInterrupt:
            return  # Ctrl-C is how a tail without --max ends: not an error

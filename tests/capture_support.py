"""Reading change topics back in tests: every record up to the end offsets, decoded and folded per key;
and the capture tests' own pipelines and connector look-ups."""

from __future__ import annotations

import json
import uuid
from typing import Any

from services.capture.connector.connect_api import ConnectApi
from services.chaos.observe import Delivered, read_to_end
from services.settings import StackSettings
from services.stack import kafka
from services.verify.canonical import TableShape
from spark_jobs.changes import Change, decode, decode_key
from spark_jobs.model.config import PipelineConfig, load

# The chaos runner's reader serves the tests too: one way to read a topic to its end.
Record = Delivered


def read_topic(settings: StackSettings, topic: str, timeout: float = 30.0) -> list[Record]:
    """All records from the beginning to the end offsets as of the call, in (partition, offset) order;
    fails after `timeout` seconds without progress."""
    return read_to_end(settings, topic, timeout)


def changes(settings: StackSettings, topic: str) -> list[tuple[Record, Change | None]]:
    return [(record, decode(topic, record.key, record.value)) for record in read_topic(settings, topic)]


def as_values(shape: TableShape, row: dict[str, Any] | None) -> dict[str, Any] | None:
    """A decoded schemaless row as values verify's canonicaliser compares with PostgreSQL's: its json and
    jsonb columns arrive as their JSON text, every other value as JSON gives it."""
    if row is None:
        return None
    json_columns = {column.name for column in shape.columns if column.type in ("json", "jsonb") and not column.array}
    return {name: json.loads(value) if name in json_columns and isinstance(value, str) else value
            for name, value in row.items()}


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


def customers_only(stack: StackSettings, **views: Any) -> PipelineConfig:
    """A pipeline of its own (unique_pipeline) with the customers table alone, its config updated by `views`."""
    base = unique_pipeline(load(stack.pipeline_file), "pii")
    table = base.tables["customers"].model_copy(update=views)
    return base.model_copy(update={"tables": {"customers": table}})


def registered(settings: StackSettings, name: str) -> bool:
    """Does Kafka Connect hold a connector of this name?"""
    with ConnectApi(kafka.connect_url(settings)) as api:
        return api.status(name) is not None

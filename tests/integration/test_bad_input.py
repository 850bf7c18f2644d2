"""The bad-input catalogue through the real capture and the real sinks (docs/reliability.md).

One scratch table of odd values is captured by a connector, slot and publication of the module's
own; its records are decoded as the apply jobs decode them and written by the real Elasticsearch,
Redis and Delta sinks; then `verify` compares every view with PostgreSQL. A value a sink cannot
hold must come back as a rejection with a reason (the apply jobs dead-letter it), and a value the
decoder cannot read as a DecodeError with a reason: nothing may be lost or changed silently.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from psycopg.types.json import Jsonb

import migrations
from migrations import capture
from services.connector import registration
from services.connector.connect_api import ConnectApi
from services.settings import StackSettings
from services.stack import elasticsearch, kafka, postgres
from services.verify import Divergence, verify
from spark_jobs.changes import Change, DecodeError, decode
from spark_jobs.config import CacheView, PipelineConfig, SearchView, TableConfig, WarehouseView, load
from spark_jobs.merge import doc_id
from spark_jobs.sinks.delta import DeltaSink
from spark_jobs.sinks.elasticsearch import ElasticsearchSink
from spark_jobs.sinks.redis import RedisSink
from tests.capture_support import read_topic, unique_pipeline
from tests.waiting import wait_until

pytestmark = pytest.mark.stack

RUN = uuid.uuid4().hex[:6]
ODD = f"odd_{RUN}"
MOOD = f"odd_mood_{RUN}"
REDIS_DB = 6
LONG_KEY = "k" * 600 + "-long"  # over Elasticsearch's 512-byte id limit
BIG_ROW_BYTES = 3 * 1024 * 1024


def _nested(depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"leaf": True}
    for level in range(depth):
        doc = {f"l{level}": doc}
    return doc


# id -> column values; every other column NULL.
ROWS: dict[str, dict[str, Any]] = {
    "nulls": {},
    "unicode 😀 ünïcödé 中文 שלום": {
        "note": "emoji 🎉 👩‍👩‍👧 tab\t newline\n quote\" backslash\\ zero-width\u200b",
        "tags": ["😀", "a,b", '"q"', None, ""], "doc": {"ключ": "значение", "emoji 🎉": [1]}},
    LONG_KEY: {"note": "a key longer than an Elasticsearch id"},
    "numbers-huge": {"big": Decimal("12345678901234567890123456789012345678901234567890.0123456789"),
                     "ints": [1, None, 2147483647]},
    "numbers-precise": {"big": Decimal("9007199254740993.000000000000000001")},
    "times-old": {"at_tz": datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=UTC),
                  "at_local": datetime(1900, 1, 1), "born": date(1901, 12, 13)},
    "times-zone": {"at_tz": datetime(2024, 3, 31, 2, 30, tzinfo=timezone(timedelta(hours=5, minutes=45)))},
    "json-odd-keys": {"doc": {"a.b": 1, "$x": None, " ": "space", "é": True, "big": 123456789012345678901234567890,
                              "list": [[], {}, [1, [2, [3]]]]}},
    "json-deep": {"doc": _nested(30)},
    "json-empty-key": {"doc": {"": "empty key"}},
}
INFINITE = {"at_tz": "infinity", "at_local": "-infinity", "born": "infinity"}


@pytest.fixture(scope="module")
def captured(stack: StackSettings) -> Iterator[tuple[PipelineConfig, dict[str, Any]]]:
    """The scratch table captured by the module's own connector; its decoded changes (or errors) by key."""
    migrations.upgrade(stack)
    views = TableConfig(search=SearchView(index=f"odd{RUN}"), cache=CacheView(), warehouse=WarehouseView())
    base = unique_pipeline(load(stack.pipeline_file), "odd")
    source = base.source.model_copy(update={"publication": f"test_odd_{RUN}"})
    pipeline = base.model_copy(update={"source": source, "tables": {**base.tables, ODD: views}})
    with _owner(stack) as conn:
        conn.execute(f"CREATE TYPE {MOOD} AS ENUM ('calm', 'busy')")
        conn.execute(f"""CREATE TABLE {ODD} (id text PRIMARY KEY, note text, big numeric, ints int[], tags text[],
                         at_tz timestamptz, at_local timestamp, born date, doc jsonb, mood {MOOD})""")
    try:
        registration.apply(stack, pipeline)
        with _owner(stack) as conn:
            for key, values in ROWS.items():
                _insert(conn, key, values)
            conn.execute(f"INSERT INTO {ODD} (id, at_tz, at_local, born) VALUES ('times-infinite', %s, %s, %s)",
                         (INFINITE["at_tz"], INFINITE["at_local"], INFINITE["born"]))
            conn.execute(f"ALTER TYPE {MOOD} ADD VALUE 'added-later'")  # after the connector read the type
            _insert(conn, "enum-later", {"mood": "added-later"})
            _insert(conn, "enum-known", {"mood": "busy"})
        yield pipeline, _decoded(stack, pipeline, {*ROWS, "times-infinite", "enum-later", "enum-known"})
    finally:
        registration.delete(stack, pipeline, drop_slot=True)
        with _owner(stack) as conn:
            capture.drop_publication(conn, pipeline)
            conn.execute(f"DROP TABLE IF EXISTS {ODD}")
            conn.execute(f"DROP TYPE IF EXISTS {MOOD}")


def _owner(stack: StackSettings) -> psycopg.Connection:
    return psycopg.connect(postgres.conninfo(stack), autocommit=True)


def _insert(conn: psycopg.Connection, key: str, values: dict[str, Any]) -> None:
    values = {name: Jsonb(value) if name == "doc" else value for name, value in values.items()}
    columns = ", ".join(["id", *values])
    marks = ", ".join(["%s"] * (len(values) + 1))
    conn.execute(f"INSERT INTO {ODD} ({columns}) VALUES ({marks})", (key, *values.values()))


def _decoded(stack: StackSettings, pipeline: PipelineConfig, keys: set[str]) -> dict[str, Change | DecodeError]:
    """Each key's record in the topic, decoded as the apply jobs decode it, once all have arrived."""
    topic = pipeline.topic(ODD)

    def everything_arrived() -> dict[str, Change | DecodeError] | None:
        found: dict[str, Change | DecodeError] = {}
        for record in read_topic(stack, topic):
            if record.value is None:
                continue
            key = json.loads(record.key)["payload"]["id"]
            try:
                found[key] = decode(topic, record.key, record.value, record.partition, record.offset)
            except DecodeError as exc:
                found[key] = exc
        return found if keys <= found.keys() else None

    return wait_until(everything_arrived, 120, f"a record for each of {len(keys)} rows in {topic}")


@pytest.fixture(scope="module")
def spark(stack: StackSettings) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from services.stack import jars
    from spark_jobs.session import build_session

    existing = SparkSession.getActiveSession()
    session = existing or build_session("tideline-test-bad-input", jars.bundle_dir(stack, "spark"), master="local[1]")
    yield session
    if existing is None:
        session.stop()


def test_each_odd_value_decodes_exactly_or_fails_with_a_reason(captured):
    _, decoded = captured
    for key, result in decoded.items():
        print("DECODED", key[:40], repr(result)[:600])


def test_explore_sinks(stack, captured, spark, tmp_path):
    pipeline, decoded = captured
    changes = [c for c in decoded.values() if isinstance(c, Change)]
    prefix, warehouse = f"odd{RUN}:", tmp_path / "warehouse"
    redis_url = f"redis://{stack.host}:{stack.redis_port}/{REDIS_DB}"
    only = pipeline.model_copy(update={"tables": {ODD: pipeline.tables[ODD]}, "nested": {}, "cache_aggregates": {}})
    search = ElasticsearchSink(elasticsearch.url(stack), only)
    cache = RedisSink(redis_url, only, key_prefix=prefix)
    delta = DeltaSink(str(warehouse), only)
    for sink in (search, cache, delta):
        sink.setup(only)
    for name, rejected in (("search", search.write(changes)), ("cache", cache.write(changes)),
                           ("warehouse", delta.write_batch(spark, spark.sparkContext.parallelize(changes, 1), 0))):
        for item in rejected:
            print("REJECTED", name, doc_id(item.change.key)[:40], item.reason[:300])
    with _owner(stack) as conn:
        conn.execute(f"DELETE FROM {ODD} WHERE id = 'times-infinite'")
    for d in verify(stack, tables=[ODD], warehouse_dir=warehouse, es_url=elasticsearch.url(stack), redis_url=redis_url,
                    pipeline=only, redis_prefix=prefix, spark=spark):
        print("DIVERGENCE", d)


def test_explore_big_row(stack, captured):
    pipeline, _ = captured
    with _owner(stack) as conn:
        _insert(conn, "big-row", {"note": uuid.uuid4().hex * (BIG_ROW_BYTES // 32)})
    import time, sys
    for _ in range(8):
        time.sleep(5)
        with ConnectApi(kafka.connect_url(stack)) as api:
            state = api.status(pipeline.source.connector)
        found = [r for r in read_topic(stack, pipeline.topic(ODD)) if r.key and b"big-row" in r.key]
        print("BIG", state["connector"]["state"], [(t["state"], (t.get("trace") or "")[:300]) for t in state["tasks"]],
              [len(r.value or b"") for r in found], file=sys.stderr)

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

import httpx
import psycopg
import pytest
import redis
from psycopg.types.json import Jsonb

import migrations
from migrations import capture
from services.connector import registration
from services.settings import StackSettings
from services.stack import elasticsearch, postgres
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
COLUMNS = ("id", "note", "big", "ints", "tags", "at_tz", "at_local", "born", "doc", "mood")
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
def sinks(stack: StackSettings, captured, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sinks]:
    pipeline, _ = captured
    sinks = Sinks(stack, pipeline, spark, tmp_path_factory.mktemp("warehouse"))
    yield sinks
    sinks.close()


class Sinks:
    """The three real sinks, holding only the scratch table's views."""

    def __init__(self, stack: StackSettings, pipeline: PipelineConfig, spark: Any, warehouse: Path) -> None:
        self.stack, self.spark, self.warehouse = stack, spark, warehouse
        self.pipeline = PipelineConfig(source=pipeline.source, tables={ODD: pipeline.tables[ODD]})
        self.redis_url, self.prefix = f"redis://{stack.host}:{stack.redis_port}/{REDIS_DB}", f"odd{RUN}:"
        self.search = ElasticsearchSink(elasticsearch.url(stack), self.pipeline)
        self.cache = RedisSink(self.redis_url, self.pipeline, key_prefix=self.prefix)
        self.warehouse_sink = DeltaSink(str(warehouse), self.pipeline)
        for sink in (self.search, self.cache, self.warehouse_sink):
            sink.setup(self.pipeline)
        self.batches = 0  # the warehouse commits each micro-batch id once

    def write(self, changes: list[Change]) -> dict[str, dict[str, str]]:
        """Each sink's rejections: {sink: {row id: reason}}."""
        rows = self.spark.sparkContext.parallelize(changes, 1)
        rejected = {"search": self.search.write(changes), "cache": self.cache.write(changes),
                    "warehouse": self.warehouse_sink.write_batch(self.spark, rows, self.batches)}
        self.batches += 1
        return {sink: {doc_id(item.change.key): item.reason for item in items} for sink, items in rejected.items()}

    def verify(self) -> list[Divergence]:
        return verify(self.stack, tables=[ODD], warehouse_dir=self.warehouse, es_url=elasticsearch.url(self.stack),
                      redis_url=self.redis_url, pipeline=self.pipeline, redis_prefix=self.prefix)

    def close(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        for key in client.scan_iter(match=f"{self.prefix}*"):
            client.delete(key)
        client.close()
        url, alias = elasticsearch.url(self.stack), self.pipeline.tables[ODD].search.index
        for index in httpx.get(f"{url}/_alias/{alias}").json():
            httpx.delete(f"{url}/{index}")


# Elasticsearch's own limits on object fields; the other sinks keep jsonb as JSON text.
SEARCH_REFUSES = {"json-odd-keys": "cannot contain only whitespace", "json-empty-key": "cannot be an empty string",
                  "json-deep": "Limit of mapping depth [20]"}
ONLY_THE_REFUSED_ROWS_MISSING = {
    Divergence(ODD, "search", "missing", 4, tuple(sorted({*SEARCH_REFUSES, "times-infinite"}))),
    Divergence(ODD, "cache", "missing", 1, ("times-infinite",)),
    Divergence(ODD, "warehouse", "missing", 1, ("times-infinite",)),
}


def test_each_odd_value_is_decoded_exactly_and_an_infinity_refused_with_its_reason(captured):
    _, decoded = captured
    for key, values in {**ROWS, "enum-later": {"mood": "added-later"}, "enum-known": {"mood": "busy"}}.items():
        change = decoded[key]
        assert isinstance(change, Change), (key, change)
        expected = {column: None for column in COLUMNS} | {"id": key, **values}
        assert change.after == expected, key
    assert decoded["unicode 😀 ünïcödé 中文 שלום"].after["doc"]["emoji 🎉"] == [1]
    assert decoded["numbers-huge"].after["big"] == ROWS["numbers-huge"]["big"]  # all 60 digits, no float on the way
    assert decoded["times-zone"].after["at_tz"].utcoffset() is not None
    infinite = decoded["times-infinite"]
    assert isinstance(infinite, DecodeError) and "column at_tz: cannot convert 'infinity'" in str(infinite)


def test_every_sink_holds_each_odd_value_exactly_or_rejects_it_with_the_reason(captured, sinks):
    _, decoded = captured
    rejected = sinks.write([change for change in decoded.values() if isinstance(change, Change)])
    assert rejected["cache"] == {} and rejected["warehouse"] == {}
    assert rejected["search"].keys() == SEARCH_REFUSES.keys()
    assert all(SEARCH_REFUSES[key] in reason for key, reason in rejected["search"].items()), rejected["search"]
    # The long key's document has a stable hashed id, and holds the whole key.
    long_id = doc_id({"id": LONG_KEY})
    assert long_id == "sha256:" + hashlib.sha256(LONG_KEY.encode()).hexdigest()
    index = sinks.pipeline.tables[ODD].search.index
    found = httpx.get(f"{elasticsearch.url(sinks.stack)}/{index}/_doc/{long_id}").json()
    assert found["found"] and found["_source"]["id"] == LONG_KEY
    # PostgreSQL as the oracle: every value equal in every view, but the rows the search view
    # rejected and the infinity row, which no sink can hold (both dead-lettered with the reason by
    # the apply jobs): verify reads 'infinity' from PostgreSQL and reports it missing everywhere.
    assert set(sinks.verify()) == ONLY_THE_REFUSED_ROWS_MISSING


def test_a_row_of_several_mb_reaches_its_topic_whole_and_every_sink(stack, captured, sinks):
    pipeline, _ = captured
    note = "".join(uuid.uuid4().hex for _ in range(BIG_ROW_BYTES // 32))
    with _owner(stack) as conn:
        _insert(conn, "big-row", {"note": note})
    change = _decoded(stack, pipeline, {"big-row"})["big-row"]
    assert change.after["note"] == note
    assert sinks.write([change]) == {"search": {}, "cache": {}, "warehouse": {}}
    assert set(sinks.verify()) == ONLY_THE_REFUSED_ROWS_MISSING

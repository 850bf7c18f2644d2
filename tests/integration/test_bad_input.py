"""The bad-input catalogue through the real capture and the real sinks (docs/reliability.md).

One scratch table of odd values is captured by a connector, slot and publication of the module's
own; its records are decoded as the apply jobs decode them (Spark SQL, stream.py) and written by the
real Elasticsearch, Redis and Delta sinks, typed from PostgreSQL's catalogue; then `verify` compares
every view with PostgreSQL. A value a sink cannot hold must come back as a rejection with a reason
(the apply jobs dead-letter it): nothing may be lost or changed silently.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
from psycopg.types.json import Jsonb

from services.capture import objects
from services.capture.connector import registration
from services.db import migrate
from services.settings import StackSettings
from services.stack import elasticsearch, postgres
from services.verify import Divergence, verify
from spark_jobs.changes.envelope import row_id
from spark_jobs.changes.stream import decode_stream
from spark_jobs.model import catalogue
from spark_jobs.model.config import CacheView, PipelineConfig, SearchView, TableConfig, WarehouseView, load
from spark_jobs.sinks.delta.warehouse import WarehouseSink
from spark_jobs.sinks.elasticsearch import ElasticsearchSink
from spark_jobs.sinks.redis import RedisSink
from tests.capture_support import read_topic, unique_pipeline
from tests.sink_batches import apply
from tests.unit.test_stream import KAFKA
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
                  "at_local": datetime(1900, 1, 1), "born": date(1901, 12, 13), "at_time": time(20, 17, 40, 123456)},
    "times-new": {"at_local": datetime(2024, 2, 29, 23, 59, 59, 500000), "born": date(2024, 2, 29),
                  "at_time": time(0, 0)},
    "times-zone": {"at_tz": datetime(2024, 3, 31, 2, 30, tzinfo=timezone(timedelta(hours=5, minutes=45)))},
    "json-odd-keys": {"doc": {"a.b": 1, "$x": None, " ": "space", "é": True, "big": 123456789012345678901234567890,
                              "list": [[], {}, [1, [2, [3]]]]}},
    "json-deep": {"doc": _nested(30)},
    "json-empty-key": {"doc": {"": "empty key"}},
}
COLUMNS = ("id", "note", "big", "ints", "tags", "at_tz", "at_local", "born", "at_time", "doc", "mood")
# PostgreSQL's infinite times, each way round in each type (Debezium writes most as a sentinel time).
INFINITE = {"times-infinite": {"at_tz": "infinity", "at_local": "-infinity", "born": "infinity"},
            "times-minus-infinite": {"at_tz": "-infinity", "at_local": "infinity", "born": "-infinity"}}


@pytest.fixture(scope="module")
def captured(stack: StackSettings, spark) -> Iterator[tuple[PipelineConfig, dict[str, dict[str, Any]]]]:
    """The scratch table captured by the module's own connector; each key's record decoded (CHANGE rows)."""
    migrate.upgrade(stack)
    views = TableConfig(search=SearchView(index=f"odd{RUN}"), cache=CacheView(), warehouse=WarehouseView())
    base = unique_pipeline(load(stack.pipeline_file), "odd")
    source = base.source.model_copy(update={"publication": f"test_odd_{RUN}"})
    pipeline = base.model_copy(update={"source": source, "tables": {**base.tables, ODD: views}})
    with _owner(stack) as conn:
        conn.execute(f"CREATE TYPE {MOOD} AS ENUM ('calm', 'busy')")
        conn.execute(f"""CREATE TABLE {ODD} (id text PRIMARY KEY, note text, big numeric, ints int[], tags text[],
                         at_tz timestamptz, at_local timestamp, born date, at_time time, doc jsonb,
                         mood {MOOD})""")
    try:
        registration.apply(stack, pipeline)
        with _owner(stack) as conn:
            for key, values in ROWS.items():
                _insert(conn, key, values)
            for key, values in INFINITE.items():
                _insert(conn, key, values)
            conn.execute(f"ALTER TYPE {MOOD} ADD VALUE 'added-later'")  # after the connector read the type
            _insert(conn, "enum-later", {"mood": "added-later"})
            _insert(conn, "enum-known", {"mood": "busy"})
        yield pipeline, _decoded(stack, spark, pipeline, {*ROWS, *INFINITE, "enum-later", "enum-known"})
    finally:
        registration.delete(stack, pipeline, drop_slot=True)
        with _owner(stack) as conn:
            objects.drop_publication(conn, pipeline)
            conn.execute(f"DROP TABLE IF EXISTS {ODD}")
            conn.execute(f"DROP TYPE IF EXISTS {MOOD}")


def _owner(stack: StackSettings) -> psycopg.Connection:
    return psycopg.connect(postgres.conninfo(stack), autocommit=True)


def _insert(conn: psycopg.Connection, key: str, values: dict[str, Any]) -> None:
    values = {name: Jsonb(value) if name == "doc" else value for name, value in values.items()}
    columns = ", ".join(["id", *values])
    marks = ", ".join(["%s"] * (len(values) + 1))
    conn.execute(f"INSERT INTO {ODD} ({columns}) VALUES ({marks})", (key, *values.values()))


def _decoded(stack: StackSettings, spark: Any, pipeline: PipelineConfig, keys: set[str]) -> dict[str, dict[str, Any]]:
    """Each key's newest record in the topic, decoded as the apply jobs decode it, once all have arrived."""
    topic = pipeline.topic(ODD)

    def everything_arrived() -> list | None:
        records = [r for r in read_topic(stack, topic) if r.value is not None]
        return records if keys <= {json.loads(r.key)["id"] for r in records} else None

    records = wait_until(everything_arrived, 120, f"a record for each of {len(keys)} rows in {topic}")
    frame = spark.createDataFrame([(topic, r.partition, r.offset, r.key, r.value, []) for r in records], KAFKA)
    with _owner(stack) as conn:
        types = catalogue.read(conn, pipeline.source.schema_name, [ODD])
    decoded = decode_stream(frame, [ODD], types).orderBy("origin.offset").collect()
    return {row["row_id"]: row.asDict(recursive=True) for row in decoded}


@pytest.fixture(scope="module")
def sinks(stack: StackSettings, captured, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sinks]:
    pipeline, _ = captured
    sinks = Sinks(stack, pipeline, spark, tmp_path_factory.mktemp("warehouse"))
    yield sinks
    sinks.close()


class Sinks:
    """The three real sinks, holding only the scratch table's views, typed by PostgreSQL's catalogue."""

    def __init__(self, stack: StackSettings, pipeline: PipelineConfig, spark: Any, warehouse: Path) -> None:
        self.stack, self.spark, self.warehouse = stack, spark, warehouse
        self.pipeline = PipelineConfig(source=pipeline.source, tables={ODD: pipeline.tables[ODD]})
        self.redis_url, self.prefix = f"redis://{stack.host}:{stack.redis_port}/{REDIS_DB}", f"odd{RUN}:"
        with _owner(stack) as conn:
            self.catalogue = catalogue.read(conn, pipeline.source.schema_name, [ODD])
        self.sinks = {"search": ElasticsearchSink(elasticsearch.url(stack), self.pipeline),
                      "cache": RedisSink(self.redis_url, self.pipeline, key_prefix=self.prefix),
                      "warehouse": WarehouseSink(str(warehouse), self.pipeline)}
        for sink in self.sinks.values():
            sink.setup(spark, self.catalogue)
        self.batches = 0

    def write(self, rows: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
        """Each sink's rejections: {sink: {row id: reason}}."""
        rejected = {name: apply(sink, self.spark, rows, self.catalogue, self.batches)
                    for name, sink in self.sinks.items()}
        self.batches += 1
        return {name: {rows[position]["row_id"]: reason for position, reason in found.items()}
                for name, found in rejected.items()}

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
    Divergence(ODD, "search", "missing", 5, tuple(sorted({*SEARCH_REFUSES, *INFINITE}))),
    Divergence(ODD, "warehouse", "missing", 2, tuple(sorted(INFINITE))),
}


def test_each_odd_value_is_decoded_to_its_exact_text(captured):
    _, decoded = captured
    assert all(row["error"] is None for row in decoded.values()), [row["error"] for row in decoded.values()]
    unicode = decoded["unicode 😀 ünïcödé 中文 שלום"]["after"]
    assert unicode["note"] == ROWS["unicode 😀 ünïcödé 中文 שלום"]["note"]
    assert json.loads(unicode["doc"]) == ROWS["unicode 😀 ünïcödé 中文 שלום"]["doc"]
    assert json.loads(unicode["tags"]) == ROWS["unicode 😀 ünïcödé 中文 שלום"]["tags"]
    # All 60 digits as text (decimal.handling.mode=string): no float on the way.
    assert Decimal(decoded["numbers-huge"]["after"]["big"]) == ROWS["numbers-huge"]["big"]
    assert decoded["numbers-precise"]["after"]["big"] == str(ROWS["numbers-precise"]["big"])
    assert datetime.fromisoformat(decoded["times-zone"]["after"]["at_tz"]) == ROWS["times-zone"]["at_tz"]
    old, new = decoded["times-old"]["after"], decoded["times-new"]["after"]
    assert {column: old[column] for column in ROWS["times-old"]} == {
        "at_tz": "1969-07-20T20:17:40.123456Z", "at_local": "1900-01-01T00:00:00", "born": "1901-12-13",
        "at_time": "20:17:40.123456",
    }, "times before 1970 as exact ISO text, a zone only where PostgreSQL's type has one"
    assert {column: new[column] for column in ROWS["times-new"]} == {
        "at_local": "2024-02-29T23:59:59.5", "born": "2024-02-29", "at_time": "00:00:00"}
    assert ([{c: decoded[key]["after"][c] for c in values} for key, values in INFINITE.items()]
            == list(INFINITE.values())), "infinite times as PostgreSQL's words"
    assert decoded["enum-later"]["after"]["mood"] == "added-later"
    nulls = decoded["nulls"]["after"]
    assert set(nulls) == set(COLUMNS) and {v for k, v in nulls.items() if k != "id"} == {None}


def test_every_sink_holds_each_odd_value_exactly_or_rejects_it_with_the_reason(captured, sinks):
    _, decoded = captured
    rejected = sinks.write(list(decoded.values()))
    assert rejected["cache"] == {}, "the cache holds every value as its text"
    assert rejected["warehouse"].keys() == INFINITE.keys() and "at_tz" in rejected["warehouse"]["times-infinite"]
    assert rejected["search"].keys() == {*SEARCH_REFUSES, *INFINITE}
    assert all(SEARCH_REFUSES[key] in reason for key, reason in rejected["search"].items() if key in SEARCH_REFUSES)
    # The long key's document has a stable hashed id, and holds the whole key.
    long_id = row_id([LONG_KEY])
    assert long_id == "sha256:" + hashlib.sha256(LONG_KEY.encode()).hexdigest()
    index = sinks.pipeline.tables[ODD].search.index
    found = httpx.get(f"{elasticsearch.url(sinks.stack)}/{index}/_doc/{long_id}").json()
    assert found["found"] and found["_source"]["id"] == LONG_KEY
    # PostgreSQL as the oracle: every value equal in every view, but the rows a sink rejected (each
    # dead-lettered with the reason by the apply jobs).
    assert set(sinks.verify()) == ONLY_THE_REFUSED_ROWS_MISSING


def test_a_row_of_several_mb_reaches_its_topic_whole_and_every_sink(stack, captured, sinks, spark):
    pipeline, _ = captured
    note = "".join(uuid.uuid4().hex for _ in range(BIG_ROW_BYTES // 32))
    with _owner(stack) as conn:
        _insert(conn, "big-row", {"note": note})
    row = _decoded(stack, spark, pipeline, {"big-row"})["big-row"]
    assert row["after"]["note"] == note
    assert sinks.write([row]) == {"search": {}, "cache": {}, "warehouse": {}}
    assert set(sinks.verify()) == ONLY_THE_REFUSED_ROWS_MISSING

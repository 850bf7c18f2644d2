"""The contract every sink keeps (spark_jobs/sinks/base.py), run once against each sink of the registry
that holds the current state of its tables, on its real store, through one small reader per store:
the version guard, replays, deletes and tombstones, unchanged-TOAST fill, truncates, primary-key moves,
composite keys. What one store adds (its mapping, its encoding, its commits) stays in its own file.

`analytics` keeps every version of a row (SCD2 history) rather than the newest, so its rules are the
history's (tests/integration/sink_delta/test_analytics.py), not these."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from elasticsearch import Elasticsearch

from services.settings import StackSettings
from spark_jobs.changes import envelope
from spark_jobs.model import config
from spark_jobs.model.config import PipelineConfig, SearchView
from spark_jobs.model.sink_registry import REGISTRY, SINKS
from spark_jobs.sinks.base import VERSION_MAJOR, VERSION_MINOR, Sink
from spark_jobs.sinks.delta import WarehouseSink
from spark_jobs.sinks.elasticsearch import ElasticsearchSink
from spark_jobs.sinks.elasticsearch._documents import TOMBSTONES, WATERMARKS
from spark_jobs.sinks.redis import RedisSink
from tests import stale_fill
from tests.demo_catalogue import demo_catalogue
from tests.sink_batches import apply
from tests.unit.spark_frames import change

pytestmark = pytest.mark.stack

CURRENT_STATE = [name for name in SINKS if REGISTRY[name].view is not None]
TABLES = ("products", "orders", "order_items")
LONG = "toasted " * 3_000

# A row as a store holds it: its columns as text (None when absent), and its version.
Row = dict[str, Any]


@dataclass
class Store:
    sink: Sink
    read_row: Callable[[str, dict[str, str]], Row | None]  # (table, key columns as text) -> the row or None
    forget: Callable[[], None] = lambda: None  # drop what the reader cached: the store is about to change

    def apply(self, spark: Any, changes: list[dict]) -> dict[int, str]:
        """One micro-batch through the sink, as tests/sink_batches.py runs it: {position: reason} rejected."""
        self.forget()
        return apply(self.sink, spark, changes)

    def row(self, table: str, key: int | dict[str, str]) -> Row | None:
        return self.read_row(table, key if isinstance(key, dict) else {"id": str(key)})

    def value(self, table: str, key: int | dict[str, str], column: str) -> str | None:
        row = self.row(table, key)
        assert row is not None, f"{table} {key} is missing"
        return row.get(column)


def pipeline_for_contract() -> PipelineConfig:
    """The demo's three order tables with every view, search indices renamed per test, no derived views."""
    base, prefix = config.load(), f"c{uuid.uuid4().hex[:10]}"
    tables = {name: table.model_copy(update={"search": table.search and SearchView(
        index=f"{prefix}_{name}", text=table.search.text)}) for name, table in base.tables.items() if name in TABLES}
    return PipelineConfig(source=base.source, tables=tables)


def row_id(key: dict[str, str]) -> str:
    return envelope.row_id([int(v) if v.lstrip("-").isdigit() else v for v in key.values()])


def as_text(columns: dict[str, Any], major: Any, minor: Any) -> Row:
    def text(value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return value.decode() if isinstance(value, bytes) else json.dumps(value) if isinstance(value, (dict, list)) \
            else str(value)

    return {**{name: text(value) for name, value in columns.items()}, "version": (int(major), int(minor))}


@pytest.fixture
def cache(stack: StackSettings, spark) -> Iterator[Store]:
    client, prefix = redis.Redis(host=stack.host, port=stack.redis_port), f"contract-{uuid.uuid4().hex[:12]}:"
    sink = RedisSink(f"redis://{stack.host}:{stack.redis_port}/0", pipeline_for_contract(), key_prefix=prefix)
    sink.setup(spark, demo_catalogue())

    def read(table: str, key: dict[str, str]) -> Row | None:
        found = {k.decode(): v for k, v in client.hgetall(f"{prefix}{table}:{row_id(key)}").items()}
        return as_text(found, found.pop(VERSION_MAJOR), found.pop(VERSION_MINOR)) if found else None

    yield Store(sink, read)
    sink.clear()
    client.close()


@pytest.fixture
def search(stack: StackSettings, spark) -> Iterator[Store]:
    es = Elasticsearch(f"http://{stack.host}:{stack.elasticsearch_port}")
    sink = ElasticsearchSink(f"http://{stack.host}:{stack.elasticsearch_port}", pipeline_for_contract(), bulk_size=50)
    sink.setup(spark, demo_catalogue())

    def read(table: str, key: dict[str, str]) -> Row | None:
        found = es.options(ignore_status=404).get(index=sink.alias(table), id=row_id(key))
        if not found.get("found"):
            return None
        doc = dict(found["_source"])
        return as_text(doc, doc.pop(VERSION_MAJOR), doc.pop(VERSION_MINOR))

    yield Store(sink, read)
    for alias in sink.aliases():
        for index in es.indices.get(index=f"{alias}-v*"):  # deleting by wildcard is refused by default
            es.indices.delete(index=index)
        es.options(ignore_status=404).delete(index=WATERMARKS, id=alias, refresh=True)
    es.indices.refresh(index=TOMBSTONES)
    for hit in es.search(index=TOMBSTONES, query={"terms": {"alias": sink.aliases()}}, size=1000)["hits"]["hits"]:
        es.options(ignore_status=404).delete(index=TOMBSTONES, id=hit["_id"])  # the node has no _delete_by_query
    es.close()


@pytest.fixture
def warehouse(tmp_path, spark) -> Store:
    sink = WarehouseSink(str(tmp_path / "warehouse"), pipeline_for_contract())
    sink.setup(spark, demo_catalogue())

    held: dict[str, list[dict[str, Any]]] = {}  # a table's rows, read once until the next batch

    def read(table: str, key: dict[str, str]) -> Row | None:
        if table not in held:
            held[table] = [row.asDict() for row in spark.read.format("delta").load(sink.path(table)).collect()]
        found = [dict(row) for row in held[table] if all(str(row[c]) == v for c, v in key.items())]
        if not found:
            return None
        (columns,) = found
        return as_text(columns, columns.pop(VERSION_MAJOR), columns.pop(VERSION_MINOR))

    return Store(sink, read, held.clear)


@pytest.fixture(params=CURRENT_STATE)
def store(request) -> Store:
    return request.getfixturevalue(request.param)


def product(version: tuple[int, int], key: int = 1, op: str = "u", **columns: str) -> dict:
    after = None if op == "d" else {"id": str(key), "name": f"v{version}", "description": f"text {version}",
                                     "price": "1.00", **columns}
    return change(version, op, "products", key, after)


def placeholder(version: tuple[int, int], key: int, op: str = "u", **columns: str) -> dict:
    """An update whose TOASTed description did not change: Debezium sends the placeholder."""
    return change(version, op, "products", key, {"id": str(key), "name": f"v{version}", **columns}, ("description",))


def item(version: tuple[int, int], order_id: int, line_no: int, op: str = "u", quantity: str = "1") -> dict:
    key = {"order_id": str(order_id), "line_no": str(line_no)}
    after = {**key, "product_id": "1", "quantity": quantity, "unit_price": "1.00"}
    return change(version, op, "order_items", key, None if op == "d" else after)


def order(version: tuple[int, int], key: int, op: str = "u") -> dict:
    after = {"id": str(key), "customer_id": "1", "status": "pending", "total": "10.00"}
    return change(version, op, "orders", key, None if op == "d" else after)


def truncate(version: tuple[int, int], table: str = "products") -> dict:
    return change(version, "t", table)


def test_an_older_change_after_a_newer_one_is_ignored(store, spark):
    assert store.apply(spark, [product((5, 2))]) == {}
    assert store.apply(spark, [product((5, 1), name="older"), product((4, 9), name="oldest")]) == {}
    row = store.row("products", 1)
    assert row is not None and (row["name"], row["version"]) == ("v(5, 2)", (5, 2))


def test_replaying_an_equal_version_changes_nothing_even_with_other_content(store, spark):
    batch = [product((5, 5), key=1), product((5, 6), key=2), product((6, 0), key=3, op="d")]
    store.apply(spark, batch)
    before = [store.row("products", key) for key in (1, 2, 3)]
    assert store.apply(spark, batch) == {}
    assert store.apply(spark, [product((5, 5), key=1, name="impostor")]) == {}
    assert [store.row("products", key) for key in (1, 2, 3)] == before and before[2] is None


def test_a_deleted_row_is_not_resurrected_by_a_late_older_change_and_a_newer_one_brings_it_back(store, spark):
    store.apply(spark, [product((5, 0), key=3, op="c")])
    assert store.apply(spark, [product((7, 0), key=3, op="d")]) == {}
    assert store.row("products", 3) is None
    assert store.apply(spark, [product((6, 0), key=3, name="late")]) == {}
    assert store.row("products", 3) is None, "the tombstone remembers the delete"
    assert store.apply(spark, [product((6, 9), key=3, op="d"), product((6, 95), key=4, op="d")]) == {}
    assert store.apply(spark, [product((6, 99), key=3, name="later, still older")]) == {}
    assert store.row("products", 3) is None, "an older delete applied later never lowers the tombstone"
    assert store.apply(spark, [product((8, 0), key=3, op="c", name="re-inserted")]) == {}
    assert store.value("products", 3, "name") == "re-inserted"


def test_a_delete_arriving_before_the_insert_it_follows_keeps_the_row_absent(store, spark):
    assert store.apply(spark, [product((9, 0), key=4, op="d")]) == {}
    assert store.apply(spark, [product((3, 0), key=4, op="c")]) == {}
    assert store.row("products", 4) is None


def test_an_unchanged_toast_column_keeps_the_stored_value(store, spark):
    store.apply(spark, [product((5, 0), key=2, description=LONG)])
    assert store.apply(spark, [placeholder((6, 3), 2, price="6.00")]) == {}
    row = store.row("products", 2)
    assert row is not None and (row["description"], row["name"], row["version"]) == (LONG, "v(6, 3)", (6, 3))
    assert row["price"] == "6.00"


def test_a_stale_full_image_in_the_batch_does_not_overwrite_a_newer_stored_toast_value(store, spark):
    assert store.apply(spark, stale_fill.stored_first()) == {}
    assert store.apply(spark, stale_fill.batch()) == {}
    for key, description in stale_fill.EXPECTED.items():
        row = store.row("products", key)
        assert row is not None, key
        assert (row["description"], row["name"], row["version"]) == (
            description, f"v{stale_fill.UPDATE}", stale_fill.UPDATE), key


def test_truncate_removes_rows_below_it_keeps_newer_ones_and_never_goes_back(store, spark):
    store.apply(spark, [order((10, i), i) for i in range(1, 4)])
    store.apply(spark, [order((20, 0), 4, op="d")])  # a tombstone the truncate subsumes
    store.apply(spark, [order((60, 0), 5), item((10, 0), 1, 1)])  # newer; another table named order...
    # In the truncate's own batch: one row older (removed), one newer (kept) than it.
    assert store.apply(spark, [truncate((50, 0), "orders"), order((45, 0), 6), order((70, 0), 7)]) == {}
    assert store.apply(spark, [order((40, 0), 3)]) == {}  # late, older than the truncate
    assert [key for key in range(1, 8) if store.row("orders", key)] == [5, 7]
    assert store.row("order_items", {"order_id": "1", "line_no": "1"}) is not None, "other tables keep their rows"
    assert store.apply(spark, [truncate((30, 0), "orders"), order((35, 0), 8)]) == {}
    assert store.row("orders", 8) is None, "an older truncate (replayed or late) never lowers the watermark"
    assert store.row("orders", 5) is not None


@pytest.mark.parametrize("arrival", ["one batch", "delete first", "create first"])
def test_a_primary_key_move_keeps_the_unchanged_toast_column_whatever_the_arrival(store, spark, arrival):
    """`UPDATE products SET id = 101 WHERE id = 1`, description TOASTed: Debezium sends a delete of the
    old key (moved) and a create of the new one with the placeholder (old_row_id)."""
    store.apply(spark, [product((5, 0), key=1, description=LONG)])
    delete = {**change((6, 1), "d", "products", 1), "moved": True}
    create = {**placeholder((6, 1), 101, op="c"), "old_row_id": "1"}
    batches = {"one batch": [[create, delete]], "delete first": [[delete], [create]],
               "create first": [[create], [delete]]}[arrival]
    for batch in batches:
        assert store.apply(spark, batch) == {}
    assert store.value("products", 101, "description") == LONG
    assert store.row("products", 1) is None


def test_a_primary_key_move_of_a_row_changed_in_the_same_batch_takes_that_change(store, spark):
    store.apply(spark, [product((1, 1), key=1, description="old text")])
    delete = {**change((2, 1), "d", "products", 1), "moved": True}
    create = {**placeholder((2, 1), 100, op="c"), "old_row_id": "1"}
    assert store.apply(spark, [product((2, 0), key=1, description=LONG), delete, create]) == {}
    assert store.value("products", 100, "description") == LONG


def test_a_primary_key_move_then_an_update_of_the_new_key_in_the_same_batch_keeps_the_toast_column(store, spark):
    store.apply(spark, [product((1, 1), key=1, description=LONG)])
    delete = {**change((2, 1), "d", "products", 1), "moved": True}
    create = {**placeholder((2, 1), 100, op="c"), "old_row_id": "1"}
    assert store.apply(spark, [delete, create, placeholder((3, 0), 100, price="7.00")]) == {}
    row = store.row("products", 100)
    assert row is not None and (row["description"], row["price"], row["version"]) == (LONG, "7.00", (3, 0))


def test_rows_of_a_composite_key_are_kept_per_key(store, spark):
    store.apply(spark, [item((1, 1), 1, 1), item((1, 2), 1, 2), item((1, 3), 2, 1)])
    assert store.apply(spark, [item((2, 1), 1, 2, quantity="7"), item((2, 2), 1, 1, op="d")]) == {}
    held = {key: store.row("order_items", {"order_id": str(key[0]), "line_no": str(key[1])})
            for key in ((1, 1), (1, 2), (2, 1))}
    assert held[(1, 1)] is None
    assert (held[(1, 2)] or {}).get("quantity") == "7" and (held[(2, 1)] or {}).get("quantity") == "1"

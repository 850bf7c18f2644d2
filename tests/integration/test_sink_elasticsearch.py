"""The search sink against a real Elasticsearch node: guard, deletes, TOAST, truncate, mappings, aliases."""

from __future__ import annotations

import json
import random
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest
from elasticsearch import Elasticsearch

from services.settings import StackSettings
from spark_jobs import config
from spark_jobs.changes import Change, ColumnType, decode
from spark_jobs.config import PipelineConfig, SearchView
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.elasticsearch import TOMBSTONES, WATERMARKS, ElasticsearchSink, below
from tests import stale_fill

pytestmark = pytest.mark.stack

RECORDS = {
    r["name"]: r
    for r in json.loads((Path(__file__).parent.parent / "unit" / "fixtures" / "debezium_records.json").read_text())
}


def fixture(name: str) -> Change:
    record = RECORDS[name]
    return decode(record["topic"], record["key"].encode(), record["value"].encode())


PRODUCT = fixture("products_insert")  # real column types: INT8, TEXT, NUMERIC(12,2), _TEXT, JSONB, TIMESTAMPTZ


def product(seq: tuple[int, int], key: int = 1, op: str = "u", **columns) -> Change:
    after = None if op == "d" else {**PRODUCT.after, "id": key, "sku": f"SKU-{key}", **columns}
    return replace(PRODUCT, op=op, key={"id": key}, after=after, sequence=seq, unavailable=frozenset())


def unique_pipeline() -> PipelineConfig:
    """The project's pipeline with its search indices renamed, so tests never share documents.
    Only the two tables these tests write keep a search view (fewer indices to create per test)."""
    base, prefix = config.load(), f"t{uuid.uuid4().hex[:10]}"
    tables = {
        name: table.model_copy(update={
            "search": SearchView(index=f"{prefix}_{name}", text=table.search.text)
            if table.search and name in ("products", "order_items") else None
        })
        for name, table in base.tables.items()
    }
    return base.model_copy(update={"tables": tables, "nested": {}})  # nested views: test_nested_views.py


@pytest.fixture
def es(stack: StackSettings):
    client = Elasticsearch(f"http://{stack.host}:{stack.elasticsearch_port}")
    yield client
    client.close()


@pytest.fixture
def sink(stack: StackSettings, es: Elasticsearch):
    pipeline = unique_pipeline()
    sink = ElasticsearchSink(f"http://{stack.host}:{stack.elasticsearch_port}", pipeline, bulk_size=50)
    sink.setup(pipeline)
    yield sink
    for alias in sink.aliases():
        for index in es.indices.get(index=f"{alias}-v*"):  # deleting by wildcard is refused by default
            es.indices.delete(index=index)
        es.options(ignore_status=404).delete(index=WATERMARKS, id=alias, refresh=True)
    es.indices.refresh(index=TOMBSTONES)
    hits = es.search(index=TOMBSTONES, query={"terms": {"alias": sink.aliases()}}, size=1000)["hits"]["hits"]
    for hit in hits:
        es.options(ignore_status=404).delete(index=TOMBSTONES, id=hit["_id"])


def source(es: Elasticsearch, index: str, doc_id: str) -> dict | None:
    found = es.options(ignore_status=404).get(index=index, id=doc_id)
    return found["_source"] if found.get("found") else None


def test_upsert_is_stored_exactly_with_a_typed_mapping_and_is_searchable(sink, es):
    alias = sink.alias("products")
    assert sink.write([PRODUCT]) == []

    doc = source(es, alias, "1")
    assert doc["price"] == "12.50", "NUMERIC stays an exact string in _source"
    assert doc["tags"] == ["kitchen", "blue"] and doc["attributes"] == {"color": "blue", "dims": {"h": 10}}
    assert doc["updated_at"] == PRODUCT.after["updated_at"].isoformat() and doc["updated_at"].endswith("+00:00")
    assert (doc[VERSION_MAJOR], doc[VERSION_MINOR]) == PRODUCT.sequence
    assert doc[COMMIT_TS].startswith("2026-11-22T")

    (mapping,) = es.indices.get_mapping(index=alias).values()
    props = mapping["mappings"]["properties"]
    assert props["sku"]["type"] == "keyword" and props["tags"]["type"] == "keyword"
    assert props["name"]["type"] == "text" and props["name"]["fields"]["keyword"]["type"] == "keyword"
    assert props["description"]["type"] == "text"
    assert props["price"]["type"] == "double" and props["id"]["type"] == "long"
    assert props["updated_at"]["type"] == "date" and props[COMMIT_TS]["type"] == "date"
    assert props["attributes"]["properties"]["dims"]["properties"]["h"]["type"] == "long"

    es.indices.refresh(index=alias)
    assert es.count(index=alias, query={"match": {"name": "MUG"}})["count"] == 1, "full text, analysed"
    assert es.count(index=alias, query={"term": {"sku": "FX-1"}})["count"] == 1
    assert es.count(index=alias, query={"range": {"price": {"gte": 12.5, "lte": 12.5}}})["count"] == 1


def test_an_older_change_after_a_newer_one_is_ignored(sink, es):
    assert sink.write([product((100, 5), name="new")]) == []
    assert sink.write([product((100, 4), name="old"), product((99, 9), name="older")]) == []
    doc = source(es, sink.alias("products"), "1")
    assert doc["name"] == "new" and (doc[VERSION_MAJOR], doc[VERSION_MINOR]) == (100, 5)


def test_replaying_an_equal_version_changes_nothing(sink, es):
    alias, change = sink.alias("products"), product((50, 1), name="once")
    sink.write([change])
    before = es.get(index=alias, id="1")
    assert sink.write([change]) == []
    assert sink.write([replace(change, after={**change.after, "name": "same version, other value"})]) == []
    after = es.get(index=alias, id="1")
    assert after["_seq_no"] == before["_seq_no"] and after["_version"] == before["_version"]
    assert after["_source"] == before["_source"]


def test_a_deleted_row_is_not_resurrected_by_a_late_older_change(sink, es):
    alias = sink.alias("products")
    sink.write([product((10, 1), key=3)])
    assert sink.write([product((20, 1), key=3, op="d")]) == []
    assert source(es, alias, "3") is None
    tombstone = source(es, TOMBSTONES, f"{alias}/3")
    assert (tombstone[VERSION_MAJOR], tombstone[VERSION_MINOR]) == (20, 1)

    assert sink.write([product((15, 1), key=3, name="late")]) == []
    assert source(es, alias, "3") is None, "the tombstone remembers the delete"
    assert sink.write([product((20, 1), key=3, op="d")]) == [], "a replayed delete is a no-op"

    sink.write([product((30, 1), key=3, name="re-inserted")])
    assert source(es, alias, "3")["name"] == "re-inserted", "a newer insert after the delete is applied"


def test_an_unchanged_toast_column_keeps_the_stored_value(sink, es):
    update = fixture("products_update_unchanged_toast")  # id 2, description unavailable
    assert "description" in update.unavailable and "description" not in update.after
    long_text = "kept " * 5000
    sink.write([product((1, 1), key=2, description=long_text, name="before")])
    assert sink.write([update]) == []
    doc = source(es, sink.alias("products"), "2")
    assert doc["description"] == long_text and doc["name"] == "Toast mug" and doc["price"] == "6.00"
    assert "__debezium_unavailable_value" not in json.dumps(doc)


def toast_product(seq, key, description):
    """An upsert for tests/stale_fill.py: no description means Debezium's placeholder."""
    change = product(seq, key=key, name=f"v{seq}", description=description)
    if description is not None:
        return change
    after = {column: value for column, value in change.after.items() if column != "description"}
    return replace(change, after=after, unavailable=frozenset({"description"}))


def test_a_stale_full_image_in_the_batch_does_not_overwrite_a_newer_stored_toast_value(sink, es):
    assert sink.write(stale_fill.stored_first(toast_product)) == []
    assert sink.write(stale_fill.batch(toast_product)) == []
    for key, description in stale_fill.EXPECTED.items():
        doc = source(es, sink.alias("products"), str(key))
        assert (doc["description"], doc["name"]) == (description, f"v{stale_fill.UPDATE}"), key
        assert (doc[VERSION_MAJOR], doc[VERSION_MINOR]) == stale_fill.UPDATE


def test_truncate_removes_rows_below_the_watermark_and_keeps_newer_ones(sink, es):
    alias = sink.alias("products")
    sink.write([product((10, 1), key=1), product((30, 0), key=2), product((20, 0), key=3)])
    truncate = replace(PRODUCT, op="t", key={}, after=None, sequence=(20, 0))
    assert sink.write([truncate]) == []

    assert source(es, alias, "1") is None
    assert source(es, alias, "2") is not None, "written after the truncate"
    assert source(es, alias, "3") is not None, "(20, 0) is the truncate's own position, not below it"
    mark = source(es, WATERMARKS, alias)
    assert (mark[VERSION_MAJOR], mark[VERSION_MINOR]) == (20, 0)

    assert sink.write([product((15, 0), key=1, name="late")]) == []
    assert source(es, alias, "1") is None, "a late older change cannot resurrect a truncated row"
    assert sink.write([replace(truncate, sequence=(12, 0))]) == []
    assert source(es, WATERMARKS, alias)[VERSION_MAJOR] == 20, "the watermark never goes back"
    assert source(es, alias, "2") is not None


def test_a_new_column_gets_its_mapping_on_first_sight(sink, es):
    alias = sink.alias("products")
    sink.write([PRODUCT])
    (before,) = es.indices.get_mapping(index=alias).values()
    assert "weight" not in before["mappings"]["properties"]

    altered = replace(
        product((200, 1), key=8, weight=Decimal("1.250"), launched=True),
        columns={**PRODUCT.columns, "weight": ColumnType("NUMERIC", 8, 3), "launched": ColumnType("BOOL")},
    )
    assert sink.write([altered]) == []
    (after,) = es.indices.get_mapping(index=alias).values()
    assert after["mappings"]["properties"]["weight"] == {"type": "double"}
    assert after["mappings"]["properties"]["launched"] == {"type": "boolean"}
    assert source(es, alias, "8")["weight"] == "1.250"


def test_incompatible_changes_are_rejected_and_the_rest_of_the_chunk_is_applied(sink, es):
    alias = sink.alias("products")
    sink.write([product((1, 1), key=1)])  # attributes.dims.h is now mapped as long
    bad_value = product((2, 1), key=2, attributes={"dims": {"h": "tall"}})
    bad_column = replace(  # a quoted column name with a dot collides with the keyword field sku
        product((2, 2), key=3, **{"sku.code": "x"}), columns={**PRODUCT.columns, "sku.code": ColumnType("TEXT")}
    )
    good = product((2, 3), key=4, name="fine")

    rejected = sink.write([bad_value, bad_column, good, product((2, 4), key=1, op="d")])

    assert {r.change.key["id"] for r in rejected} == {2, 3}
    reasons = {r.change.key["id"]: r.reason for r in rejected}
    assert "document_parsing_exception" in reasons[2]
    assert "mapping conflict on sku.code" in reasons[3]
    assert source(es, alias, "4")["name"] == "fine"
    assert source(es, alias, "1") is None and source(es, alias, "2") is None


def test_a_composite_key_is_a_json_list_id(sink, es):
    alias = sink.alias("order_items")
    delete = fixture("order_items_delete")
    row = {"order_id": 7, "line_no": 2, "product_id": 1, "quantity": 3, "unit_price": Decimal("4.10")}
    insert = replace(delete, op="c", key={"order_id": 7, "line_no": 2}, after=row, sequence=(5, 5))
    assert sink.write([insert]) == []
    assert source(es, alias, "[7,2]")["unit_price"] == "4.10"

    assert sink.write([replace(delete, key={"order_id": 7, "line_no": 2}, sequence=(6, 6))]) == []
    assert source(es, alias, "[7,2]") is None
    assert source(es, TOMBSTONES, f"{alias}/[7,2]")[VERSION_MAJOR] == 6


def test_a_rebuild_fills_a_new_version_and_the_alias_swaps_atomically(sink, es):
    alias = sink.alias("products")
    sink.write([product((1, 1), key=1), product((1, 2), key=2)])

    index = sink.create_version(alias)
    assert index == f"{alias}-v2"
    (old_mapping,) = es.indices.get_mapping(index=f"{alias}-v1").values()
    assert es.indices.get_mapping(index=index)[index] == old_mapping

    rebuild = ElasticsearchSink(sink.url, sink.pipeline, targets={"products": index})
    assert rebuild.write([product((1, 1), key=1), product((1, 2), key=2)]) == []
    sink.write([product((3, 0), key=2, op="d")])  # the live index deletes a row the rebuild already copied
    assert rebuild.write([product((3, 0), key=2, op="d")]) == []
    assert source(es, index, "2") is None, "the replayed delete removes the copy (its tombstone is shared)"

    sink.swap_alias(alias, index)
    assert set(es.indices.get_alias(name=alias)) == {index}
    assert source(es, alias, "1") is not None
    sink.setup()
    assert set(es.indices.get_alias(name=alias)) == {index}, "setup keeps an existing alias's target"
    assert sink.create_version(alias) == f"{alias}-v3"


def test_concurrent_writers_of_the_same_rows_converge_on_the_newest_version(sink, es):
    """Executors racing on one row (a rebuild beside the live query, a retried task) meet 409s and re-read."""
    alias, rnd = sink.alias("products"), random.Random(7)
    history = {key: [product((v, key), key=key, op="d" if v % 4 == 0 else "u", name=f"v{v}") for v in range(1, 9)]
               for key in range(1, 6)}
    deliveries = []
    for _ in range(4):
        events = [event for events in history.values() for event in events]
        rnd.shuffle(events)
        deliveries.append(events)

    def deliver(events: list[Change]) -> list:
        return [r for i in range(0, len(events), 5) for r in sink.write(events[i:i + 5])]

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(rejected == [] for rejected in pool.map(deliver, deliveries))

    for key, events in history.items():
        newest = events[-1]
        doc = source(es, alias, str(key))
        if newest.is_delete:
            assert doc is None
        else:
            assert doc is not None and (doc[VERSION_MAJOR], doc["name"]) == (newest.sequence[0], newest.after["name"])


def test_a_truncate_racing_with_writers_on_other_executors_leaves_nothing_below_it(sink, es):
    """Spark may apply a table's truncate and its rows in different partitions at the same time."""
    alias, watermark = sink.alias("products"), (1000, 0)
    started = threading.Event()

    def writer(seed: int) -> None:
        rnd = random.Random(seed)
        for batch in range(20):
            if batch == 5:
                started.set()  # the truncate lands while rows are still being written
            sink.write([product((rnd.randint(1, 999), 0), key=seed * 10_000 + batch * 10 + i) for i in range(10)])

    with ThreadPoolExecutor(max_workers=3) as pool:
        writers = [pool.submit(writer, seed) for seed in (1, 2, 3)]
        assert started.wait(timeout=60)
        assert sink.write([replace(PRODUCT, op="t", key={}, after=None, sequence=watermark)]) == []
        for done in writers:
            done.result()  # re-raises a writer's failure

    es.indices.refresh(index=alias)
    assert es.count(index=alias, query=below(watermark))["count"] == 0

"""The search sink against a real Elasticsearch node, through Spark: what Elasticsearch adds to the
contract every sink keeps (tests/integration/test_sink_contract.py): mappings from the catalogue,
documents, replays that write nothing, aliases and rebuilds, concurrent writers."""

from __future__ import annotations

import random
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from elasticsearch import Elasticsearch

from services.settings import StackSettings
from spark_jobs.model import config
from spark_jobs.model.catalogue import Column
from spark_jobs.model.config import PipelineConfig, SearchView
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.elasticsearch import ElasticsearchSink
from spark_jobs.sinks.elasticsearch._documents import TOMBSTONES, WATERMARKS
from spark_jobs.sinks.elasticsearch._store import below
from tests.demo_catalogue import demo_catalogue
from tests.sink_batches import apply
from tests.unit.spark_frames import change

pytestmark = pytest.mark.stack

# A product as Debezium's schemaless record carries it (real column types: INT8, TEXT, NUMERIC(12,2),
# _TEXT, JSONB, TIMESTAMPTZ in the catalogue).
PRODUCT = {"sku": "FX-1", "name": "Kitchen mug", "description": "a mug", "price": "12.50", "tags": '["kitchen","blue"]',
           "attributes": '{"color": "blue", "dims": {"h": 10}}', "updated_at": "2026-11-22T10:00:00.123456Z"}


def product(version: tuple[int, int], key: int = 1, op: str = "u", **columns) -> dict:
    after = None if op == "d" else {**PRODUCT, "id": str(key), "sku": f"SKU-{key}", **columns}
    return change(version, op=op, key=key, after=after)


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
def sink(stack: StackSettings, es: Elasticsearch, spark):
    pipeline = unique_pipeline()
    sink = ElasticsearchSink(f"http://{stack.host}:{stack.elasticsearch_port}", pipeline, bulk_size=50)
    sink.setup(spark, demo_catalogue())
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


def test_upsert_is_stored_exactly_with_a_typed_mapping_and_is_searchable(sink, es, spark):
    alias = sink.alias("products")
    assert apply(sink, spark, [product((5, 7))]) == {}
    doc = source(es, alias, "1")
    assert doc["price"] == "12.50", "NUMERIC stays an exact string in _source"
    assert doc["tags"] == ["kitchen", "blue"] and doc["attributes"] == {"color": "blue", "dims": {"h": 10}}
    assert doc["id"] == 1 and doc["updated_at"] == PRODUCT["updated_at"]
    assert (doc[VERSION_MAJOR], doc[VERSION_MINOR]) == (5, 7) and doc[COMMIT_TS] == "2024-01-01T00:00:00.000Z"

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
    assert es.count(index=alias, query={"term": {"sku": "SKU-1"}})["count"] == 1
    assert es.count(index=alias, query={"range": {"price": {"gte": 12.5, "lte": 12.5}}})["count"] == 1


def test_a_replay_is_not_even_written(sink, es, spark):
    """Beyond the contract's unchanged content: Elasticsearch takes no write at all (same `_seq_no`)."""
    alias, once = sink.alias("products"), product((50, 1), name="once")
    apply(sink, spark, [once])
    before = es.get(index=alias, id="1")
    assert apply(sink, spark, [once]) == {}
    assert apply(sink, spark, [product((50, 1), name="same version, other value")]) == {}
    after = es.get(index=alias, id="1")
    assert after["_seq_no"] == before["_seq_no"] and after["_source"] == before["_source"]


def test_a_json_column_is_replaced_whole_beside_an_unchanged_toast_column(sink, es, spark):
    long_text = "kept " * 5000
    apply(sink, spark, [product((1, 1), key=2, description=long_text, attributes='{"color": "red", "size": "M"}')])
    objects = change((3, 0), key=2, after={"id": "2", "attributes": '{"size": "L"}'}, unavailable=("description",))
    assert apply(sink, spark, [objects]) == {}
    doc = source(es, sink.alias("products"), "2")
    assert doc["attributes"] == {"size": "L"}, "a json column is replaced, not merged field by field"
    assert doc["description"] == long_text


def with_columns(**columns: Column) -> dict:
    catalogue = demo_catalogue()
    products = catalogue["products"]
    return {**catalogue, "products": replace(products, columns={**products.columns, **columns})}


def test_a_column_added_at_the_source_is_mapped_from_the_catalogue(sink, es, spark):
    alias = sink.alias("products")
    apply(sink, spark, [product((1, 0))])
    assert "weight" not in next(iter(es.indices.get_mapping(index=alias).values()))["mappings"]["properties"]
    grown = with_columns(weight=Column("weight", "NUMERIC", 8, 3), launched=Column("launched", "BOOL"))
    assert apply(sink, spark, [product((200, 1), key=8, weight="1.250", launched="true")], grown) == {}
    props = next(iter(es.indices.get_mapping(index=alias).values()))["mappings"]["properties"]
    assert props["weight"] == {"type": "double"} and props["launched"] == {"type": "boolean"}
    assert source(es, alias, "8")["weight"] == "1.250" and source(es, alias, "8")["launched"] is True


def test_incompatible_changes_are_rejected_and_the_rest_is_applied(sink, es, spark):
    alias = sink.alias("products")
    apply(sink, spark, [product((1, 1), key=1)])  # attributes.dims.h is now mapped as long
    bad_value = product((2, 1), key=2, attributes='{"dims": {"h": "tall"}}')
    # A quoted column name with a dot collides with the keyword field sku: it cannot be mapped.
    bad_column = product((2, 2), key=3, **{"sku.code": "x"})
    rejected = apply(sink, spark, [bad_value, bad_column, product((2, 3), key=4, name="fine"),
                                   product((2, 4), key=1, op="d")],
                     with_columns(**{"sku.code": Column("sku.code", "TEXT")}))
    assert set(rejected) == {0, 1}
    assert "document_parsing_exception" in rejected[0] and "mapping conflict on sku.code" in rejected[1]
    assert source(es, alias, "4")["name"] == "fine"
    assert source(es, alias, "1") is None and source(es, alias, "2") is None


def test_a_rebuild_fills_a_new_version_and_the_alias_swaps_atomically(sink, es, spark):
    alias = sink.alias("products")
    apply(sink, spark, [product((1, 1), key=1), product((1, 2), key=2)])
    index = sink.create_version(alias)
    assert index == f"{alias}-v2"
    (old_mapping,) = es.indices.get_mapping(index=f"{alias}-v1").values()
    assert es.indices.get_mapping(index=index)[index] == old_mapping

    rebuild = ElasticsearchSink(sink.url, sink.pipeline, targets={"products": index})
    rebuild.setup(spark, demo_catalogue())
    assert apply(rebuild, spark, [product((1, 1), key=1), product((1, 2), key=2)]) == {}
    apply(sink, spark, [product((3, 0), key=2, op="d")])  # the live index deletes a row the rebuild copied
    assert apply(rebuild, spark, [product((3, 0), key=2, op="d")]) == {}
    assert source(es, index, "2") is None, "the replayed delete removes the copy (its tombstone is shared)"

    sink.swap_alias(alias, index)
    assert set(es.indices.get_alias(name=alias)) == {index}
    assert source(es, alias, "1") is not None
    sink.setup(spark, demo_catalogue())
    assert set(es.indices.get_alias(name=alias)) == {index}, "setup keeps an existing alias's target"
    assert sink.create_version(alias) == f"{alias}-v3"


def test_concurrent_writers_of_the_same_rows_converge_on_the_newest_version(sink, es, spark):
    """Jobs racing on one row (a rebuild beside the live query, a retried task) meet 409s and re-read."""
    alias, rnd = sink.alias("products"), random.Random(7)
    history = {key: [product((v, key), key=key, op="d" if v % 4 == 0 else "u", name=f"v{v}") for v in range(1, 9)]
               for key in range(1, 6)}
    deliveries = []
    for _ in range(3):
        events = [event for events in history.values() for event in events]
        rnd.shuffle(events)
        deliveries.append(events)

    def deliver(events: list[dict]) -> list:
        return [r for i in range(0, len(events), 10) for r in apply(sink, spark, events[i:i + 10])]

    with ThreadPoolExecutor(max_workers=3) as pool:
        assert all(rejected == [] for rejected in pool.map(deliver, deliveries))
    for key, events in history.items():
        newest, doc = events[-1], source(es, alias, str(key))
        if newest["op"] == "d":
            assert doc is None
        else:
            assert doc is not None
            assert (doc[VERSION_MAJOR], doc["name"]) == (newest["version"]["major"], newest["after"]["name"])


def test_a_truncate_racing_with_writers_leaves_nothing_below_it(sink, es, spark):
    """Spark may apply a table's truncate and its rows in different tasks at the same time."""
    alias, watermark = sink.alias("products"), (1000, 0)
    started = threading.Event()

    def writer(seed: int) -> None:
        rnd = random.Random(seed)
        for batch in range(6):
            if batch == 2:
                started.set()  # the truncate lands while rows are still being written
            apply(sink, spark,
                  [product((rnd.randint(1, 999), 0), key=seed * 10_000 + batch * 10 + i) for i in range(10)])

    with ThreadPoolExecutor(max_workers=2) as pool:
        writers = [pool.submit(writer, seed) for seed in (1, 2)]
        assert started.wait(timeout=300)
        assert apply(sink, spark, [change(watermark, op="t")]) == {}
        for done in writers:
            done.result()  # re-raises a writer's failure
    es.indices.refresh(index=alias)
    assert es.count(index=alias, query=below(watermark))["count"] == 0

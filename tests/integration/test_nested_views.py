"""Nested views against a real Elasticsearch node, through Spark: out-of-order arrival, replays, exactly
the affected documents rewritten, deletes. Each batch is one micro-batch of the search sink: the flat
writes, then (a later stage of the same job) the join documents it touched."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from elasticsearch import Elasticsearch

from services.settings import StackSettings
from spark_jobs.model import config
from spark_jobs.model.config import PipelineConfig
from spark_jobs.sinks.elasticsearch import ElasticsearchSink
from spark_jobs.sinks.elasticsearch._documents import TOMBSTONES
from spark_jobs.sinks.elasticsearch._nested import REFS
from spark_jobs.sinks.elasticsearch._nested_index import ONE_SEARCH_HITS, ONE_SEARCH_VALUES, every_hit
from tests.demo_catalogue import demo_catalogue
from tests.sink_batches import apply
from tests.unit.spark_frames import change

pytestmark = pytest.mark.stack


def unique_pipeline() -> tuple[PipelineConfig, str]:
    """The project's tables and nested `orders` view under index names of this test's own."""
    base, prefix = config.load(), f"n{uuid.uuid4().hex[:10]}"
    tables = {name: table.model_copy(update={"search": table.search.model_copy(
                  update={"index": f"{prefix}_{table.search.index or name}"})})
              for name, table in base.tables.items()}
    view = f"{prefix}_orders"
    pipeline = base.model_copy(update={"tables": tables, "nested": {view: base.nested["orders"]}})
    return PipelineConfig.model_validate(pipeline.model_dump(by_alias=True)), view  # validated: no name clash


@pytest.fixture
def world(stack: StackSettings, spark) -> Iterator[tuple[ElasticsearchSink, Elasticsearch, str, object]]:
    pipeline, view = unique_pipeline()
    url = f"http://{stack.host}:{stack.elasticsearch_port}"
    sink = ElasticsearchSink(url, pipeline, bulk_size=200)
    sink.setup(spark, demo_catalogue())
    es = Elasticsearch(url)
    yield sink, es, view, spark
    for alias in sink.aliases():
        for index in es.indices.get(index=f"{alias}-v*"):
            es.indices.delete(index=index)
    es.indices.refresh(index=TOMBSTONES)
    hits = es.search(index=TOMBSTONES, query={"terms": {"alias": sink.aliases()}}, size=10_000)["hits"]["hits"]
    for hit in hits:
        es.options(ignore_status=404).delete(index=TOMBSTONES, id=hit["_id"])
    es.close()


class Clock:
    """Commit versions that grow, as Debezium's source.sequence does."""

    def __init__(self) -> None:
        self.lsn = 100

    def change(self, table: str, key: dict, after: dict | None = None, op: str = "u") -> dict:
        self.lsn += 1
        text = {name: None if value is None else str(value) for name, value in key.items()}
        row = None if op in ("d", "t") else {
            **text, **{k: None if v is None else str(v) for k, v in (after or {}).items()}}
        return change((self.lsn, self.lsn), op=op, table=table, key=text or 1, after=row)


def writes(es: Elasticsearch, view: str) -> int:
    """Documents written into or deleted from the view's index so far (Elasticsearch's own counts)."""
    stats = es.indices.stats(index=view, metric="indexing")["indices"]
    return sum(i["primaries"]["indexing"]["index_total"] + i["primaries"]["indexing"]["delete_total"]
               for i in stats.values())


def batch(world, changes: list[dict]) -> int:
    """One micro-batch of the search sink; how many join documents it wrote or deleted."""
    sink, es, view, spark = world
    before = writes(es, view)
    assert apply(sink, spark, changes) == {}
    return writes(es, view) - before


def order(clock: Clock, order_id: int, customer: int | None, status: str = "paid") -> dict:
    return clock.change("orders", {"id": order_id}, {"customer_id": customer, "status": status, "total": "9.50",
                                                     "created_at": None, "updated_at": None})


def customer(clock: Clock, customer_id: int, name: str, op: str = "u") -> dict:
    return clock.change("customers", {"id": customer_id}, {"name": name, "email": f"{name}@x", "country": "NL"}, op)


def product(clock: Clock, product_id: int, name: str) -> dict:
    return clock.change("products", {"id": product_id}, {"name": name, "sku": f"S{product_id}", "price": "1.00"})


def item(clock: Clock, order_id: int, line: int, product_id: int, op: str = "u", quantity: int = 1) -> dict:
    return clock.change("order_items", {"order_id": order_id, "line_no": line},
                        {"product_id": product_id, "quantity": quantity, "unit_price": "1.00"}, op)


def doc(es: Elasticsearch, view: str, order_id: int) -> dict | None:
    found = es.options(ignore_status=404).get(index=view, id=str(order_id))
    return found["_source"] if found.get("found") else None


def test_rows_arriving_in_any_order_end_in_the_joined_document_and_a_replay_writes_nothing(world):
    _, es, view, _ = world
    clock = Clock()
    first_item = item(clock, 7, 1, product_id=5)  # before its order and its product
    assert batch(world, [first_item]) == 0 and doc(es, view, 7) is None
    the_order = order(clock, 7, customer=3)  # before its customer
    assert batch(world, [the_order]) == 1
    stored = doc(es, view, 7)
    assert stored["customer"] is None and stored["items"][0]["product"] is None
    assert stored[REFS] == ["customers:3", "order_items:[7,1]", "orders:7", "products:5"]
    late = [customer(clock, 3, "ann"), product(clock, 5, "mug")]
    assert batch(world, late) == 1
    assert doc(es, view, 7) == {
        "id": 7, "status": "paid", "total": "9.50", "created_at": None, "updated_at": None,
        "customer": {"id": 3, "name": "ann", "email": "ann@x", "country": "NL"},
        "items": [{"line_no": 1, "quantity": 1, "unit_price": "1.00",
                   "product": {"id": 5, "name": "mug", "sku": "S5"}}],
        REFS: ["customers:3", "order_items:[7,1]", "orders:7", "products:5"],
    }
    for replayed in ([first_item], [the_order], late):
        assert batch(world, replayed) == 0


def test_a_rename_rewrites_exactly_the_documents_that_hold_the_row(world):
    _, es, view, _ = world
    clock = Clock()
    setup = [customer(clock, 1, "a"), customer(clock, 2, "b"), product(clock, 5, "mug"), product(clock, 6, "cup")]
    setup += [order(clock, n, customer=1 if n <= 3 else 2) for n in range(1, 6)]
    setup += [item(clock, n, 1, product_id=5 if n in (2, 4) else 6) for n in range(1, 6)]
    assert batch(world, setup) == 5
    assert batch(world, [customer(clock, 1, "a2")]) == 3
    assert batch(world, [product(clock, 5, "mug2")]) == 2
    assert [doc(es, view, n)["customer"]["name"] for n in range(1, 6)] == ["a2", "a2", "a2", "b", "b"]
    assert ([doc(es, view, n)["items"][0]["product"]["name"] for n in range(1, 6)]
            == ["cup", "mug2", "cup", "mug2", "cup"])
    # A change that does not show in the view (price is not a field) rewrites nothing.
    assert batch(world, [clock.change("products", {"id": 6}, {"name": "cup", "sku": "S6", "price": "2.00"})]) == 0


def test_deleting_a_child_removes_it_moving_it_changes_both_and_deleting_the_root_deletes_the_document(world):
    _, es, view, _ = world
    clock = Clock()
    assert batch(world, [order(clock, 1, 9), order(clock, 2, 9), item(clock, 1, 1, 5), item(clock, 1, 2, 5)]) == 2
    assert [i["line_no"] for i in doc(es, view, 1)["items"]] == [1, 2]
    assert batch(world, [item(clock, 1, 2, 5, op="d")]) == 1
    assert [i["line_no"] for i in doc(es, view, 1)["items"]] == [1]
    # A child whose join column changes (not possible for order_items' key column in the demo, but
    # for any child table in general) leaves one document and joins another: both are rewritten.
    moved = clock.change("order_items", {"order_id": 1, "line_no": 1},
                         {"order_id": 2, "line_no": 1, "product_id": 5, "quantity": 1, "unit_price": "1.00"})
    assert batch(world, [moved]) == 2
    assert doc(es, view, 1)["items"] == [] and len(doc(es, view, 2)["items"]) == 1
    assert batch(world, [clock.change("orders", {"id": 2}, op="d")]) == 1
    assert doc(es, view, 2) is None


def test_a_truncate_of_a_parent_table_rebuilds_every_document_that_held_one_of_its_rows(world):
    _, es, view, _ = world
    clock = Clock()
    assert batch(world, [customer(clock, 1, "a"), order(clock, 1, 1), order(clock, 2, 1), order(clock, 3, None)]) == 3
    assert batch(world, [clock.change("customers", {}, op="t")]) == 2
    assert [doc(es, view, n)["customer"] for n in (1, 2, 3)] == [None, None, None]


def test_a_lookup_reads_every_hit_with_the_columns_asked_for_in_one_search_or_a_scroll(stack: StackSettings):
    es = Elasticsearch(f"http://{stack.host}:{stack.elasticsearch_port}")
    index = f"n{uuid.uuid4().hex[:10]}_lookup"
    many = ONE_SEARCH_HITS + 1  # more than one search holds
    try:
        rows = [{"owner": "big" if n < many else "small", "n": n, "other": "x"} for n in range(many + 3)]
        body = [part for n, row in enumerate(rows) for part in ({"index": {"_index": index, "_id": str(n)}}, row)]
        assert not es.bulk(operations=body, refresh=True)["errors"]
        # One search tried, then a scroll; a scroll straight away (a lookup of many values).
        for values in (1, ONE_SEARCH_VALUES + 1):
            hits = every_hit(es, index, {"term": {"owner": "big"}}, ["n"], values)
            assert sorted(hit["_source"]["n"] for hit in hits) == list(range(many))
            assert all(set(hit["_source"]) == {"n"} for hit in hits)
        one_search = every_hit(es, index, {"term": {"owner": "small"}}, None, 1)
        assert sorted(hit["_id"] for hit in one_search) == [str(n) for n in range(many, many + 3)]
        assert all("_source" not in hit for hit in one_search)
    finally:
        es.options(ignore_status=404).indices.delete(index=index)
        es.close()

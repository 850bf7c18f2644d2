"""The query API against real stores: Elasticsearch and Redis of the shared test stack filled by the
real sinks (own index names, own Redis database), a Delta table written with the `deltalake` package."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from urllib.parse import quote

import pytest
import redis
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from elasticsearch import Elasticsearch
from fastapi.testclient import TestClient

from services.api.app import create_app
from services.jobs.driver import job_settings
from services.settings import StackSettings
from services.stack import elasticsearch as es_service
from spark_jobs.model import config
from spark_jobs.model.config import PipelineConfig, SearchView
from spark_jobs.sinks.base import COMMIT_TS, KEYS_PROPERTY, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.elasticsearch import ElasticsearchSink
from spark_jobs.sinks.redis import RedisSink
from tests.demo_catalogue import demo_catalogue
from tests.sink_batches import apply
from tests.unit.spark_frames import change as frame_change

pytestmark = pytest.mark.stack

REDIS_DB = 5  # this module's own Redis database on the shared test stack (it flushes it)
COMMITTED_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def services(stack: StackSettings) -> StackSettings:
    """The shared test stack (tests/conftest.py), with a Redis database of this module's own."""
    return stack.model_copy(update={"job_redis_db": REDIS_DB})


def change(table: str, key: dict, seq: int, after: dict | None, op: str = "c") -> dict:
    """A CHANGE row as Debezium's record carries it: every value as its text."""
    text = {name: str(value) for name, value in key.items()}
    row = None if after is None else {name: None if value is None else str(value) for name, value in after.items()}
    return {**frame_change((seq, seq), op=op, table=table, key=text, after=row),
            "commit_ts": datetime.fromtimestamp(COMMITTED_MS / 1000, UTC)}


CUSTOMERS = [
    {"id": 1, "email": "ada@example.com", "name": "Ada Lovelace", "country": "GB"},
    {"id": 2, "email": "grace@example.com", "name": "Grace Hopper", "country": "US"},
    {"id": 3, "email": "alan@example.com", "name": "Alan Turing", "country": "GB"},
    {"id": 4, "email": "yonath@example.com", "name": "Ada Yonath", "country": "IL"},
    {"id": 5, "email": "gone@example.com", "name": "Ada Deleted", "country": "GB"},
]
ITEM = {"order_id": 7, "line_no": 2, "product_id": 1, "quantity": 3, "unit_price": Decimal("12.50")}


def api_pipeline() -> PipelineConfig:
    """The project's pipeline with this run's own index names; products has no cache or warehouse view
    and orders' search index is never created, to see how the API answers each."""
    base, prefix = config.load(), f"t{uuid.uuid4().hex[:10]}"
    tables = dict(base.tables)
    tables["customers"] = tables["customers"].model_copy(
        update={"search": SearchView(index=f"{prefix}_customers", text=["name"])})
    tables["orders"] = tables["orders"].model_copy(update={"search": SearchView(index=f"{prefix}_orders")})
    tables["products"] = tables["products"].model_copy(update={"search": None, "cache": None, "warehouse": None})
    return base.model_copy(update={"tables": tables})


@pytest.fixture(scope="module")
def world(services: StackSettings, spark, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    pipeline = api_pipeline()
    settings = services.model_copy(update={"state_dir": tmp_path_factory.mktemp("api-state")})
    es_url = es_service.url(settings)

    # Search: only customers' alias is set up (orders' stays missing on purpose).
    only_customers = pipeline.model_copy(update={"tables": {
        name: table if name == "customers" else table.model_copy(update={"search": None})
        for name, table in pipeline.tables.items()}, "nested": {}})
    search_sink = ElasticsearchSink(es_url, only_customers)
    search_sink.setup(spark, demo_catalogue())
    rows = [change("customers", {"id": row["id"]}, 100 + row["id"], row) for row in CUSTOMERS]
    deleted = change("customers", {"id": 5}, 200, None, op="d")
    assert apply(search_sink, spark, rows) == {}
    assert apply(search_sink, spark, [deleted]) == {}
    alias = search_sink.alias("customers")
    es = Elasticsearch(es_url)
    es.indices.refresh(index=alias)

    # Cache: this module's own Redis database, so the live key layout (no prefix) is used.
    cache = redis.Redis.from_url(job_settings(settings).redis_url)
    cache.flushdb()
    cache_sink = RedisSink(job_settings(settings).redis_url, pipeline)
    cache_sink.setup(spark, demo_catalogue())
    item = change("order_items", {"order_id": 7, "line_no": 2}, 300, ITEM)
    assert apply(cache_sink, spark, [*rows, item]) == {}
    assert apply(cache_sink, spark, [deleted]) == {}

    # Warehouse: a current-state table as the Delta sink lays it out (columns, then tl_ metadata).
    rows_sql = ", ".join(
        f"({row['id']}, '{row['name']}', '{row['country']}', '{row['id']}.50', '2026-01-0{row['id']}T09:30:00Z', "
        f"{100 + row['id']})" for row in CUSTOMERS[:4])
    write_deltalake(str(settings.state_dir / "warehouse" / "customers"), QueryBuilder().execute(
        "SELECT CAST(id AS BIGINT) AS id, name, country, CAST(credit AS DECIMAL(12,2)) AS credit, "
        "arrow_cast(created_at, 'Timestamp(Microsecond, Some(\"UTC\"))') AS created_at, "
        "CAST(v AS BIGINT) AS tl_version_major, CAST(v AS BIGINT) AS tl_version_minor "
        f"FROM (VALUES {rows_sql}) AS v(id, name, country, credit, created_at, v) ORDER BY id DESC"))
    # A history table (versions of rows 1 and 2; names sort against version order) and a window table,
    # laid out as the Delta sink writes them. order_revenue_late stays unwritten.
    history = settings.state_dir / "warehouse" / "customers_history"
    write_deltalake(str(history), QueryBuilder().execute(
        "SELECT CAST(id AS BIGINT) AS id, name, source_op, "
        "arrow_cast(valid_from, 'Timestamp(Microsecond, Some(\"UTC\"))') AS valid_from, is_current, "
        "CAST(v AS BIGINT) AS tl_version_major, CAST(v AS BIGINT) AS tl_version_minor "
        "FROM (VALUES (2, 'Zed', 'c', '2026-01-01T09:00:00Z', false, 10), "
        "(1, 'Ada', 'u', '2026-01-02T09:00:00Z', true, 30), "
        "(2, 'Amy', 'u', '2026-01-03T09:00:00Z', true, 40), (1, 'Zoe', 'c', '2026-01-01T08:00:00Z', false, 20)) "
        "AS h(id, name, source_op, valid_from, is_current, v)"))
    DeltaTable(str(history)).alter.set_table_properties({KEYS_PROPERTY: "id"}, raise_if_not_exists=False)
    write_deltalake(str(settings.state_dir / "warehouse" / "order_revenue"), QueryBuilder().execute(
        "SELECT CAST(60 AS INT) AS window_size_seconds, CAST(60 AS INT) AS window_slide_seconds, "
        "arrow_cast('2026-01-01T09:00:00Z', 'Timestamp(Microsecond, Some(\"UTC\"))') AS window_start, "
        "arrow_cast('2026-01-01T09:01:00Z', 'Timestamp(Microsecond, Some(\"UTC\"))') AS window_end, "
        "CAST('123.45' AS DECIMAL(12,2)) AS value_sum, CAST(2 AS BIGINT) AS row_count"))

    with TestClient(create_app(settings, pipeline)) as client:
        yield {"client": client, "alias": alias, "orders_alias": pipeline.tables["orders"].search.index, "es": es}
    for index in es.indices.get(index=f"{alias}-v*"):
        es.indices.delete(index=index)
    es.close()
    cache.close()


@pytest.fixture
def api(world: dict) -> TestClient:
    return world["client"]


def ids(response) -> list[str]:
    assert response.status_code == 200, response.text
    return [hit["id"] for hit in response.json()["hits"]]


# ---- search -----------------------------------------------------------------------------------


def test_search_finds_words_in_the_views_text_fields(api, world):
    found = api.get(f"/search/{world['alias']}", params={"q": "ada"})
    assert sorted(ids(found)) == ["1", "4"]  # 5 was deleted
    body = found.json()
    assert body["total"] == 2
    ada = next(hit["source"] for hit in body["hits"] if hit["id"] == "1")
    assert ada["email"] == "ada@example.com"
    assert (ada[VERSION_MAJOR], ada[VERSION_MINOR]) == (101, 101)


def test_search_filters_are_exact_and_combine_with_the_query(api, world):
    assert ids(api.get(f"/search/{world['alias']}", params={"q": "ada", "country": "GB"})) == ["1"]
    assert sorted(ids(api.get(f"/search/{world['alias']}", params={"country": "GB"}))) == ["1", "3"]
    # A full-text column filters on its exact value; repeating a field means any of its values.
    assert ids(api.get(f"/search/{world['alias']}", params={"name": "Ada Lovelace"})) == ["1"]
    either = api.get(f"/search/{world['alias']}?country=US&country=IL")
    assert sorted(ids(either)) == ["2", "4"]
    assert ids(api.get(f"/search/{world['alias']}", params={"id": "3"})) == ["3"]


def test_search_pages_do_not_overlap(api, world):
    first = api.get(f"/search/{world['alias']}", params={"size": 2, "page": 1})
    second = api.get(f"/search/{world['alias']}", params={"size": 2, "page": 2})
    third = api.get(f"/search/{world['alias']}", params={"size": 2, "page": 3})
    pages = ids(first) + ids(second) + ids(third)
    assert sorted(pages) == ["1", "2", "3", "4"]
    assert first.json()["total"] == 4 and ids(third) == []


@pytest.mark.parametrize("text", ["'; DROP TABLE customers; --", "ada\" OR 1=1 --", "name:*) {\"match_all\":{}}",
                                  "(((", "*", "\\"])
def test_sql_ish_and_operator_soup_is_just_text(api, world, text):
    response = api.get(f"/search/{world['alias']}", params={"q": text})
    assert response.status_code == 200, response.text
    assert response.json()["total"] <= 4
    assert world["es"].count(index=world["alias"])["count"] == 4  # nothing was changed by it


def test_unknown_index_is_404_with_the_known_views(api, world):
    response = api.get("/search/nope")
    assert response.status_code == 404
    assert "no search view named 'nope'" in response.json()["detail"]
    assert world["alias"] in response.json()["detail"]


@pytest.mark.parametrize(("params", "message"), [
    ({"size": 101}, "less than or equal to 100"),
    ({"size": 0}, "greater than or equal to 1"),
    ({"page": 0}, "greater than or equal to 1"),
    ({"page": "two"}, "valid integer"),
    ({"page": 200, "size": 100}, "may not exceed 10000"),
    ({"q": "x" * 501}, "at most 500 characters"),
    ({"colour": "red"}, "not a field of this index"),
    ({"Country;--": "GB"}, "not a field name"),
    ({"id": "1 OR 1=1"}, "whole number"),
    ({"shoe_size": "42"}, "not a field of this index"),  # not a column
])
def test_bad_search_parameters_are_422_with_a_message(api, world, params, message):
    response = api.get(f"/search/{world['alias']}", params=params)
    assert response.status_code == 422, response.text
    assert message in response.text


def test_a_search_view_whose_index_does_not_exist_yet_is_503_with_a_hint(api, world):
    response = api.get(f"/search/{world['orders_alias']}", params={"q": "x"})
    assert response.status_code == 503
    assert "has no index yet" in response.json()["detail"]


# ---- cache ------------------------------------------------------------------------------------


def test_cache_returns_the_row_decoded_with_its_version(api):
    response = api.get("/cache/customers/1")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "table": "customers",
        "key": "1",
        "version": {"major": 101, "minor": 101},
        "commit_ts": "2023-11-14T22:13:20.000Z",
        "row": {**CUSTOMERS[0], "created_at": None, "updated_at": None},  # NULL columns are null, typed
    }
    assert COMMIT_TS not in response.json()["row"]


@pytest.mark.parametrize("key", ["[7,2]", "[7, 2]", quote("[7,2]", safe="")])
def test_composite_keys_read_as_json_lists(api, key):
    response = api.get(f"/cache/order_items/{key}")
    assert response.status_code == 200, response.text
    assert response.json()["key"] == "[7,2]"
    assert response.json()["row"] == {**ITEM, "unit_price": "12.50"}  # NUMERIC stays exact text, ints are ints


@pytest.mark.parametrize("path", ["/cache/customers/5", "/cache/customers/999", "/cache/customers/1;%20DROP",
                                  "/cache/order_items/[7,3]", "/cache/customers/a%2Fb"])
def test_missing_rows_are_404(api, path):
    response = api.get(path)
    assert response.status_code == 404, response.text
    assert "no row" in response.json()["detail"]


@pytest.mark.parametrize(("path", "status", "message"), [
    ("/cache/nope/1", 404, "no cache view for table 'nope'"),
    ("/cache/products/1", 404, "no cache view for table 'products'"),
    ("/cache/order_items/[7,2", 422, "JSON list"),
    ("/cache/order_items/[7]", 422, "two or more"),
    ("/cache/customers/sha256:zz", 422, "64 lower-case hex"),
    ("/cache/customers/a%09b", 422, "control characters"),
    ("/cache/customers/a%0Ab", 404, "no endpoint matches this path"),  # a newline ends the route's match
    ("/cache/" + "t" * 64 + "/1", 422, "at most 63 characters"),
])
def test_unknown_tables_and_malformed_keys(api, path, status, message):
    response = api.get(path)
    assert response.status_code == status, response.text
    assert message in response.text


# ---- warehouse --------------------------------------------------------------------------------


def test_warehouse_rows_are_ordered_and_paged_with_exact_values(api):
    response = api.get("/warehouse/customers", params={"limit": 2, "offset": 1})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["total"] == 4 and (body["limit"], body["offset"]) == (2, 1)
    assert body["rows"] == [
        {"id": 2, "name": "Grace Hopper", "country": "US", "credit": "2.50",
         "created_at": "2026-01-02T09:30:00+00:00", VERSION_MAJOR: 102, VERSION_MINOR: 102},
        {"id": 3, "name": "Alan Turing", "country": "GB", "credit": "3.50",
         "created_at": "2026-01-03T09:30:00+00:00", VERSION_MAJOR: 103, VERSION_MINOR: 103},
    ]
    everything = api.get("/warehouse/customers").json()
    assert [row["id"] for row in everything["rows"]] == [1, 2, 3, 4]
    assert api.get("/warehouse/customers", params={"offset": 10}).json()["rows"] == []


def test_a_warehouse_view_not_written_yet_is_empty(api):
    response = api.get("/warehouse/orders")
    assert response.status_code == 200
    assert response.json()["total"] == 0 and response.json()["rows"] == []


def test_history_and_window_tables_are_served_like_the_current_state(api):
    history = api.get("/warehouse/customers_history").json()
    assert [(row["id"], row["name"], row["is_current"]) for row in history["rows"]] == [
        (1, "Zoe", False), (1, "Ada", True), (2, "Zed", False), (2, "Amy", True)]  # by key, then version
    assert history["rows"][1]["valid_from"] == "2026-01-02T09:00:00+00:00"
    windows = api.get("/warehouse/order_revenue").json()
    assert windows["rows"] == [{"window_size_seconds": 60, "window_slide_seconds": 60,
                                "window_start": "2026-01-01T09:00:00+00:00", "window_end": "2026-01-01T09:01:00+00:00",
                                "value_sum": "123.45", "row_count": 2}]
    late = api.get("/warehouse/order_revenue_late")
    assert late.status_code == 200 and late.json()["total"] == 0  # declared, not written yet
    listed = api.get("/warehouse/nope").json()["detail"]
    assert all(name in listed for name in ("customers_history", "order_revenue", "order_revenue_late")), listed


@pytest.mark.parametrize(("path", "params", "status", "message"), [
    ("/warehouse/nope", {}, 404, "no warehouse view for table 'nope'"),
    ("/warehouse/products_history", {}, 404, "no warehouse view for table 'products_history'"),
    ("/warehouse/products", {}, 404, "no warehouse view for table 'products'"),
    ("/warehouse/customers", {"limit": 1001}, 422, "less than or equal to 1000"),
    ("/warehouse/customers", {"limit": 0}, 422, "greater than or equal to 1"),
    ("/warehouse/customers", {"offset": -1}, 422, "greater than or equal to 0"),
    ("/warehouse/customers", {"limit": "1; DROP TABLE t"}, 422, "valid integer"),
    ("/warehouse/customers%3B%20DROP%20TABLE%20t", {}, 404, "no warehouse view"),
])
def test_bad_warehouse_requests(api, path, params, status, message):
    response = api.get(path, params=params)
    assert response.status_code == status, response.text
    assert message in response.text


# ---- the app ----------------------------------------------------------------------------------


def test_openapi_docs_are_served(api):
    assert api.get("/docs").status_code == 200
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/search/{index}", "/cache/{table}/{key}", "/warehouse/{table}"} <= set(paths)


def test_no_bad_input_gets_a_500(api, world):
    """A sweep of hostile inputs over every endpoint and parameter: never a 5xx, and a refusal has a message."""
    hostile = ["'", "\"; DROP TABLE x; --", "%00", "..%2F..%2Fetc%2Fpasswd", "{\"query\":{}}", "*", "[", "]",
               "\u202e", "9" * 40, "-1", "1e9"]
    refused = 0
    for value in hostile:
        for path, params in [
            (f"/search/{value}", {}), (f"/search/{world['alias']}", {"q": value}),
            (f"/search/{world['alias']}", {"page": value}), (f"/search/{world['alias']}", {"size": value}),
            (f"/search/{world['alias']}", {"country": value}), (f"/search/{world['alias']}", {"id": value}),
            (f"/cache/{value}/1", {}), (f"/cache/customers/{value}", {}),
            (f"/warehouse/{value}", {}), ("/warehouse/customers", {"limit": value}),
            ("/warehouse/customers", {"offset": value}),
        ]:
            response = api.get(path, params=params)
            assert response.status_code < 500, (path, params, response.status_code, response.text)
            if response.status_code >= 400:
                refused += 1
                assert response.json()["detail"], (path, params)
    assert refused > len(hostile) * 5  # most of them are refusals, not matches
    assert api.get("/cache/customers/1").status_code == 200


def test_stores_that_do_not_answer_are_503_with_a_message(services):
    """The views pointed at ports nothing listens on: real refused connections, no mocks."""
    dead = services.model_copy(update={"redis_port": 36999, "elasticsearch_port": 39999})
    pipeline = api_pipeline()
    with TestClient(create_app(dead, pipeline)) as client:
        search = client.get(f"/search/{pipeline.tables['customers'].search.index}", params={"q": "ada"})
        cache = client.get("/cache/customers/1")
    assert search.status_code == 503 and "Elasticsearch cannot answer" in search.json()["detail"], search.text
    assert cache.status_code == 503 and "Redis cannot answer" in cache.json()["detail"], cache.text

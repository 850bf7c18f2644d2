"""`tide verify` against real PostgreSQL, Elasticsearch, Redis and Delta Lake.

The module creates two scratch tables of its own (unique names: other modules use
the same stack at the same time), one with NUMERIC, timestamptz, jsonb and text[]
columns and one with a composite key declared in another order than its columns.
Their rows are applied, as the Debezium text the change records carry, by the real
sinks (`ElasticsearchSink`, `RedisSink`, `WarehouseSink`) into an alias named after the
table, Redis database 5 and a temporary warehouse. Then:

- the stores as the sinks wrote them verify clean (API returns [], CLI exits 0);
- a deleted document, a changed Redis field, a deleted Delta row, extra rows and a
  duplicated Delta row, each made behind the sinks' backs, are reported with their exact
  kind and key (CLI exits 1);
- an unknown table is an error (CLI exits 2);
- rows whose jsonb Elasticsearch refuses (an array, a scalar) are rejected by the search
  sink only, and verify reports them missing from that view only.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
import yaml
from psycopg.rows import dict_row
from typer.testing import CliRunner

from services.cli import app
from services.settings import StackSettings
from services.stack import elasticsearch, postgres
from services.verify import Divergence, verify
from spark_jobs.model import catalogue as source_catalogue
from spark_jobs.model.catalogue import Catalogue
from spark_jobs.model.config import CacheView, PipelineConfig, SearchView, TableConfig, WarehouseView, load
from spark_jobs.sinks.base import Sink
from spark_jobs.sinks.delta import WarehouseSink
from spark_jobs.sinks.elasticsearch import ElasticsearchSink
from spark_jobs.sinks.redis import RedisSink, row_key
from tests.conftest import TEST_STACK
from tests.sink_batches import apply
from tests.unit.spark_frames import change

pytestmark = pytest.mark.stack

RUN = uuid.uuid4().hex[:8]
ITEMS = f"verify_{RUN}_items"
LINES = f"verify_{RUN}_lines"
REDIS_DB = 5
KEYS = {ITEMS: ("id",), LINES: ("order_id", "line_no")}
JSON_COLUMNS = {"attrs"}  # Debezium sends json/jsonb as its text: a JSON string scalar keeps its quotes

DDL = [
    f"""CREATE TABLE {ITEMS} (
        id bigint PRIMARY KEY, sku text NOT NULL, price numeric(12,2), ratio numeric,
        made_at timestamptz, attrs jsonb, tags text[], note text)""",
    # Key columns in another order than the table's: ids follow the key's order.
    f"""CREATE TABLE {LINES} (
        line_no int, order_id bigint, qty int NOT NULL, unit_price numeric(12,2),
        PRIMARY KEY (order_id, line_no))""",
]
PLUS2 = timezone(timedelta(hours=2))
ITEM_ROWS = [
    (1, f"V-{RUN}-1", Decimal("12.50"), Decimal("0.1250"), datetime(2024, 5, 1, 12, 0, tzinfo=PLUS2),
     {"size": "L", "dims": {"w": 2, "h": 1}}, ["red", "blue"], "first"),
    (2, f"V-{RUN}-2", Decimal("0.00"), None, datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC), {}, [], None),
    (3, f"V-{RUN}-3", None, Decimal("100"), None, None, None, "ünïcödé\ttab"),
    (4, f"V-{RUN}-4", Decimal("9999999999.99"), Decimal("-1E-7"), datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC),
     {"list": ["one", "two", None], "n": -0.5, "deep": {"a": {"b": None}}}, ["a", None], ""),
    (5, f"V-{RUN}-5", Decimal("1.10"), Decimal("3"), datetime(2030, 1, 1, tzinfo=UTC), {"s": "a json string"}, ["x"],
     "last"),
]
# jsonb Elasticsearch cannot map as the object it maps jsonb as: added by the last test only.
REFUSED_BY_SEARCH = [
    (6, f"V-{RUN}-6", Decimal("1.00"), None, None, [1, "two", None, 3.5], None, "array"),
    (7, f"V-{RUN}-7", Decimal("2.00"), None, None, "a json string", None, "scalar"),
]
LINE_ROWS = [(1, 1, 3, Decimal("2.50")), (2, 1, 1, Decimal("10.00")), (1, 2, 7, None), (2, 10, 2, Decimal("0.99"))]


# ---------------------------------------------------------------- stores


def _owner(settings: StackSettings) -> psycopg.Connection:
    return psycopg.connect(postgres.conninfo(settings), autocommit=True)


def _insert_items(settings: StackSettings, rows: list[tuple]) -> None:
    with _owner(settings) as conn, conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {ITEMS} VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                        [(*row[:5], psycopg.types.json.Jsonb(row[5]) if row[5] is not None else None, *row[6:])
                         for row in rows])


def _source_rows(settings: StackSettings, table: str) -> list[dict[str, Any]]:
    with _owner(settings) as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(f"SELECT * FROM {table}").fetchall()


def _catalogue(settings: StackSettings) -> Catalogue:
    with _owner(settings) as conn:
        return source_catalogue.read(conn, "public", [ITEMS, LINES])


def _debezium_text(column: str, value: Any) -> str | None:
    """A value as the schemaless change record carries it, read as text (docs/capture.md): NUMERIC
    exact, times ISO in UTC, arrays and json as JSON text, anything else its own text."""
    if value is None:
        return None
    if column in JSON_COLUMNS or isinstance(value, list):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return str(value)


def _changes(settings: StackSettings, table: str, version: int = 1) -> list[dict[str, Any]]:
    """Every row of `table` as a snapshot CHANGE row."""
    return [
        change((0, version + position), op="r", table=table, offset=position,
               key={name: str(row[name]) for name in KEYS[table]},
               after={name: _debezium_text(name, value) for name, value in row.items()})
        for position, row in enumerate(_source_rows(settings, table))
    ]


def _apply_everywhere(settings: StackSettings, sinks: list[Sink], spark: Any) -> dict[str, dict[str, set[str]]]:
    """Every row of both tables through each sink; {sink: {table: row ids it rejected}}."""
    catalogue = _catalogue(settings)
    rejected: dict[str, dict[str, set[str]]] = {}
    for sink in sinks:
        sink.setup(spark, catalogue)
        for table in (ITEMS, LINES):
            rows = _changes(settings, table)
            refused = apply(sink, spark, rows, catalogue)
            rejected.setdefault(sink.name, {})[table] = {rows[position]["row_id"] for position in refused}
    return rejected


class Stores:
    """The scratch stores, written by the real sinks, and how to change them behind the sinks' backs."""

    def __init__(self, settings: StackSettings, warehouse: Path, spark: Any) -> None:
        self.es = httpx.Client(base_url=elasticsearch.url(settings), timeout=30)
        self.es_url = elasticsearch.url(settings)
        self.redis_url = f"redis://{settings.host}:{settings.redis_port}/{REDIS_DB}"
        self.redis = redis.Redis.from_url(self.redis_url)
        self.warehouse = warehouse
        self.spark = spark

    def sinks(self, pipeline: PipelineConfig) -> list[Sink]:
        return [ElasticsearchSink(self.es_url, pipeline), RedisSink(self.redis_url, pipeline),
                WarehouseSink(str(self.warehouse), pipeline)]

    def document(self, table: str, doc_id: str) -> dict[str, Any]:
        return self.es.get(f"/{table}/_doc/{_quoted(doc_id)}").raise_for_status().json()["_source"]

    def index(self, table: str, doc_id: str, body: dict[str, Any]) -> None:
        self.es.put(f"/{table}/_doc/{_quoted(doc_id)}", params={"refresh": "true"}, json=body).raise_for_status()

    def unindex(self, table: str, doc_id: str) -> None:
        self.es.delete(f"/{table}/_doc/{_quoted(doc_id)}", params={"refresh": "true"}).raise_for_status()

    def delta(self, table: str) -> str:
        return f"delta.`{self.warehouse / table}`"

    def close(self) -> None:
        for table in (ITEMS, LINES):
            self.es.delete(f"/{table}-v1")
        self.redis.flushdb()
        self.es.close()
        self.redis.close()


def _quoted(doc_id: str) -> str:
    return httpx.URL(path=doc_id).raw_path.decode().replace("/", "%2F")


@pytest.fixture(scope="module")
def stores(stack: StackSettings, spark: Any, pipeline: PipelineConfig,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    """Scratch tables in PostgreSQL and every sink's view of them; all removed afterwards."""
    with _owner(stack) as conn:
        for statement in DDL:
            conn.execute(statement)
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {LINES} VALUES (%s, %s, %s, %s)", LINE_ROWS)
    _insert_items(stack, ITEM_ROWS)
    result = Stores(stack, tmp_path_factory.mktemp("warehouse"), spark)
    result.redis.flushdb()
    try:
        rejected = _apply_everywhere(stack, result.sinks(pipeline), spark)
        assert rejected == {sink: {ITEMS: set(), LINES: set()} for sink in ("search", "cache", "warehouse")}
        yield result
    finally:
        result.close()
        with _owner(stack) as conn:
            for table in (ITEMS, LINES):
                conn.execute(f"DROP TABLE IF EXISTS {table}")


@pytest.fixture(scope="module")
def pipeline(stack: StackSettings) -> PipelineConfig:
    views = TableConfig(search=SearchView(), cache=CacheView(), warehouse=WarehouseView())
    return PipelineConfig(source=load(stack.pipeline_file).source, tables={ITEMS: views, LINES: views})


@pytest.fixture(scope="module")
def cli_env(pipeline: PipelineConfig, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    path = tmp_path_factory.mktemp("verify-pipeline") / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline.model_dump(by_alias=True, mode="json")))
    env = {f"TIDE_{name.upper()}": str(value) for name, value in TEST_STACK.items()}
    return {**env, "TIDE_PIPELINE_FILE": str(path)}


def _verify(stack: StackSettings, stores: Stores, pipeline: PipelineConfig, **kwargs: Any) -> list[Divergence]:
    return verify(stack, warehouse_dir=stores.warehouse, es_url=stores.es_url, redis_url=stores.redis_url,
                  pipeline=pipeline, **kwargs)


def _cli(stores: Stores, cli_env: dict[str, str], *args: str) -> Any:
    argv = ["verify", "--redis-url", stores.redis_url, "--warehouse-dir", str(stores.warehouse), *args]
    return CliRunner().invoke(app, argv, env=cli_env)


# ---------------------------------------------------------------- tests


def test_identical_stores_verify_clean(stack: StackSettings, stores: Stores, pipeline: PipelineConfig,
                                       cli_env: dict[str, str]) -> None:
    assert _verify(stack, stores, pipeline) == []
    result = _cli(stores, cli_env)
    assert result.exit_code == 0, result.output
    assert "all 6 views match PostgreSQL" in result.output


def test_selection_by_table_and_sink(stack: StackSettings, stores: Stores, pipeline: PipelineConfig,
                                     cli_env: dict[str, str]) -> None:
    result = _cli(stores, cli_env, "--table", LINES, "--sink", "cache")
    assert result.exit_code == 0, result.output
    assert "all 1 views match" in result.output and ITEMS not in result.output


def test_an_unknown_table_cannot_be_verified(stores: Stores, cli_env: dict[str, str]) -> None:
    result = _cli(stores, cli_env, "--table", "no_such_table")
    assert result.exit_code == 2
    assert "no_such_table" in result.output


def test_every_corruption_is_reported_with_its_kind_and_key(
    stack: StackSettings, stores: Stores, pipeline: PipelineConfig, cli_env: dict[str, str]
) -> None:
    # search: one document gone, one stale, one that PostgreSQL does not have
    stores.unindex(ITEMS, "2")
    stores.index(ITEMS, "3", {**stores.document(ITEMS, "3"), "note": "stale"})
    stores.index(ITEMS, "999", {**stores.document(ITEMS, "1"), "id": 999})
    # cache: one field changed behind the sink's back, one composite-key row gone, one extra
    stores.redis.hset(row_key(ITEMS, "4"), "price", "9999999999.98")
    stores.redis.delete(row_key(LINES, "[2,1]"))
    copied = {**stores.redis.hgetall(row_key(ITEMS, "5")), b"id": b"555"}
    stores.redis.hset(row_key(ITEMS, "555"), mapping=copied)
    # warehouse: a row deleted, a value changed, a key stored twice, an extra row
    stores.spark.sql(f"DELETE FROM {stores.delta(ITEMS)} WHERE id = 5")
    stores.spark.sql(f"UPDATE {stores.delta(LINES)} SET qty = 4 WHERE order_id = 1 AND line_no = 1")
    from pyspark.sql import functions as F

    copies = stores.spark.read.format("delta").load(str(stores.warehouse / ITEMS)).where("id IN (1, 2)")
    copies = copies.withColumn("id", F.when(F.col("id") == 2, F.lit(777)).otherwise(F.col("id")).cast("bigint"))
    copies.write.format("delta").mode("append").save(str(stores.warehouse / ITEMS))

    found = {(d.table, d.sink, d.kind): (d.count, d.examples) for d in _verify(stack, stores, pipeline)}

    assert found == {
        (ITEMS, "search", "missing"): (1, ("2",)),
        (ITEMS, "search", "different"): (1, ("3",)),
        (ITEMS, "search", "extra"): (1, ("999",)),
        (ITEMS, "cache", "different"): (1, ("4",)),
        (ITEMS, "cache", "extra"): (1, ("555",)),
        (LINES, "cache", "missing"): (1, ("[2,1]",)),
        (ITEMS, "warehouse", "missing"): (1, ("5",)),
        (ITEMS, "warehouse", "duplicate"): (1, ("1",)),
        (ITEMS, "warehouse", "extra"): (1, ("777",)),
        (LINES, "warehouse", "different"): (1, ("[1,1]",)),
    }
    result = _cli(stores, cli_env, "--sink", "search", "--sink", "cache")
    assert result.exit_code == 1, result.output
    assert "3 of 4 views diverge from PostgreSQL" in result.output  # LINES' search view is still clean
    print(result.output)
    assert "[2,1]" in result.output and "999" in result.output


def test_rows_elasticsearch_refuses_are_missing_from_the_search_view_only(
    stack: StackSettings, stores: Stores, spark: Any, tmp_path: Path
) -> None:
    """jsonb that is an array or a scalar cannot be the object Elasticsearch maps jsonb as: the search
    sink rejects those rows (dead letters), the other sinks keep them, and verify sees them missing
    from the search view only. Verify and the sinks agree on every other format."""
    tables = {
        table: TableConfig(search=SearchView(index=f"{table}_real"), cache=CacheView(), warehouse=WarehouseView())
        for table in (ITEMS, LINES)
    }
    pipeline = PipelineConfig(source=load(stack.pipeline_file).source, tables=tables)
    prefix, warehouse = f"real{RUN}:", tmp_path / "warehouse"
    sinks: list[Sink] = [ElasticsearchSink(stores.es_url, pipeline),
                         RedisSink(stores.redis_url, pipeline, key_prefix=prefix),
                         WarehouseSink(str(warehouse), pipeline)]
    _insert_items(stack, REFUSED_BY_SEARCH)
    try:
        rejected = _apply_everywhere(stack, sinks, spark)
        assert rejected == {"search": {ITEMS: {"6", "7"}, LINES: set()},
                            "cache": {ITEMS: set(), LINES: set()}, "warehouse": {ITEMS: set(), LINES: set()}}
        assert verify(stack, warehouse_dir=warehouse, es_url=stores.es_url, redis_url=stores.redis_url,
                      pipeline=pipeline, redis_prefix=prefix) == [
            Divergence(ITEMS, "search", "missing", 2, ("6", "7"))
        ]
        # The same stores with one row less in PostgreSQL: every view reports it as extra.
        with _owner(stack) as conn:
            conn.execute(f"DELETE FROM {LINES} WHERE order_id = 10 AND line_no = 2")
        found = verify(stack, tables=[LINES], warehouse_dir=warehouse, es_url=stores.es_url,
                       redis_url=stores.redis_url, pipeline=pipeline, redis_prefix=prefix)
        assert {(d.sink, d.kind, d.examples) for d in found} == {
            (sink, "extra", ("[10,2]",)) for sink in ("search", "cache", "warehouse")
        }
    finally:
        with _owner(stack) as conn:
            conn.execute(f"INSERT INTO {LINES} VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING", LINE_ROWS[3])
            conn.execute(f"DELETE FROM {ITEMS} WHERE id IN (6, 7)")
        for table in tables:
            stores.es.delete(f"/{table}_real-v1")
        for key in stores.redis.scan_iter(match=f"{prefix}*"):
            stores.redis.delete(key)

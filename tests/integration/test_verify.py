"""`tide verify` against real PostgreSQL, Elasticsearch, Redis and Delta Lake.

The module creates two scratch tables of its own (unique names: other modules use
the same stack at the same time), one with NUMERIC, timestamptz, jsonb and text[]
columns and one with a composite key declared in another order than its columns.
It writes each sink's store *directly*, in the formats the sinks write (their own
encoders: Elasticsearch `document`, Redis `row_fields`, Delta `spark_type`), into an
alias named after the table, Redis database 5 and a temporary warehouse. Then:

- identical stores verify clean (API returns [], CLI exits 0);
- a deleted document, a changed Redis field, a deleted Delta row, extra rows and a
  duplicated Delta row are each reported with their exact kind and key (CLI exits 1);
- an unknown table is an error (CLI exits 2);
- what the real sinks write (`ElasticsearchSink.write`, `RedisSink.write`,
  `DeltaSink.write_batch`) for the same rows verifies clean too.
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
from spark_jobs.changes import Change, ColumnType
from spark_jobs.config import CacheView, PipelineConfig, SearchView, TableConfig, WarehouseView, load
from spark_jobs.merge import doc_id
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.delta import DeltaSink, spark_type, to_spark
from spark_jobs.sinks.elasticsearch import ElasticsearchSink, document
from spark_jobs.sinks.redis import RedisSink, row_fields, row_key
from tests.conftest import TEST_STACK

pytestmark = pytest.mark.stack

RUN = uuid.uuid4().hex[:8]
ITEMS = f"verify_{RUN}_items"
LINES = f"verify_{RUN}_lines"
REDIS_DB = 5

# PostgreSQL types of the scratch columns as Debezium names them (what the Delta sink types by).
TYPES = {
    ITEMS: {
        "id": ColumnType("INT8"), "sku": ColumnType("TEXT"), "price": ColumnType("NUMERIC", 12, 2),
        "ratio": ColumnType("NUMERIC"), "made_at": ColumnType("TIMESTAMPTZ"), "attrs": ColumnType("JSONB"),
        "tags": ColumnType("_TEXT"), "note": ColumnType("TEXT"),
    },
    LINES: {
        "line_no": ColumnType("INT4"), "order_id": ColumnType("INT8"), "qty": ColumnType("INT4"),
        "unit_price": ColumnType("NUMERIC", 12, 2),
    },
}
KEYS = {ITEMS: ("id",), LINES: ("order_id", "line_no")}

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
     [1, "two", None, 3.5], ["a", None], ""),
    (5, f"V-{RUN}-5", Decimal("1.10"), Decimal("3"), datetime(2030, 1, 1, tzinfo=UTC), "a json string", ["x"], "last"),
]
LINE_ROWS = [(1, 1, 3, Decimal("2.50")), (2, 1, 1, Decimal("10.00")), (1, 2, 7, None), (2, 10, 2, Decimal("0.99"))]


# ---------------------------------------------------------------- stores


def _owner(settings: StackSettings) -> psycopg.Connection:
    return psycopg.connect(postgres.conninfo(settings), autocommit=True)


def _source_rows(settings: StackSettings, table: str) -> list[dict[str, Any]]:
    """The rows as psycopg types them, which is how Debezium's decoder types them too."""
    with _owner(settings) as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(f"SELECT * FROM {table}").fetchall()


def _change(table: str, row: dict[str, Any], version: int = 1) -> Change:
    key = {name: row[name] for name in KEYS[table]}
    return Change(table=table, op="r", key=key, before=None, after=row, sequence=(0, version), lsn=version,
                  tx_id=None, commit_ts_ms=1_714_560_000_000, snapshot="true", columns=TYPES[table])


def _row_id(table: str, row: dict[str, Any]) -> str:
    return doc_id({name: row[name] for name in KEYS[table]})


class Stores:
    """The scratch stores and how to write one row to each, in the sinks' formats."""

    def __init__(self, settings: StackSettings, warehouse: Path, spark: Any) -> None:
        self.es = httpx.Client(base_url=elasticsearch.url(settings), timeout=30)
        self.es_url = elasticsearch.url(settings)
        self.redis_url = f"redis://{settings.host}:{settings.redis_port}/{REDIS_DB}"
        self.redis = redis.Redis.from_url(self.redis_url)
        self.warehouse = warehouse
        self.spark = spark

    def create_index(self, table: str) -> None:
        index = f"{table}-v1"
        body = {"mappings": {"dynamic": False}, "aliases": {table: {}}}  # the sink's layout: alias → <alias>-v1
        self.es.put(f"/{index}", json=body).raise_for_status()

    def index(self, table: str, row: dict[str, Any]) -> None:
        body = json.loads(json.dumps(document(row, _change(table, row))))
        path = f"/{table}/_doc/{_quoted(_row_id(table, row))}"
        self.es.put(path, params={"refresh": "true"}, json=body).raise_for_status()

    def unindex(self, table: str, row_id: str) -> None:
        self.es.delete(f"/{table}/_doc/{_quoted(row_id)}", params={"refresh": "true"}).raise_for_status()

    def cache(self, table: str, row: dict[str, Any]) -> None:
        fields = row_fields(_change(table, row))
        self.redis.hset(row_key(table, _row_id(table, row)), mapping=dict(zip(fields[0::2], fields[1::2])))

    def store(self, table: str, rows: list[dict[str, Any]], mode: str = "append") -> None:
        from pyspark.sql.types import LongType, StructField, StructType, TimestampType

        types = {name: spark_type(ctype) for name, ctype in TYPES[table].items()}
        schema = StructType([StructField(name, dtype) for name, dtype in types.items()] + [
            StructField(VERSION_MAJOR, LongType()), StructField(VERSION_MINOR, LongType()),
            StructField(COMMIT_TS, TimestampType())])
        records = [
            tuple(to_spark(_json_text(row[name], TYPES[table][name]), dtype) for name, dtype in types.items())
            + (0, 1, datetime(2024, 5, 1, tzinfo=UTC))
            for row in rows
        ]
        frame = self.spark.createDataFrame(records, schema)
        frame.write.format("delta").mode(mode).save(str(self.warehouse / table))

    def close(self) -> None:
        for table in (ITEMS, LINES):
            self.es.delete(f"/{table}-v1")
            for key in self.redis.scan_iter(match=f"{table}:*"):
                self.redis.delete(key)
        self.es.close()
        self.redis.close()


def _quoted(row_id: str) -> str:
    return httpx.URL(path=row_id).raw_path.decode().replace("/", "%2F")


def _json_text(value: Any, ctype: ColumnType) -> Any:
    # The warehouse keeps jsonb as JSON text (docs/sinks/delta.md).
    return json.dumps(value, ensure_ascii=False) if ctype.name == "JSONB" and value is not None else value


@pytest.fixture(scope="module")
def stores(stack: StackSettings, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    """Scratch tables in PostgreSQL and identical copies in every store; all removed afterwards."""
    with _owner(stack) as conn:
        for statement in DDL:
            conn.execute(statement)
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {ITEMS} VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                            [(*row[:5], psycopg.types.json.Jsonb(row[5]) if row[5] is not None else None, *row[6:])
                             for row in ITEM_ROWS])
            cur.executemany(f"INSERT INTO {LINES} VALUES (%s, %s, %s, %s)", LINE_ROWS)
    result = Stores(stack, tmp_path_factory.mktemp("warehouse"), spark)
    try:
        for table in (ITEMS, LINES):
            rows = _source_rows(stack, table)
            result.create_index(table)
            for row in rows:
                result.index(table, row)
                result.cache(table, row)
            result.store(table, rows)
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
    items = {row["id"]: row for row in _source_rows(stack, ITEMS)}
    # search: one document gone, one stale, one that PostgreSQL does not have
    stores.unindex(ITEMS, "2")
    stores.index(ITEMS, {**items[3], "note": "stale"})
    stores.index(ITEMS, {**items[1], "id": 999})
    # cache: one field changed behind the sink's back, one composite-key row gone, one extra
    stores.redis.hset(row_key(ITEMS, "4"), "price", json.dumps("9999999999.98"))
    stores.redis.delete(row_key(LINES, "[2,1]"))
    stores.cache(ITEMS, {**items[5], "id": 555})
    # warehouse: a row deleted, a value changed, a key stored twice, an extra row
    stores.spark.sql(f"DELETE FROM delta.`{stores.warehouse / ITEMS}` WHERE id = 5")
    stores.spark.sql(f"UPDATE delta.`{stores.warehouse / LINES}` SET qty = 4 WHERE order_id = 1 AND line_no = 1")
    stores.store(ITEMS, [items[1], {**items[2], "id": 777}])

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


def test_what_the_real_sinks_write_verifies_clean(
    stack: StackSettings, stores: Stores, spark: Any, tmp_path: Path
) -> None:
    """Verify and the sinks agree on every format: ids, NUMERIC, timestamps, jsonb, arrays, NULLs."""
    tables = {
        table: TableConfig(search=SearchView(index=f"{table}_real"), cache=CacheView(), warehouse=WarehouseView())
        for table in (ITEMS, LINES)
    }
    pipeline = PipelineConfig(source=load(stack.pipeline_file).source, tables=tables)
    changes = [_change(table, row, version) for table in tables
               for version, row in enumerate(_source_rows(stack, table), start=1)]
    prefix, warehouse = f"real{RUN}:", tmp_path / "warehouse"
    search = ElasticsearchSink(stores.es_url, pipeline)
    cache = RedisSink(stores.redis_url, pipeline, key_prefix=prefix)
    delta = DeltaSink(str(warehouse), pipeline)
    try:
        for sink in (search, cache, delta):
            sink.setup(pipeline)
        # The search sink maps jsonb as an object: rows whose jsonb is an array or a scalar are
        # dead-lettered there, and verify must see them as missing from that view (and only there).
        refused = {doc_id(item.change.key) for item in search.write(changes)}
        assert refused == {"4", "5"}
        assert cache.write(changes) == []
        assert delta.write_batch(spark, spark.sparkContext.parallelize(changes, 2), 0) == []
        assert verify(stack, warehouse_dir=warehouse, es_url=stores.es_url, redis_url=stores.redis_url,
                      pipeline=pipeline, redis_prefix=prefix) == [
            Divergence(ITEMS, "search", "missing", 2, ("4", "5"))
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
        for table in tables:
            stores.es.delete(f"/{table}_real-v1")
        for key in stores.redis.scan_iter(match=f"{prefix}*"):
            stores.redis.delete(key)

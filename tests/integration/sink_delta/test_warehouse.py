"""The warehouse sink on real Spark + Delta (local files), through `sink.write(Batch(...))`: what Delta adds to
the contract every sink keeps (test_sink_contract.py): exact types, schema changes, replays, no per-batch code."""

from __future__ import annotations

import json
import os
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from spark_jobs.changes.newest import newest_per_row
from spark_jobs.changes.stream import decode_stream
from spark_jobs.model.catalogue import Catalogue, Column, TableSchema
from spark_jobs.model.config import PipelineConfig, TableConfig, WarehouseView
from spark_jobs.runtime.session import starting_with
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR, Batch
from spark_jobs.sinks.delta import WarehouseSink
from spark_jobs.sinks.delta._tables import SESSION_SETTINGS
from spark_jobs.sinks.delta.maintenance import maintain, session_settings
from tests.integration.sink_delta.support import MEMBERS, order, product, truncate, versions, write
from tests.unit.spark_frames import change, frame

pytestmark = pytest.mark.stack

FIXTURES = Path(__file__).parents[2] / "unit" / "fixtures" / "debezium_records.json"
RECORDS = {r["name"]: r for r in json.loads(FIXTURES.read_text())}
WAREHOUSE_TABLES = ("products", "order_items", "kinds", "customers", "orders")
PIPELINE = PipelineConfig(tables={name: TableConfig(warehouse=WarehouseView()) for name in WAREHOUSE_TABLES})


@pytest.fixture
def sink(tmp_path_factory: pytest.TempPathFactory, spark) -> WarehouseSink:
    sink = WarehouseSink(str(tmp_path_factory.mktemp("warehouse")), PIPELINE)
    sink.setup(spark, MEMBERS)
    return sink


def rows(spark, sink, table: str, *extra: str) -> dict:
    """The table's rows by primary key (one column or a tuple), with `extra` SQL expressions appended."""
    found = {}
    keys = ["order_id", "line_no"] if table == "order_items" else ["id"]
    for row in spark.read.format("delta").load(sink.path(table)).selectExpr("*", *extra).collect():
        found[tuple(row[k] for k in keys) if len(keys) > 1 else row[keys[0]]] = row.asDict()
    return found


def item(version, order_id, line_no, op="u", quantity="1") -> dict:
    key = {"order_id": str(order_id), "line_no": str(line_no)}
    found = change(version, op, "order_items", key, None if op == "d" else {**key, "quantity": quantity})
    found["row_id"] = f"[{order_id},{line_no}]"
    return found


# ---------------------------------------------------------------- current state


def test_real_records_insert_update_delete_truncate_with_exact_types(spark, sink):
    def records(*names: str):
        found = [RECORDS[n] for n in names]
        kafka = [(r["topic"], 0, offset, r["key"].encode() if r["key"] else None,
                  r["value"].encode() if r["value"] else None)
                 for offset, r in enumerate(found)]
        decoded = decode_stream(
            spark.createDataFrame(kafka, "topic string, partition int, offset long, key binary, value binary"),
            WAREHOUSE_TABLES)
        return Batch(0, spark, newest_per_row(decoded), decoded, MEMBERS)

    def applied(written: Batch) -> list:
        rejected = sink.write(written)
        return [] if rejected is None else rejected.collect()

    assert applied(records("customers_snapshot", "orders_update", "products_insert")) == []
    value = {name: json.loads(RECORDS[name]["value"])
             for name in ("customers_snapshot", "orders_update", "products_insert")}
    inserted = value["products_insert"]["after"]
    product_row = rows(spark, sink, "products", "unix_micros(updated_at) AS updated_us")[inserted["id"]]
    assert product_row["price"] == Decimal("12.50") and str(product_row["price"]) == "12.50"
    assert product_row["tags"] == ["kitchen", "blue"]
    assert json.loads(product_row["attributes"]) == {"color": "blue", "dims": {"h": 10}}
    assert product_row["description"] == inserted["description"]
    updated = datetime.fromisoformat(inserted["updated_at"])
    assert product_row["updated_us"] == (updated - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    sequence = json.loads(value["products_insert"]["source"]["sequence"])
    assert (product_row[VERSION_MAJOR], product_row[VERSION_MINOR]) == tuple(int(v) for v in sequence)
    order = value["orders_update"]["after"]
    assert rows(spark, sink, "orders")[order["id"]]["status"] == "paid"  # an enum is its label
    customer = value["customers_snapshot"]["after"]
    assert rows(spark, sink, "customers")[customer["id"]]["email"] == customer["email"]
    schema = {f.name: f.dataType.simpleString() for f in spark.read.format("delta").load(sink.path("products")).schema}
    assert (schema["price"], schema["updated_at"], schema[COMMIT_TS]) == ("decimal(12,2)", "timestamp", "timestamp")

    deleted = json.loads(RECORDS["order_items_delete"]["key"])
    kept = (deleted["order_id"], deleted["line_no"] + 1)
    write(spark, sink, [item((1, 1), *kept), item((1, 2), deleted["order_id"], deleted["line_no"])], 1)
    assert applied(records("order_items_delete")) == []
    assert set(rows(spark, sink, "order_items")) == {kept}
    assert applied(records("order_items_truncate")) == []
    assert rows(spark, sink, "order_items") == {}


def test_every_source_type_maps_to_its_spark_type(spark, sink):
    after = {
        "id": "1", "small": "7", "ratio": "0.5", "score": "2.25", "flag": "true", "local_at": "2026-01-02T03:04:05",
        "day": "2026-01-02", "raw": "AP8=", "uid": "6f1c8f8e-1d2b-4c3a-9e4f-1a2b3c4d5e6f", "status": "paid",
        "huge": "123456789012345678901234567890123456789012.5", "amounts": '["1.50",null]', "doc": '"just text"',
        "code": "FR",
    }
    assert write(spark, sink, [change((1, 1), "c", "kinds", 1, after)]) == []
    schema = {f.name: f.dataType.simpleString() for f in spark.read.format("delta").load(sink.path("kinds")).schema}
    assert {c: schema[c] for c in after} == {
        "id": "int", "small": "smallint", "ratio": "float", "score": "double", "flag": "boolean",
        "local_at": "timestamp_ntz", "day": "date", "raw": "binary", "uid": "string", "status": "string",
        "huge": "string", "amounts": "array<decimal(10,2)>", "doc": "string", "code": "string",
    }
    row = rows(spark, sink, "kinds")[1]
    assert row["local_at"] == datetime(2026, 1, 2, 3, 4, 5) and row["raw"] == bytearray(b"\x00\xff")
    assert row["day"] == date(2026, 1, 2) and row["flag"] is True and row["small"] == 7
    assert row["huge"] == "123456789012345678901234567890123456789012.5"
    assert row["amounts"] == [Decimal("1.50"), None]
    assert row["doc"] == '"just text"', "a JSON string scalar keeps its quotes: the column holds JSON text"


def test_a_value_that_cannot_be_stored_is_rejected_with_the_reason_and_the_rest_applies(spark, sink):
    rounded = product((1, 1), key=1, price="12.345")  # Spark's cast would round it to 12.35
    too_big = product((1, 2), key=2, price="12345678901.00")
    found = write(spark, sink, [rounded, too_big, product((1, 3), key=3, price="2.50")])
    assert sorted(r["error"] for r in found) == [
        "products.price: cannot store 12.345 as decimal(12,2)",
        "products.price: cannot store 12345678901.00 as decimal(12,2)"]
    assert {r["origin"]["offset"] for r in found} == {0}
    assert set(rows(spark, sink, "products")) == {3} and rows(spark, sink, "products")[3]["price"] == Decimal("2.50")


def test_a_replayed_batch_commits_nothing_to_any_table(spark, sink):
    """Beyond the contract's unchanged rows (tests/integration/test_sink_contract.py): no Delta commit."""
    write(spark, sink, [product((5, 1), key=1), product((5, 2), key=2), product((5, 3), key=3, op="d")], 0)
    changes = [product((6, 1), key=1), product((6, 2), key=2, op="d"), product((6, 3), key=4),
               truncate((6, 0)), item((6, 4), 1, 1)]
    write(spark, sink, changes, 2)
    paths = (sink.path("products"), sink.path("order_items"), sink.tombstones_path, sink.truncates_path)
    before, held = rows(spark, sink, "products"), versions(spark, *paths)
    assert write(spark, sink, changes, 2) == []
    assert rows(spark, sink, "products") == before and set(before) == {1, 4}
    assert versions(spark, *paths) == held, "a replay must not add commits to any table"


def test_wide_rows_are_written_in_row_groups_no_larger_than_the_delta_sessions_set(spark, sink, monkeypatch):
    """A reader holds a whole row group's column in memory: the Delta queries' sessions cap row groups
    (SESSION_SETTINGS: 16 MiB; here 1 MiB, so that 3.6 MB of descriptions show it), or Parquet's 128-MiB
    default would put each of these files in one."""
    monkeypatch.setitem(SESSION_SETTINGS, "parquet.block.size", str(2**20))
    write(spark, sink, [product((8, key), key=key, op="c", description=os.urandom(6_000).hex())
                        for key in range(1, 301)])
    files = [pq.ParquetFile(path).metadata for path in Path(sink.path("products")).glob("*.parquet")]
    groups = [meta.row_group(i).total_byte_size for meta in files for i in range(meta.num_row_groups)]
    assert sum(meta.num_rows for meta in files) == 300
    assert len(groups) > len(files) and max(groups) < 2 * 2**20, groups


def test_a_batch_groups_the_tombstones_of_its_own_rows_only(spark, sink):
    """The tombstones table keeps every delete ever applied; a batch's lookup returns its own rows' newest."""
    write(spark, sink, [product((5, key), key=key, op="d") for key in (1, 2, 3)], 0)
    write(spark, sink, [product((6, 1), key=2, op="d")], 1)
    asked = [product((7, 1), key=2), product((7, 2), key=4)]
    found = [(row["table"], row["row_id"], tuple(row["tomb"]))
             for row in sink.state.marks.newest(spark, frame(spark, asked)).collect()]
    assert found == [("products", asked[0]["row_id"], (6, 1))]


def test_a_column_added_at_the_source_appears_without_a_restart_and_older_rows_read_null(spark, sink):
    write(spark, sink, [product((1, 1), key=1)], 0)
    products = MEMBERS["products"]
    altered = {**MEMBERS,
               "products": TableSchema({**products.columns, "color": Column("color", "TEXT")}, products.primary_key)}
    write(spark, sink, [product((2, 1), key=2, color="blue")], 1, altered)
    found = rows(spark, sink, "products")
    assert found[2]["color"] == "blue" and found[1]["color"] is None


def test_incompatible_type_change_is_rejected_and_the_rest_applies_while_widening_applies(spark, sink):
    write(spark, sink, [item((1, 1), 1, 1), item((1, 2), 1, 2)], 0)
    items = MEMBERS["order_items"]

    def retyped(kind: str) -> Catalogue:
        return {**MEMBERS, "order_items": TableSchema({**items.columns, "quantity": Column("quantity", kind)},
                                                        items.primary_key)}

    assert write(spark, sink, [item((2, 2), 1, 2, quantity=str(2**40))], 1, retyped("INT8")) == []
    # Once the source column is text, every change carries text for it: each upsert is refused, a delete applies.
    changes = [item((3, 1), 1, 1, quantity="many"), item((3, 3), 2, 1), item((3, 4), 1, 2, op="d")]
    found = write(spark, sink, changes, 2, retyped("TEXT"))
    assert sorted(r["row_id"] for r in found) == ["[1,1]", "[2,1]"]
    reason = found[0]["error"]
    assert reason == ("order_items.quantity: the warehouse column is bigint but the change has string "
                      "(PostgreSQL TEXT), "
                      "an incompatible type change"), reason
    stored = rows(spark, sink, "order_items")
    assert stored == {(1, 1): stored[(1, 1)]} and stored[(1, 1)]["quantity"] == 1
    quantity = spark.read.format("delta").load(sink.path("order_items")).schema["quantity"]
    assert quantity.dataType.simpleString() == "bigint"


def test_batches_of_other_rows_compile_no_code(spark, sink):
    """A Delta batch plans some forty Spark jobs. Compiled, their generated classes would be compiled
    again for every batch of other keys (the MERGE's key range is a literal in the generated code) and
    for every batch after a start; the jobs run their plans interpreted instead (spark_jobs/runtime/session.py),
    so once the tables exist nothing is compiled, whatever the keys (docs/apply.md, "Generated code, or
    none")."""
    compilations = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def changes(major: int) -> list[dict]:
        first = major * 10  # keys no earlier batch had
        return [product((major, 1), key=first + 1), product((major, 2), key=first + 2, op="d"),
                item((major, 3), first + 7, 1), order((major, 4), first + 5, "9.50", datetime(2026, 3, 1, tzinfo=UTC)),
                change((major, 5), "u", "customers", first + 3,
                       {"id": str(first + 3), "email": "c@example.com", "name": "C"})]

    compiled = []
    for major in (1, 2, 3):
        before = compilations.getCount()
        assert write(spark, sink, changes(major), major) == []
        compiled.append(compilations.getCount() - before)
    assert compiled[1:] == [0, 0], f"compilations per batch: {compiled}"
    assert rows(spark, sink, "orders")[35]["total"] == Decimal("9.50") and 32 not in rows(spark, sink, "products")


def test_a_table_whose_create_was_killed_before_its_first_commit_is_created_on_the_next_batch(spark, tmp_path):
    sink = WarehouseSink(str(tmp_path), PIPELINE)
    # What a kill -9 of the driver during the table's create left behind (found by the chaos runner).
    (Path(sink.path("products")) / "_delta_log" / "_staged_commits").mkdir(parents=True)
    sink.setup(spark, MEMBERS)
    write(spark, sink, [product((1, 1), price="1.50")], 0)
    assert rows(spark, sink, "products")[1]["price"] == Decimal("1.50")


# ---------------------------------------------------------------- maintenance


def test_optimize_compacts_and_vacuums_without_changing_a_row_and_the_sink_writes_on(spark, sink):
    """`tide warehouse optimize`'s work (spark_jobs/sinks/delta/maintenance.py) on a table that batches left
    in several files, one of them with rows marked deleted: one file after, nothing else left on disk with a
    zero retention, the same rows, and the next batch applies (and its replay commits nothing)."""
    write(spark, sink, [product((1, key), key=key) for key in range(1, 7)], 0)
    write(spark, sink, [product((2, 0), key=1), product((2, 1), key=2)], 1)
    path, before = sink.path("products"), rows(spark, sink, "products")
    with starting_with(spark, session_settings(spark, retain_hours=0)):
        done = maintain(spark, path, retain_hours=0)
    assert done.files_before >= 2 and done.files_after == 1, done
    assert done.on_disk_before > 2 and done.on_disk_after == 1, f"the replaced files and vectors are deleted: {done}"
    assert rows(spark, sink, "products") == before
    changes = [product((5, 0), key=4, name="after optimize")]
    write(spark, sink, changes, 5)
    held = versions(spark, path)
    write(spark, sink, changes, 5)
    assert rows(spark, sink, "products")[4]["name"] == "after optimize" and versions(spark, path) == held

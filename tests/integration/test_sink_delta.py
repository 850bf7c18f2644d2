"""The Delta Lake warehouse sink on real Spark + Delta (local files): MERGE guard, deletes, TOAST,
truncates, schema evolution, type conflicts, composite keys, replays that commit nothing."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from services.settings import StackSettings
from services.stack import jars
from spark_jobs.changes import Change, ColumnType, decode
from spark_jobs.config import PipelineConfig, TableConfig, WarehouseView, WindowSpec, WindowView
from spark_jobs.event_windows import aggregate
from spark_jobs.merge import newest_per_row
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.delta import DeltaSink
from spark_jobs.sinks.delta_analytics import AnalyticsSink
from tests import stale_fill

pytestmark = pytest.mark.stack

FIXTURES = Path(__file__).parent.parent / "unit" / "fixtures" / "debezium_records.json"
RECORDS = {r["name"]: r for r in json.loads(FIXTURES.read_text())}
WAREHOUSE_TABLES = ("products", "order_items", "kinds", "customers", "orders")
PIPELINE = PipelineConfig(tables={name: TableConfig(warehouse=WarehouseView()) for name in WAREHOUSE_TABLES})

PRODUCT_TYPES = {
    "id": ColumnType("INT8", 19, 0), "name": ColumnType("TEXT"), "description": ColumnType("TEXT"),
    "price": ColumnType("NUMERIC", 12, 2), "tags": ColumnType("_TEXT"), "attributes": ColumnType("JSONB"),
    "updated_at": ColumnType("TIMESTAMPTZ", 35, 6),
}
ITEM_TYPES = {"order_id": ColumnType("INT8"), "line_no": ColumnType("INT4"), "quantity": ColumnType("INT4")}
WHEN = datetime(2026, 3, 29, 1, 30, 15, 123456, tzinfo=UTC)


def record(name: str) -> Change:
    r = RECORDS[name]
    return decode(r["topic"], r["key"].encode() if r["key"] else None, r["value"].encode() if r["value"] else None)


def product(seq, key=1, op="u", unavailable=(), **values) -> Change:
    after = None
    if op != "d":
        after = {"id": key, "name": f"v{seq}", "description": f"text {seq}", "price": Decimal("1.00"),
                 "tags": ["a"], "attributes": {"v": list(seq)}, "updated_at": WHEN, **values}
        after = {column: value for column, value in after.items() if column not in unavailable}
    types = {**PRODUCT_TYPES, **{c: ColumnType("TEXT") for c in values if c not in PRODUCT_TYPES}}
    return change("products", seq, op, {"id": key}, after, types, unavailable)


def item(seq, order_id, line_no, op="u", quantity=1, types=ITEM_TYPES) -> Change:
    key = {"order_id": order_id, "line_no": line_no}
    return change("order_items", seq, op, key, None if op == "d" else {**key, "quantity": quantity}, types)


def change(table, seq, op, key, after, columns, unavailable=()) -> Change:
    return Change(
        table=table, op=op, key=key if op != "t" else {}, before=None, after=after, sequence=seq, lsn=seq[1],
        tx_id=None, commit_ts_ms=1_774_747_815_000, snapshot=None, unavailable=frozenset(unavailable), columns=columns,
    )


@pytest.fixture(scope="module")
def spark(stack_settings: StackSettings):
    from spark_jobs.session import build_session

    session = build_session("tideline-test-delta", jars.ensure(stack_settings, "spark"))
    # Delta rebuilds table state with 50 tasks by default: far too many for tiny tables on 2 cores.
    session.conf.set("spark.databricks.delta.snapshotPartitions", "2")
    yield session
    session.stop()


@pytest.fixture
def sink(tmp_path_factory: pytest.TempPathFactory, spark) -> DeltaSink:
    sink = DeltaSink(str(tmp_path_factory.mktemp("warehouse")), PIPELINE)
    sink.setup(PIPELINE)
    return sink


def write(spark, sink: DeltaSink, changes: list[Change], batch_id: int = 0):
    return sink.write_batch(spark, spark.sparkContext.parallelize(changes, 2), batch_id)


def rows(spark, sink: DeltaSink, table: str, *extra: str) -> dict:
    """The table's rows by primary key (one column or a tuple), with `extra` SQL expressions appended."""
    frame = spark.read.format("delta").load(sink.path(table))
    keys = ["order_id", "line_no"] if table == "order_items" else ["id"]
    found = {}
    for row in frame.selectExpr("*", *extra).collect():
        found[tuple(row[k] for k in keys) if len(keys) > 1 else row[keys[0]]] = row.asDict()
    return found


def versions(spark, *paths: str) -> list[int]:
    from delta.tables import DeltaTable

    return [DeltaTable.forPath(spark, path).history(1).collect()[0]["version"] for path in paths]


def test_real_records_insert_update_delete_truncate_with_exact_types(spark, sink):
    batch = [record(n) for n in ("customers_snapshot", "orders_update", "products_insert")]
    assert write(spark, sink, batch) == []
    product_row = rows(spark, sink, "products", "unix_micros(updated_at) AS updated_us")[1]
    inserted = batch[2].after
    assert product_row["price"] == Decimal("12.50") and str(product_row["price"]) == "12.50"
    assert product_row["tags"] == ["kitchen", "blue"]
    assert json.loads(product_row["attributes"]) == {"color": "blue", "dims": {"h": 10}}
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert product_row["updated_us"] == (inserted["updated_at"] - epoch) // timedelta(microseconds=1)
    assert (product_row[VERSION_MAJOR], product_row[VERSION_MINOR]) == batch[2].sequence
    assert rows(spark, sink, "orders")[1]["status"] == "paid"  # an enum is its label
    assert rows(spark, sink, "customers")[2]["email"] == "b@x.io"
    schema = {f.name: f.dataType.simpleString() for f in spark.read.format("delta").load(sink.path("products")).schema}
    assert (schema["price"], schema["updated_at"], schema[COMMIT_TS]) == ("decimal(12,2)", "timestamp", "timestamp")

    delete, truncate = record("order_items_delete"), record("order_items_truncate")
    write(spark, sink, [item((1, 1), 1, 1), item((1, 2), 1, 2), item((1, 3), 2, 1)], 1)
    assert write(spark, sink, [delete], 2) == []
    assert set(rows(spark, sink, "order_items")) == {(1, 2), (2, 1)}
    assert write(spark, sink, [truncate], 3) == []
    assert rows(spark, sink, "order_items") == {}


def test_every_source_type_maps_to_its_spark_type(spark, sink):
    types = {
        "id": ColumnType("INT4"), "small": ColumnType("INT2"), "ratio": ColumnType("FLOAT4"),
        "score": ColumnType("FLOAT8"), "flag": ColumnType("BOOL"), "local_at": ColumnType("TIMESTAMP"),
        "day": ColumnType("DATE"), "raw": ColumnType("BYTEA"), "uid": ColumnType("UUID"),
        "status": ColumnType("ORDER_STATUS"), "huge": ColumnType("NUMERIC", 131089, 0),
        "amounts": ColumnType("_NUMERIC", 10, 2), "doc": ColumnType("JSONB"), "code": ColumnType("BPCHAR", 2),
    }
    after = {
        "id": 1, "small": 7, "ratio": 0.5, "score": 2.25, "flag": True, "local_at": datetime(2026, 1, 2, 3, 4, 5),
        "day": date(2026, 1, 2), "raw": b"\x00\xff", "uid": "6f1c8f8e-1d2b-4c3a-9e4f-1a2b3c4d5e6f", "status": "paid",
        "huge": Decimal("123456789012345678901234567890123456789012.5"), "amounts": ["1.50", None], "doc": "just text",
        "code": "FR",
    }
    assert write(spark, sink, [change("kinds", (1, 1), "c", {"id": 1}, after, types)]) == []
    schema = {f.name: f.dataType.simpleString() for f in spark.read.format("delta").load(sink.path("kinds")).schema}
    assert {c: schema[c] for c in types} == {
        "id": "int", "small": "smallint", "ratio": "float", "score": "double", "flag": "boolean",
        "local_at": "timestamp_ntz", "day": "date", "raw": "binary", "uid": "string", "status": "string",
        "huge": "string", "amounts": "array<decimal(10,2)>", "doc": "string", "code": "string",
    }
    row = rows(spark, sink, "kinds")[1]
    assert row["local_at"] == datetime(2026, 1, 2, 3, 4, 5) and row["raw"] == bytearray(b"\x00\xff")
    assert row["huge"] == "123456789012345678901234567890123456789012.5"
    assert row["amounts"] == [Decimal("1.50"), None]
    assert row["doc"] == '"just text"', "a JSON string scalar keeps its quotes: the column holds JSON text"


def test_older_change_after_newer_is_ignored_and_a_replayed_batch_commits_nothing(spark, sink):
    write(spark, sink, [product((5, 1), key=1), product((5, 2), key=2), product((5, 3), key=3, op="d")], 0)
    write(spark, sink, [product((4, 9), key=1, name="older"), product((5, 2), key=2)], 1)
    assert rows(spark, sink, "products")[1]["name"] == "v(5, 1)"

    batch = [product((6, 1), key=1), product((6, 2), key=2, op="d"), product((6, 3), key=4)]
    write(spark, sink, batch, 2)
    paths = (sink.path("products"), sink.tombstones_path, sink.truncates_path)
    before, held = rows(spark, sink, "products"), versions(spark, *paths)
    assert write(spark, sink, batch, 2) == []
    assert rows(spark, sink, "products") == before and set(before) == {1, 4}
    assert versions(spark, *paths) == held, "a replay must not add commits to any table"


def test_a_deleted_row_is_not_resurrected_by_a_late_older_upsert(spark, sink):
    write(spark, sink, [product((1, 1), key=1)], 0)
    write(spark, sink, [product((3, 0), key=1, op="d"), product((3, 1), key=2, op="d")], 1)
    write(spark, sink, [product((2, 0), key=1), product((2, 5), key=2)], 2)
    assert rows(spark, sink, "products") == {}
    tombstones = spark.read.format("delta").load(sink.tombstones_path).collect()
    assert {(t["doc_id"], t["major"], t["minor"]) for t in tombstones} == {("1", 3, 0), ("2", 3, 1)}
    write(spark, sink, [product((4, 0), key=1)], 3)  # a newer re-insert is a new life of the row
    assert set(rows(spark, sink, "products")) == {1}


def test_unchanged_toast_column_keeps_the_stored_value(spark, sink):
    write(spark, sink, [product((1, 1), description="x" * 20_000)], 0)
    write(spark, sink, [product((2, 1), unavailable={"description"}, price=Decimal("9.99"))], 1)
    row = rows(spark, sink, "products")[1]
    assert row["description"] == "x" * 20_000 and row["price"] == Decimal("9.99") and row["name"] == "v(2, 1)"


def toast_product(seq, key, description):
    """An upsert for tests/stale_fill.py: no description means Debezium's placeholder."""
    if description is None:
        return product(seq, key=key, unavailable={"description"})
    return product(seq, key=key, description=description)


def test_a_stale_full_image_in_the_batch_does_not_overwrite_a_newer_stored_toast_value(spark, sink):
    write(spark, sink, stale_fill.stored_first(toast_product), 0)
    assert write(spark, sink, stale_fill.batch(toast_product), 1) == []
    found = rows(spark, sink, "products")
    for key, description in stale_fill.EXPECTED.items():
        assert (found[key]["description"], found[key]["name"]) == (description, f"v{stale_fill.UPDATE}"), key
        assert (found[key][VERSION_MAJOR], found[key][VERSION_MINOR]) == stale_fill.UPDATE


def test_truncate_removes_rows_below_the_watermark_and_keeps_later_ones(spark, sink):
    write(spark, sink, [item((1, 1), 1, 1), item((1, 2), 1, 2), item((9, 1), 3, 1)], 0)
    truncate = change("order_items", (5, 0), "t", {}, None, ITEM_TYPES)
    assert write(spark, sink, [truncate], 1) == []
    assert write(spark, sink, [item((6, 0), 2, 1), item((4, 9), 2, 2)], 1) == []
    assert set(rows(spark, sink, "order_items")) == {(3, 1), (2, 1)}
    write(spark, sink, [item((3, 0), 1, 1, quantity=5), change("order_items", (2, 0), "t", {}, None, ITEM_TYPES)], 2)
    assert set(rows(spark, sink, "order_items")) == {(3, 1), (2, 1)}, "older upsert and older truncate change nothing"


def test_composite_key_rows_are_merged_per_key(spark, sink):
    write(spark, sink, [item((1, 1), 1, 1), item((1, 2), 1, 2), item((1, 3), 2, 1)], 0)
    write(spark, sink, [item((2, 1), 1, 2, quantity=7), item((2, 2), 1, 1, op="d")], 1)
    found = rows(spark, sink, "order_items")
    assert set(found) == {(1, 2), (2, 1)} and found[(1, 2)]["quantity"] == 7 and found[(2, 1)]["quantity"] == 1


def test_a_column_added_at_the_source_appears_and_older_rows_read_null(spark, sink):
    write(spark, sink, [product((1, 1), key=1)], 0)
    write(spark, sink, [product((2, 1), key=2, color="blue")], 1)
    found = rows(spark, sink, "products")
    assert found[2]["color"] == "blue" and found[1]["color"] is None


def test_incompatible_type_change_is_rejected_and_the_rest_applies_while_widening_applies(spark, sink):
    write(spark, sink, [item((1, 1), 1, 1), item((1, 2), 1, 2)], 0)
    as_text = item((2, 1), 1, 1, quantity="many", types={**ITEM_TYPES, "quantity": ColumnType("TEXT")})
    as_bigint = item((2, 2), 1, 2, quantity=2**40, types={**ITEM_TYPES, "quantity": ColumnType("INT8")})
    rejected = write(spark, sink, [as_text, as_bigint, item((2, 3), 2, 1)], 1)
    assert [r.change for r in rejected] == [as_text]
    reason = rejected[0].reason
    assert "order_items.quantity" in reason and "bigint" in reason and "string" in reason, reason
    found = rows(spark, sink, "order_items")
    assert found[(1, 1)]["quantity"] == 1 and found[(1, 2)]["quantity"] == 2**40 and (2, 1) in found
    quantity = spark.read.format("delta").load(sink.path("order_items")).schema["quantity"]
    assert quantity.dataType.simpleString() == "bigint"


# ---------------------------------------------------------------- SCD2 history and event-time windows

ORDER_TYPES = {"id": ColumnType("INT8"), "total": ColumnType("NUMERIC", 12, 2), "created_at": ColumnType("TIMESTAMPTZ")}
MINUTE = timedelta(minutes=1)
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
DERIVED = PipelineConfig(
    tables={"products": TableConfig(warehouse=WarehouseView(history=True)), "orders": TableConfig(warehouse=WarehouseView())},
    windows={"revenue": WindowView(table="orders", time_column="created_at", value_column="total",
                                   windows=[WindowSpec(size_seconds=60), WindowSpec(size_seconds=180, slide_seconds=60)],
                                   allowed_lateness_seconds=60)},
)


@pytest.fixture
def derived(tmp_path_factory: pytest.TempPathFactory, spark) -> AnalyticsSink:
    sink = AnalyticsSink(str(tmp_path_factory.mktemp("derived")), DERIVED)
    sink.setup(DERIVED)
    return sink


def committed(seq, commit: datetime, c: Change) -> Change:
    return replace(c, sequence=seq, commit_ts_ms=int(commit.timestamp() * 1000))


def history(spark, sink: AnalyticsSink, table: str = "products") -> list[dict]:
    frame = spark.read.format("delta").load(sink.history.path(table))
    return [r.asDict() for r in frame.orderBy("id", VERSION_MAJOR, VERSION_MINOR).collect()]


def write_all(spark, sink: AnalyticsSink, changes: list[Change], batch_id: int) -> list:
    """What the pipeline does per batch: newest per row to write_batch, every change to write_history."""
    rdd = spark.sparkContext.parallelize(changes, 1)  # a row's changes share a partition, as Kafka keys them
    return sink.write_batch(spark, rdd.mapPartitions(newest_per_row), batch_id) + sink.write_history(spark, rdd, batch_id)


def test_history_keeps_every_version_in_order_whatever_the_arrival_order_and_replays_add_nothing(spark, derived):
    v1 = committed((0, 1), T0, product((0, 1), op="r", description="long text"))
    v2 = committed((2, 1), T0 + MINUTE, product((2, 1), unavailable={"description"}, price=Decimal("2.00")))
    v3 = committed((3, 1), T0 + 2 * MINUTE, product((3, 1), op="d"))
    v4 = committed((4, 1), T0 + 3 * MINUTE, product((4, 1), op="c", description="again"))
    other = committed((2, 5), T0 + MINUTE, product((2, 5), key=2, op="c"))
    # v2 arrives a batch after v1 and v3 (a replay after a re-delivery), v4 with it, v2 twice.
    assert write_all(spark, derived, [v1, v3, other], 0) == []
    assert write_all(spark, derived, [v4, v2, v2], 1) == []
    found = [r for r in history(spark, derived) if r["id"] == 1]
    assert [(r["source_op"], r["valid_from"], r["valid_to"], r["is_current"]) for r in found] == [
        ("r", T0.replace(tzinfo=None), (T0 + MINUTE).replace(tzinfo=None), False),
        ("u", (T0 + MINUTE).replace(tzinfo=None), (T0 + 2 * MINUTE).replace(tzinfo=None), False),
        ("d", (T0 + 2 * MINUTE).replace(tzinfo=None), (T0 + 3 * MINUTE).replace(tzinfo=None), False),
        ("c", (T0 + 3 * MINUTE).replace(tzinfo=None), None, True),
    ]
    assert found[1]["description"] == "long text", "an unchanged TOASTed column comes from the version before"
    assert found[1]["price"] == Decimal("2.00") and found[1]["tl_unavailable"] == []
    assert found[2]["name"] is None, "a delete carries only its key"
    held = versions(spark, derived.history.path("products"))
    assert write_all(spark, derived, [v4, v2, v1, v3], 2) == []
    assert len(history(spark, derived)) == 5
    assert versions(spark, derived.history.path("products")) == held, "a replay must not commit to the history"


def test_a_truncate_closes_every_live_row_in_the_history(spark, derived):
    write_all(spark, derived, [committed((1, k), T0, product((1, k), key=k, op="c")) for k in (1, 2)], 0)
    write_all(spark, derived, [committed((2, 1), T0 + MINUTE, product((2, 1), key=2, op="d"))], 1)
    truncate = replace(change("products", (3, 0), "t", {}, None, PRODUCT_TYPES), commit_ts_ms=int((T0 + 2 * MINUTE).timestamp() * 1000))
    write_all(spark, derived, [truncate], 2)
    found = history(spark, derived)
    assert [(r["id"], r["source_op"]) for r in found] == [(1, "c"), (1, "t"), (2, "c"), (2, "d")]
    assert not any(r["is_current"] for r in found) and found[0]["valid_to"] == (T0 + 2 * MINUTE).replace(tzinfo=None)


def order(seq, key, total, created: datetime | None, op="u") -> Change:
    after = None if op == "d" else {"id": key, "total": Decimal(total), "created_at": created}
    return change("orders", seq, op, {"id": key}, after, ORDER_TYPES)


def window_figures(spark, sink: AnalyticsSink) -> dict:
    frame = spark.read.format("delta").load(sink.windows.path("revenue"))
    return {(r["window_size_seconds"], r["window_slide_seconds"], r["window_start"].replace(tzinfo=UTC)):
            (r["value_sum"], r["row_count"]) for r in frame.collect()}


def late_deltas(spark, sink: AnalyticsSink) -> dict:
    path = sink.windows.path("revenue_late")
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return {}
    found: dict = {}
    for r in spark.read.format("delta").load(path).collect():
        key = (r["window_size_seconds"], r["window_slide_seconds"], r["window_start"].replace(tzinfo=UTC))
        value, count = found.get(key, (Decimal(0), 0))
        found[key] = (value + r["value_delta"], count + r["count_delta"])
    return found


def test_windows_follow_the_current_rows_until_closed_then_record_late_changes(spark, derived):
    spec = DERIVED.windows["revenue"].windows
    rows = {1: ("10.00", T0), 2: ("5.00", T0 + MINUTE), 3: ("7.00", T0 + 5 * MINUTE)}
    write_all(spark, derived, [order((1, k), k, total, at, "r") for k, (total, at) in rows.items()], 0)
    assert window_figures(spark, derived) == aggregate(((at, Decimal(t)) for t, at in rows.values()), spec)
    # The watermark is now T0+5m - 60 s: windows ending by T0+4m are closed.
    late = [order((2, 1), 4, "100.00", T0 + 30 * timedelta(seconds=1), "c"),   # new, in closed windows only
            order((2, 2), 2, "6.00", T0 + MINUTE),                               # an edit in a closed window
            order((2, 3), 5, "1.00", T0 + 4 * MINUTE + timedelta(seconds=5), "c"),  # on time
            order((2, 4), 3, None, None, "d")]                                   # a delete in open windows
    write_all(spark, derived, late, 1)
    now = {1: ("10.00", T0), 2: ("6.00", T0 + MINUTE), 4: ("100.00", T0 + timedelta(seconds=30)),
           5: ("1.00", T0 + 4 * MINUTE + timedelta(seconds=5))}
    expected = aggregate(((at, Decimal(t)) for t, at in now.values()), spec)
    figures, deltas = window_figures(spark, derived), late_deltas(spark, derived)
    assert deltas[(60, 60, T0)] == (Decimal("100.00"), 1) and deltas[(60, 60, T0 + MINUTE)] == (Decimal("1.00"), 0)
    assert figures[(60, 60, T0)] == (Decimal("10.00"), 1), "a closed window keeps its figures"
    assert figures[(60, 60, T0 + 4 * MINUTE)] == (Decimal("1.00"), 1), "an open window follows the rows"
    assert (60, 60, T0 + 5 * MINUTE) not in figures, "an open window whose rows are gone is removed"
    combined = {key: tuple(a + b for a, b in zip(figures.get(key, (0, 0)), deltas.get(key, (0, 0)))) for key in figures | deltas}
    assert {k: v for k, v in combined.items() if v != (0, 0)} == expected
    paths = (derived.windows.path("revenue"), derived.windows.path("revenue_late"), derived.windows.watermarks_path)
    held = versions(spark, *paths)
    write_all(spark, derived, late, 1)
    assert versions(spark, *paths) == held and late_deltas(spark, derived) == deltas, "a replay commits nothing"


def test_a_run_of_unchanged_toast_versions_takes_the_value_from_the_last_version_that_had_it(spark, derived):
    write_all(spark, derived, [committed((1, 1), T0, product((1, 1), op="c", description="kept"))], 0)
    repriced = [committed((k, 1), T0 + k * MINUTE, product((k, 1), unavailable={"description"})) for k in (2, 3, 4)]
    write_all(spark, derived, repriced[:2], 1)  # two in a row, their source in an earlier batch
    write_all(spark, derived, repriced[2:], 2)
    found = history(spark, derived)
    assert [(r["description"], r["tl_unavailable"]) for r in found] == [("kept", [])] * 4


def test_a_table_whose_create_was_killed_before_its_first_commit_is_created_on_the_next_batch(spark, sink):
    # What a kill -9 of the driver during the table's create left behind (found by the chaos runner).
    (Path(sink.path("products")) / "_delta_log" / "_staged_commits").mkdir(parents=True)
    write(spark, sink, [product((1, 1), price=Decimal("1.50"))], 0)
    assert rows(spark, sink, "products")[1]["price"] == Decimal("1.50")

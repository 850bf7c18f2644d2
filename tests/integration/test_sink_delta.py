"""The Delta Lake sinks on real Spark + Delta (local files), through `sink.write(Batch(...))` as the
pipeline calls them: what Delta adds to the contract every sink keeps
(tests/integration/test_sink_contract.py): exact types, schema evolution, type conflicts, replays that
commit nothing, no code compiled per batch; then the analytics sink's SCD2 history and event-time
windows."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from services.settings import StackSettings
from services.stack import jars
from spark_jobs.changes.newest import newest_per_row
from spark_jobs.changes.stream import decode_stream
from spark_jobs.model.catalogue import Catalogue, Column, TableSchema
from spark_jobs.model.config import PipelineConfig, TableConfig, WarehouseView, WindowSpec, WindowView
from spark_jobs.model.event_windows import aggregate
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR, Batch
from spark_jobs.sinks.delta import AnalyticsSink, WarehouseSink
from tests.demo_catalogue import demo_catalogue
from tests.unit.spark_frames import change, frame

pytestmark = pytest.mark.stack

FIXTURES = Path(__file__).parent.parent / "unit" / "fixtures" / "debezium_records.json"
RECORDS = {r["name"]: r for r in json.loads(FIXTURES.read_text())}
WAREHOUSE_TABLES = ("products", "order_items", "kinds", "customers", "orders")
PIPELINE = PipelineConfig(tables={name: TableConfig(warehouse=WarehouseView()) for name in WAREHOUSE_TABLES})
KINDS = TableSchema({name: Column(name, kind, precision, scale) for name, kind, precision, scale in (
    ("id", "INT4", None, None), ("small", "INT2", None, None), ("ratio", "FLOAT4", None, None),
    ("score", "FLOAT8", None, None), ("flag", "BOOL", None, None), ("local_at", "TIMESTAMP", None, None),
    ("day", "DATE", None, None), ("raw", "BYTEA", None, None), ("uid", "UUID", None, None),
    ("status", "ORDER_STATUS", None, None), ("huge", "NUMERIC", None, None), ("amounts", "_NUMERIC", 10, 2),
    ("doc", "JSONB", None, None), ("code", "BPCHAR", 2, None),
)}, ("id",))
MEMBERS: Catalogue = {**demo_catalogue(), "kinds": KINDS}


@pytest.fixture(scope="module")
def spark(stack_settings: StackSettings):
    from spark_jobs.runtime.session import build_session

    session = build_session("tideline-test-delta", jars.ensure(stack_settings, "spark"), master="local[2]")
    yield session
    session.stop()


@pytest.fixture
def sink(tmp_path_factory: pytest.TempPathFactory, spark) -> WarehouseSink:
    sink = WarehouseSink(str(tmp_path_factory.mktemp("warehouse")), PIPELINE)
    sink.setup(spark, MEMBERS)
    return sink


def batch(spark, changes: list[dict], batch_id: int = 0, catalogue: Catalogue = MEMBERS) -> Batch:
    """A micro-batch as the pipeline hands it to a sink: every change, and the newest per row."""
    every = frame(spark, changes)
    return Batch(batch_id, spark, newest_per_row(every), every, catalogue)


def write(spark, sink, changes: list[dict], batch_id: int = 0, catalogue: Catalogue = MEMBERS) -> list[dict]:
    """Run the sink's write and its returned rejects (the pipeline's dead-letter action)."""
    rejected = sink.write(batch(spark, changes, batch_id, catalogue))
    return [] if rejected is None else [row.asDict(recursive=True) for row in rejected.collect()]


def rows(spark, sink, table: str, *extra: str) -> dict:
    """The table's rows by primary key (one column or a tuple), with `extra` SQL expressions appended."""
    found = {}
    keys = ["order_id", "line_no"] if table == "order_items" else ["id"]
    for row in spark.read.format("delta").load(sink.path(table)).selectExpr("*", *extra).collect():
        found[tuple(row[k] for k in keys) if len(keys) > 1 else row[keys[0]]] = row.asDict()
    return found


def versions(spark, *paths: str) -> list[int]:
    from delta.tables import DeltaTable

    return [DeltaTable.forPath(spark, path).history(1).collect()[0]["version"] for path in paths]


def product(version, key=1, op="u", unavailable=(), **values: Any) -> dict:
    after = None
    if op != "d":
        after = {"id": str(key), "name": f"v{version}", "description": f"text {version}", "price": "1.00",
                 "tags": '["a"]', "attributes": json.dumps({"v": list(version)}),
                 "updated_at": "2026-03-29T01:30:15.123456Z",
                 **values}
        after = {column: value for column, value in after.items() if column not in unavailable}
    return change(version, op, "products", key, after, tuple(unavailable))


def item(version, order_id, line_no, op="u", quantity="1") -> dict:
    key = {"order_id": str(order_id), "line_no": str(line_no)}
    found = change(version, op, "order_items", key, None if op == "d" else {**key, "quantity": quantity})
    found["row_id"] = f"[{order_id},{line_no}]"
    return found


def truncate(version, table="order_items") -> dict:
    return change(version, "t", table)


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


# ---------------------------------------------------------------- primary-key moves (issue 15, item 7)

# ---------------------------------------------------------------- SCD2 history and event-time windows

MINUTE = timedelta(minutes=1)
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
DERIVED = PipelineConfig(
    tables={"products": TableConfig(warehouse=WarehouseView(history=True)),
            "orders": TableConfig(warehouse=WarehouseView())},
    windows={"revenue": WindowView(table="orders", time_column="created_at", value_column="total",
                                   windows=[WindowSpec(size_seconds=60),
                                            WindowSpec(size_seconds=180, slide_seconds=60)],
                                   allowed_lateness_seconds=60)},
)


@pytest.fixture
def derived(tmp_path_factory: pytest.TempPathFactory, spark) -> AnalyticsSink:
    sink = AnalyticsSink(str(tmp_path_factory.mktemp("derived")), DERIVED)
    sink.setup(spark, MEMBERS)
    return sink


def at(version, when: datetime, found: dict) -> dict:
    return {**found, "version": {"major": version[0], "minor": version[1]}, "commit_ts": when}


def history(spark, sink: AnalyticsSink, table: str = "products") -> list[dict]:
    frame = spark.read.format("delta").load(sink.history.path(table))
    return [r.asDict() for r in frame.orderBy("id", VERSION_MAJOR, VERSION_MINOR).collect()]


def naive(moment: datetime) -> datetime:
    return moment.replace(tzinfo=None)


def test_history_keeps_every_version_in_order_whatever_the_arrival_order_and_replays_add_nothing(spark, derived):
    v1 = at((0, 1), T0, product((0, 1), op="r", description="long text"))
    v2 = at((2, 1), T0 + MINUTE, product((2, 1), unavailable={"description"}, price="2.00"))
    v3 = at((3, 1), T0 + 2 * MINUTE, product((3, 1), op="d"))
    v4 = at((4, 1), T0 + 3 * MINUTE, product((4, 1), op="c", description="again"))
    other = at((2, 5), T0 + MINUTE, product((2, 5), key=2, op="c"))
    # v2 arrives a batch after v1 and v3 (a replay after a re-delivery), v4 with it, v2 twice.
    assert write(spark, derived, [v1, v3, other], 0) == []
    assert write(spark, derived, [v4, v2, {**v2, "origin": {**v2["origin"], "offset": 9}}], 1) == []
    found = [r for r in history(spark, derived) if r["id"] == 1]
    assert [(r["source_op"], r["valid_from"], r["valid_to"], r["is_current"]) for r in found] == [
        ("r", naive(T0), naive(T0 + MINUTE), False),
        ("u", naive(T0 + MINUTE), naive(T0 + 2 * MINUTE), False),
        ("d", naive(T0 + 2 * MINUTE), naive(T0 + 3 * MINUTE), False),
        ("c", naive(T0 + 3 * MINUTE), None, True),
    ]
    assert found[1]["description"] == "long text", "an unchanged TOASTed column comes from the version before"
    assert found[1]["price"] == Decimal("2.00") and found[1]["tl_unavailable"] == []
    assert found[2]["name"] is None, "a delete carries only its key"
    held = versions(spark, derived.history.path("products"))
    assert write(spark, derived, [v4, v2, v1, v3], 2) == []
    assert len(history(spark, derived)) == 5
    assert versions(spark, derived.history.path("products")) == held, "a replay must not commit to the history"


def test_a_truncate_closes_every_live_row_in_the_history(spark, derived):
    write(spark, derived, [at((1, k), T0, product((1, k), key=k, op="c")) for k in (1, 2)], 0)
    write(spark, derived, [at((2, 1), T0 + MINUTE, product((2, 1), key=2, op="d"))], 1)
    write(spark, derived, [at((3, 0), T0 + 2 * MINUTE, truncate((3, 0), "products"))], 2)
    found = history(spark, derived)
    assert [(r["id"], r["source_op"]) for r in found] == [(1, "c"), (1, "t"), (2, "c"), (2, "d")]
    assert not any(r["is_current"] for r in found) and found[0]["valid_to"] == naive(T0 + 2 * MINUTE)


def test_a_run_of_unchanged_toast_versions_takes_the_value_from_the_last_version_that_had_it(spark, derived):
    write(spark, derived, [at((1, 1), T0, product((1, 1), op="c", description="kept"))], 0)
    repriced = [at((k, 1), T0 + k * MINUTE, product((k, 1), unavailable={"description"})) for k in (2, 3, 4)]
    write(spark, derived, repriced[:2], 1)  # two in a row, their source in an earlier batch
    write(spark, derived, repriced[2:], 2)
    found = history(spark, derived)
    assert [(r["description"], r["tl_unavailable"]) for r in found] == [("kept", [])] * 4


def order(version, key, total, created: datetime | None, op="u") -> dict:
    after = None if op == "d" else {"id": str(key), "total": total,
                                    "created_at": None if created is None
                                    else created.isoformat().replace("+00:00", "Z")}
    return change(version, op, "orders", key, after)


def window_figures(spark, sink: AnalyticsSink) -> dict:
    frame = spark.read.format("delta").load(sink.windows.path("revenue"))
    return {(r["window_size_seconds"], r["window_slide_seconds"], r["window_start"].replace(tzinfo=UTC)):
            (r["value_sum"], r["row_count"]) for r in frame.collect()}


def late_deltas(spark, sink: AnalyticsSink) -> dict:
    from delta.tables import DeltaTable

    path = sink.windows.path("revenue_late")
    if not DeltaTable.isDeltaTable(spark, path):
        return {}
    found: dict = {}
    for r in spark.read.format("delta").load(path).collect():
        key = (r["window_size_seconds"], r["window_slide_seconds"], r["window_start"].replace(tzinfo=UTC))
        value, count = found.get(key, (Decimal(0), 0))
        found[key] = (value + r["value_delta"], count + r["count_delta"])
    return found


def figures_with_late_deltas(spark, sink: AnalyticsSink) -> dict:
    """Each window's figures plus its recorded late deltas (what `tide verify` compares), windows that
    cancel to nothing left out."""
    figures, deltas = window_figures(spark, sink), late_deltas(spark, sink)
    combined = {key: tuple(a + b for a, b in zip(figures.get(key, (0, 0)), deltas.get(key, (0, 0)), strict=True))
                for key in figures | deltas}
    return {key: value for key, value in combined.items() if value != (0, 0)}


def test_windows_follow_the_current_rows_until_closed_then_record_late_changes(spark, derived):
    spec = DERIVED.windows["revenue"].windows
    placed = {1: ("10.00", T0), 2: ("5.00", T0 + MINUTE), 3: ("7.00", T0 + 5 * MINUTE)}
    write(spark, derived, [order((1, k), k, total, when, "r") for k, (total, when) in placed.items()], 0)
    assert window_figures(spark, derived) == aggregate(((when, Decimal(t)) for t, when in placed.values()), spec)
    # The watermark is now T0+5m - 60 s: windows ending by T0+4m are closed.
    late = [order((2, 1), 4, "100.00", T0 + 30 * timedelta(seconds=1), "c"),   # new, in closed windows only
            order((2, 2), 2, "6.00", T0 + MINUTE),                               # an edit in a closed window
            order((2, 3), 5, "1.00", T0 + 4 * MINUTE + timedelta(seconds=5), "c"),  # on time
            order((2, 4), 3, None, None, "d")]                                   # a delete in open windows
    write(spark, derived, late, 1)
    now = {1: ("10.00", T0), 2: ("6.00", T0 + MINUTE), 4: ("100.00", T0 + timedelta(seconds=30)),
           5: ("1.00", T0 + 4 * MINUTE + timedelta(seconds=5))}
    expected = aggregate(((when, Decimal(t)) for t, when in now.values()), spec)
    figures, deltas = window_figures(spark, derived), late_deltas(spark, derived)
    assert deltas[(60, 60, T0)] == (Decimal("100.00"), 1) and deltas[(60, 60, T0 + MINUTE)] == (Decimal("1.00"), 0)
    assert figures[(60, 60, T0)] == (Decimal("10.00"), 1), "a closed window keeps its figures"
    assert figures[(60, 60, T0 + 4 * MINUTE)] == (Decimal("1.00"), 1), "an open window follows the rows"
    assert (60, 60, T0 + 5 * MINUTE) not in figures, "an open window whose rows are gone is removed"
    assert figures_with_late_deltas(spark, derived) == expected
    paths = (derived.windows.path("revenue"), derived.windows.path("revenue_late"), derived.windows.watermarks_path)
    held = versions(spark, *paths)
    write(spark, derived, late, 1)
    assert versions(spark, *paths) == held and late_deltas(spark, derived) == deltas, "a replay commits nothing"


def test_a_stale_change_of_a_row_deleted_after_its_window_closed_records_no_late_change(spark, derived):
    spec = DERIVED.windows["revenue"].windows
    snapshot = [order((1, 1), 1, "10.00", T0, "r"), order((1, 2), 2, "7.00", T0 + 5 * MINUTE, "r")]
    write(spark, derived, snapshot, 0)  # the watermark is now T0+4m: the windows around T0 are closed
    write(spark, derived, [order((2, 1), 1, None, None, "d")], 1)  # recorded late: -10.00, -1
    expected = aggregate([(T0 + 5 * MINUTE, Decimal("7.00"))], spec)
    assert figures_with_late_deltas(spark, derived) == expected
    # Sent again after the delete (a stale redelivery, or a resend after a Connect crash): the MERGE
    # refuses it (the row's tombstone is newer), so the windows must not count it either.
    write(spark, derived, [snapshot[0]], 2)
    assert figures_with_late_deltas(spark, derived) == expected

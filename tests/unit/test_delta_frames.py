"""The Delta sinks' pure pieces on tiny frames (no Delta, no jars): PostgreSQL types in Spark SQL,
table plans, MERGE source rows and rejects, primary-key move images, history intervals, windows."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    TimestampType,
)

from spark_jobs.model.catalogue import Column, TableSchema
from spark_jobs.model.config import WindowSpec
from spark_jobs.model.event_windows import window_starts
from spark_jobs.sinks.delta._history import as_versions, moved_images
from spark_jobs.sinks.delta._plan import plan_table
from spark_jobs.sinks.delta._source import image, key_of_row_id, merge_source, rejected, with_images
from spark_jobs.sinks.delta._types import as_text, fits, spark_type, typed, unreadable
from spark_jobs.sinks.delta._windows import in_windows
from tests.demo_catalogue import demo_catalogue
from tests.unit.spark_frames import change, frame

PRODUCTS = demo_catalogue()["products"]
ITEMS = demo_catalogue()["order_items"]


def test_catalogue_types_map_to_delta_types():
    assert spark_type(Column("a", "INT2")) == ShortType() and spark_type(Column("a", "INT8")) == LongType()
    assert spark_type(Column("a", "NUMERIC", 12, 2)) == DecimalType(12, 2)
    assert spark_type(Column("a", "NUMERIC")) == StringType(), "unconstrained numeric stays exact as text"
    assert spark_type(Column("a", "NUMERIC", 60, 2)) == StringType()
    assert spark_type(Column("a", "_NUMERIC", 10, 2)) == ArrayType(DecimalType(10, 2))
    assert spark_type(Column("a", "ORDER_STATUS", values=("paid",))) == StringType()
    assert spark_type(None) == StringType(), "a column the catalogue does not know is kept as text"


def test_fits_allows_only_what_delta_widens_in_place():
    assert fits(ShortType(), LongType()) and not fits(LongType(), IntegerType())
    assert fits(DecimalType(10, 2), DecimalType(12, 3)) and not fits(DecimalType(10, 2), DecimalType(10, 3))
    assert not fits(IntegerType(), StringType())


CASES = [
    ("12.50", DecimalType(12, 2), Decimal("12.50")), ("12.5", DecimalType(12, 2), Decimal("12.50")),
    ("12.500", DecimalType(12, 2), Decimal("12.50")), ("12.345", DecimalType(12, 2), None),
    ("12345678901.00", DecimalType(12, 2), None), ("7", ShortType(), 7), ("70000", ShortType(), None),
    ("x", IntegerType(), None), ("AP8=", BinaryType(), bytearray(b"\x00\xff")), ("%%", BinaryType(), None),
    ("2026-03-29T01:30:15.123456Z", TimestampType(), datetime(2026, 3, 29, 1, 30, 15, 123456)),
    ('["a",null]', ArrayType(StringType()), ["a", None]),
    ('["1.50",null]', ArrayType(DecimalType(10, 2)), [Decimal("1.50"), None]),
    ('["1.505"]', ArrayType(DecimalType(10, 2)), [None]), ('"json text"', StringType(), '"json text"'),
]


@pytest.mark.parametrize(("text", "dtype", "value"), CASES)
def test_typed_reads_debezium_text_exactly_or_not_at_all(spark, text, dtype, value):
    from pyspark.sql import functions as F

    read = typed(F.lit(text), dtype)
    row = spark.range(1).select(read.alias("v"), unreadable(F.lit(text), read, dtype).alias("bad")).first()
    expected_bad = value is None or (isinstance(value, list) and None in value and "null" not in text)
    assert (row["v"], row["bad"]) == (value, expected_bad)


def test_as_text_reads_back_to_the_same_value(spark):
    from pyspark.sql import functions as F

    values = [(Decimal("12.50"), DecimalType(12, 2)), (datetime(2026, 3, 29, 1, 30, 15, 123456), TimestampType()),
              (bytearray(b"\x00\xff"), BinaryType()), (["a", None], ArrayType(StringType())),
              (date(2026, 1, 2), DateType())]
    for value, dtype in values:
        stored = (F.lit(value).cast(dtype) if not isinstance(value, list)
                  else F.array(*(F.lit(v).cast("string") for v in value)))
        back = spark.range(1).select(typed(as_text(stored, dtype), dtype).alias("v")).first()["v"]
        assert back == value, dtype


def test_a_plan_adds_new_columns_widens_and_refuses_incompatible_changes():
    stored = {"order_id": LongType(), "line_no": IntegerType(), "quantity": ShortType(), "unit_price": StringType()}
    columns = {**ITEMS.columns, "note": Column("note", "TEXT")}
    plan = plan_table("order_items", TableSchema(columns, ITEMS.primary_key), stored, ["dropped"],
                      ["order_id", "line_no"])
    assert plan.keys == ("order_id", "line_no")
    assert plan.added == ("product_id", "note", "dropped") and plan.widened == ("quantity",)
    assert list(plan.fields)[:4] == ["order_id", "line_no", "quantity", "unit_price"], "stored columns keep their order"
    assert plan.fields["dropped"] == StringType()
    assert plan.refused == {"unit_price": "order_items.unit_price: the warehouse column is string but the change has "
                                          "decimal(12,2) (PostgreSQL NUMERIC), an incompatible type change"}
    fresh = plan_table("products", PRODUCTS, None, [], [], excluded=["description"])
    assert fresh.added == () and "description" not in fresh.fields, "excluded columns never reach Kafka"


def test_merge_source_types_every_column_and_carries_the_keep_map(spark):
    plan = plan_table("products", PRODUCTS, None, [], [])
    rows = [change((2, 1), after={"id": "1", "name": "n", "price": "9.99"}, unavailable=("description",),
                   filled={"tags": (1, 5)}),
            change((3, 0), op="d", key=2)]
    source = {r["id"]: r.asDict(recursive=True) for r in merge_source(frame(spark, rows), plan).collect()}
    assert source[1]["price"] == Decimal("9.99") and source[1]["description"] is None and source[1]["_op"] == "u"
    assert source[1]["_keep"] == {"description": {"major": 0, "minor": 0}, "tags": {"major": 1, "minor": 5}}
    assert (source[1]["tl_version_major"], source[1]["tl_version_minor"]) == (2, 1)
    assert source[2]["_op"] == "d" and source[2]["name"] is None, "a delete has its key only"
    assert source[1]["_tomb_major"] is None


def test_rejected_changes_carry_the_reason_and_are_left_out_of_the_source(spark):
    plan = plan_table("products", PRODUCTS, None, [], [])
    rows = [change((1, 1), after={"id": "1", "price": "1.234"}, offset=7),
            change((1, 2), key={"sku": "x"}, after={"sku": "x"}, offset=8),
            change((1, 3), key=3, after={"id": "3", "price": "1.00"})]
    found = {r["origin"]["offset"]: r["error"] for r in rejected(frame(spark, rows), plan).collect()}
    assert found == {7: "products.price: cannot store 1.234 as decimal(12,2)",
                     8: "products: primary key (sku) is not the table's (id)"}
    assert [r["id"] for r in merge_source(frame(spark, rows), plan).collect()] == [3]


def test_a_row_id_names_its_typed_key_and_a_row_image_is_its_data_as_text(spark):
    from pyspark.sql import functions as F

    items = plan_table("order_items", ITEMS, None, [], [])
    row = spark.range(1).select(*key_of_row_id(F.lit("[12,3]"), items)).first()
    assert (row["order_id"], row["line_no"]) == (12, 3)
    plan = plan_table("products", PRODUCTS, None, [], [])
    stored = merge_source(frame(spark, [change((1, 1), after={"id": "1", "description": "long", "price": "2.50",
                                                                "tags": '["a"]'})]), plan)
    found = stored.select(image(plan).alias("i")).first()["i"]
    assert found["description"] == "long" and found["price"] == "2.50" and found["tags"] == '["a"]'
    assert "id" not in found and found["sku"] is None


def test_with_images_fills_only_a_moved_creates_unavailable_columns(spark):
    create = change((2, 1), op="c", key=100, after={"id": "100", "name": "moved"}, unavailable=("description",),
                    old_row_id="1")
    other = change((2, 2), key=5, after={"id": "5", "name": "x"}, unavailable=("description",))
    images = spark.createDataFrame([("1", {"description": "long", "name": "old"})],
                                   "_old string, _image map<string,string>")
    found = {r["row_id"]: r for r in with_images(frame(spark, [create, other]), images).collect()}
    assert found["100"]["after"] == {"id": "100", "name": "moved", "description": "long"}
    assert found["100"]["unavailable"] == []
    assert found["5"]["unavailable"] == ["description"] and "description" not in found["5"]["after"]


def test_a_moved_rows_history_takes_the_old_keys_newest_version_below_the_move(spark):
    """Deleted, re-inserted and moved in one batch: the re-insert's description, not the stored one's."""
    plan = plan_table("products", PRODUCTS, None, [], [])
    stored = as_versions(merge_source(frame(spark, [change((1, 0), key=1, after={"id": "1", "description": "first"})]),
                                      plan), plan)
    batch = [change((2, 0), op="d", key=1), change((3, 0), op="c", key=1, after={"id": "1", "description": "second"}),
             change((4, 0), op="d", key=1, moved=True),
             change((4, 0), op="c", key=9, after={"id": "9", "name": "n"}, unavailable=("description",),
                    old_row_id="1")]
    images = {r["_old"]: r["_image"] for r in moved_images(stored, frame(spark, batch), plan).collect()}
    assert images["1"]["description"] == "second"
    from_history = {r["_old"]: r["_image"] for r in moved_images(stored, frame(spark, batch[3:]), plan).collect()}
    assert from_history["1"]["description"] == "first", "nothing of the old key in the batch: the stored version"
    deleted = moved_images(stored, frame(spark, [batch[0], batch[3]]), plan).collect()
    assert deleted == [], "a delete just before the move leaves nothing to take"


def test_window_assignment_in_sql_matches_the_pure_rule(spark):
    moments = [datetime(2026, 5, 1, 12, 3, 20, tzinfo=UTC), datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)]
    specs = [WindowSpec(size_seconds=60), WindowSpec(size_seconds=300, slide_seconds=60)]
    rows = spark.createDataFrame([(m,) for m in moments], "_time timestamp")
    found = {(r["_time"].replace(tzinfo=UTC), r["window_size_seconds"], r["window_start"].replace(tzinfo=UTC))
             for r in in_windows(rows, specs).select("_time", "window_size_seconds", "window_start").collect()}
    expected = {(m, s.size_seconds, start) for m in moments for s in specs for start in window_starts(m, s)}
    assert found == expected

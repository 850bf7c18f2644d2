"""The comparison behind `tide verify`: canonical values agree across stores, buckets find every
kind of divergence, and the doc id of a PostgreSQL row is the one the sinks write."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.verify.canonical import Canonicaliser, Column, TableShape, canonicaliser, row_doc_id
from services.verify.readers import decode_hash, numeric_scale
from services.verify.reconcile import Tally, bucket_count, compare_bucket, reconcile_pairs
from spark_jobs.changes.envelope import row_id
from tests.demo_catalogue import demo_catalogue
from tests.unit.spark_frames import change, frame
from tests.unit.test_redis_encoding import resp_arguments


def doc_id(key: dict) -> str:
    return row_id(list(key.values()))

PRODUCTS = TableShape(
    "public",
    "products",
    (
        Column("id", "int8"),
        Column("sku", "text"),
        Column("price", "numeric", scale=2),
        Column("tags", "text", array=True),
        Column("attributes", "jsonb"),
        Column("updated_at", "timestamptz"),
    ),
    ("id",),
)
# Key columns deliberately not first and not in table order: the id follows the key's order.
LINES = TableShape(
    "public",
    "order_items",
    (Column("quantity", "int4"), Column("line_no", "int4"), Column("order_id", "int8")),
    ("order_id", "line_no"),
)

PG_ROW = {  # as psycopg returns it
    "id": 7,
    "sku": "SKU-7",
    "price": Decimal("12.50"),
    "tags": ["a", "b"],
    "attributes": {"size": "L", "dims": {"w": 2, "h": 1}},
    "updated_at": datetime(2024, 5, 1, 12, 30, 0, 120000, tzinfo=timezone(timedelta(hours=2))),
}


# PG_ROW as Debezium's schemaless record carries it (decimal string mode, isostring times, jsonb as text).
RECORDED = {"id": "7", "sku": "SKU-7", "price": "12.50", "tags": '["a","b"]',
            "attributes": '{"dims": {"h": 1, "w": 2}, "size": "L"}', "updated_at": "2024-05-01T10:30:00.12Z"}


def canon(column: Column, value):
    return canonicaliser(column)(value)


# ---- canonical values


@pytest.mark.parametrize(
    ("column", "a", "b"),
    [
        (Column("p", "numeric", scale=2), Decimal("12.50"), "12.50"),
        (Column("p", "numeric", scale=2), Decimal("12.50"), "12.5"),  # same value at the declared scale
        (Column("p", "numeric", scale=2), Decimal("12.50"), Decimal("12.500000000000000000")),
        (Column("p", "numeric"), Decimal("0.0000001"), "1E-7"),
        (Column("p", "numeric", scale=-2), Decimal("1200"), "1.2E+3"),
        (Column("t", "timestamptz"), datetime(2024, 1, 1, 12, tzinfo=timezone(timedelta(hours=2))),
         "2024-01-01T10:00:00Z"),
        (Column("t", "timestamptz"), datetime(2024, 1, 1, 10, 0, 0, 5, tzinfo=UTC), "2024-01-01T10:00:00.000005+00:00"),
        (Column("t", "timestamptz"), datetime(2024, 1, 1, 10, tzinfo=UTC), datetime(2024, 1, 1, 10)),  # naive = UTC
        (Column("t", "timestamp"), datetime(2024, 1, 1, 10, 0, 0, 5), "2024-01-01T10:00:00.000005"),
        (Column("d", "date"), date(2024, 2, 29), "2024-02-29"),
        (Column("j", "jsonb"), {"b": 1, "a": [1, {"y": 2, "x": None}]},
         json.loads('{"a": [1, {"x": null, "y": 2}], "b": 1}')),
        (Column("a", "text", array=True), ["x", None], ["x", None]),
        (Column("a", "numeric", array=True, scale=2), [Decimal("1.00"), None], ["1.0", None]),
        (Column("m", "int4", array=True), [[1, 2], [3, 4]], [[1, 2], [3, 4]]),
        (Column("n", "int8"), 2**62, 2**62),
        (Column("r", "float4"), 0.1, 0.10000000149011612),  # PostgreSQL's real vs Spark's widened float
        (Column("b", "bytea"), b"\x00\xff", "AP8="),
        (Column("u", "uuid"), UUID("12345678-1234-5678-1234-567812345678"), "12345678-1234-5678-1234-567812345678"),
        (Column("s", "order_status"), "paid", "paid"),
        (Column("x", "text"), None, None),
    ],
)
def test_equal_content_canonicalises_equal(column, a, b):
    assert canon(column, a) == canon(column, b)


@pytest.mark.parametrize(
    ("column", "a", "b"),
    [
        (Column("p", "numeric", scale=2), Decimal("12.50"), "12.499"),  # never rounded to look equal
        (Column("p", "numeric"), Decimal("12.50"), "12.5"),  # unconstrained: the scale PostgreSQL gives is kept
        (Column("t", "timestamptz"), datetime(2024, 1, 1, 10, tzinfo=UTC), "2024-01-01T10:00:00.000001Z"),
        (Column("j", "jsonb"), {"a": 1}, {"a": "1"}),
        (Column("a", "text", array=True), ["a", "b"], ["b", "a"]),  # array order matters
        (Column("x", "text"), None, "null"),
        (Column("x", "text"), "", None),
        (Column("f", "bool"), True, "true"),
        (Column("n", "int8"), 1, 1.5),
    ],
)
def test_different_content_canonicalises_different(column, a, b):
    assert canon(column, a) != canon(column, b)


def test_a_value_that_does_not_parse_is_a_difference_not_a_crash():
    assert canon(Column("t", "timestamptz"), "yesterday").startswith("\x00unreadable")
    assert canon(Column("p", "numeric", scale=2), "twelve").startswith("\x00unreadable")
    assert canon(Column("a", "text", array=True), "not a list").startswith("\x00unreadable")


@given(st.decimals(min_value=-(10**10), max_value=10**10, places=2, allow_nan=False, allow_infinity=False))
def test_numeric_is_exact_text_at_the_declared_scale(value):
    text = canon(Column("p", "numeric", scale=2), value)
    assert Decimal(text) == value and len(text.split(".")[1]) == 2 and "E" not in text


def test_canonical_row_keeps_source_columns_only_and_reads_absent_ones_as_null():
    sink_doc = {**PG_ROW, "tl_version_major": 5, "tl_commit_ts": "x", "nested_children": []}
    del sink_doc["tags"]
    canon = Canonicaliser(PRODUCTS)
    row = canon.row(sink_doc)
    assert set(row) == set(PRODUCTS.column_names)
    # ADD COLUMN emits no change events: a row written before it has no field, and PostgreSQL reads NULL.
    assert row["tags"] is None
    assert canon.digest(sink_doc) == canon.digest({**PG_ROW, "tags": None})
    # An absent column still differs from a real value (e.g. a TOASTed value a rebuild could not know).
    assert canon.digest(sink_doc) != canon.digest(PG_ROW)


# ---- the sinks' own encodings hash like the PostgreSQL row


def test_elasticsearch_document_hashes_like_the_source_row(spark):
    from spark_jobs.sinks.elasticsearch._documents import documents

    tables = {"products": "products"}
    batch = documents(frame(spark, [change((5, 9), key=7, after=RECORDED)]), demo_catalogue(), ["products"], tables,
                      tables, {})
    source = json.loads(batch.collect()[0]["doc"])  # what the sink sends
    canonical = Canonicaliser(PRODUCTS)
    assert canonical.digest(source) == canonical.digest(PG_ROW)
    assert canonical.digest({**source, "price": "12.51"}) != canonical.digest(PG_ROW)


def test_redis_hash_hashes_like_the_source_row(spark):
    from spark_jobs.sinks.redis._commands import commands

    args = resp_arguments(commands(frame(spark, [change((5, 9), key=7, after=RECORDED)]), "").collect()[0]["args"])
    # what the script stores: the after image's columns but NULL ones
    fields = {name.encode(): value.encode() for name, value in json.loads(args[14]).items() if value is not None}
    canonical = Canonicaliser(PRODUCTS)
    assert canonical.digest(decode_hash(fields, PRODUCTS)) == canonical.digest(PG_ROW)
    fields[b"attributes"] = b'{"size": "M"}'
    assert canonical.digest(decode_hash(fields, PRODUCTS)) != canonical.digest(PG_ROW)


def test_a_redis_field_that_is_not_json_is_kept_so_the_row_differs():
    row = decode_hash({b"tags": b"{broken", b"sku": b"x"}, PRODUCTS)
    assert row["tags"].startswith("\x00not json") and row["sku"] == "x" and row["price"] is None


def test_debeziums_iso_text_and_the_source_agree_for_timestamps_without_fraction():
    column = Column("t", "timestamptz")
    moment = datetime(2024, 1, 1, 10, tzinfo=UTC)
    assert canon(column, "2024-01-01T10:00:00Z") == canon(column, moment) == "2024-01-01T10:00:00.000000+00:00"


# ---- doc ids


def test_doc_id_of_a_source_row_is_the_sinks_id():
    assert row_doc_id(PRODUCTS, PG_ROW) == doc_id({"id": 7}) == "7"


def test_composite_doc_id_follows_key_order_not_column_order():
    row = {"quantity": 3, "line_no": 2, "order_id": 41}
    # Debezium sends the key in primary-key order; the sinks hash that dict.
    assert row_doc_id(LINES, row) == doc_id({"order_id": 41, "line_no": 2}) == "[41,2]"


def test_numeric_and_uuid_keys_use_debeziums_key_encoding():
    shape = TableShape("public", "t", (Column("k", "numeric", scale=2), Column("u", "uuid")), ("k", "u"))
    uid = UUID("12345678-1234-5678-1234-567812345678")
    assert row_doc_id(shape, {"k": Decimal("1.50"), "u": uid}) == doc_id({"k": "1.50", "u": str(uid)})


def test_long_keys_are_hashed_like_the_sinks():
    shape = TableShape("public", "t", (Column("k", "text"),), ("k",))
    assert row_doc_id(shape, {"k": "x" * 2000}) == doc_id({"k": "x" * 2000})
    assert row_doc_id(shape, {"k": "x" * 2000}).startswith("sha256:")


def test_numeric_scale_from_typmod():
    assert numeric_scale(-1) is None
    assert numeric_scale(((12 << 16) | 2) + 4) == 2
    assert numeric_scale(((5 << 16) | (-2 & 0x7FF)) + 4) == -2  # PostgreSQL 15's negative scale


# ---- buckets


def test_bucket_comparison_finds_each_kind():
    tally = Tally(limit=10)
    source = [("1", "h1"), ("2", "h2"), ("3", "h3")]
    sink = [("1", "h1"), ("2", "hX"), ("4", "h4"), ("1", "h1")]
    compare_bucket(source, sink, tally)
    assert tally.counts == {"missing": 1, "extra": 1, "different": 1, "duplicate": 1, "interval": 0}
    assert tally.examples == {"missing": ["3"], "extra": ["4"], "different": ["2"], "duplicate": ["1"], "interval": []}


def test_a_repeated_id_from_a_keyed_store_is_a_scan_artefact():
    tally = Tally()
    compare_bucket([("1", "h1")], [("1", "h1"), ("1", "h1")], tally, unique_ids=True)
    assert tally.clean


@pytest.mark.parametrize("buckets", [1, 7, 64])
def test_spilled_reconciliation_is_independent_of_bucket_count(tmp_path: Path, buckets: int):
    source = [(str(n), f"h{n}") for n in range(2000)]
    sink = [(str(n), f"h{n}" if n % 100 else "changed") for n in range(10, 2005)]
    sink.append(("tab\tand\nnewline", "h"))  # ids are quoted in the spill files
    tally = reconcile_pairs(iter(source), iter(sink), tmp_path, buckets=buckets, examples=3)
    assert tally.counts == {"missing": 10, "extra": 6, "different": 19, "duplicate": 0, "interval": 0}
    assert len(tally.examples["missing"]) == 3
    divergences = tally.divergences("products", "cache")
    assert [d.kind for d in divergences] == ["missing", "extra", "different"]
    assert not list(tmp_path.iterdir()), "spill files are removed"


def test_clean_sides_report_nothing(tmp_path: Path):
    pairs = [(str(n), "h") for n in range(100)]
    tally = reconcile_pairs(iter(pairs), reversed(pairs), tmp_path, buckets=4)
    assert tally.clean and tally.divergences("t", "search") == []


def test_bucket_count_bounds_rows_per_bucket():
    assert bucket_count(0) == 1
    assert bucket_count(1_000_000) == 20
    assert bucket_count(10**10) == 256

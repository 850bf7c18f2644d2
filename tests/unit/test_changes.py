"""Decoding real Debezium 3.7 records (captured from the stack into fixtures/) into typed changes."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest

from spark_jobs.changes import UNAVAILABLE, ColumnType, DecodeError, decode

RECORDS = {r["name"]: r for r in json.loads((Path(__file__).parent / "fixtures" / "debezium_records.json").read_text())}


def _decode(name: str):
    record = RECORDS[name]
    return decode(
        record["topic"],
        record["key"].encode() if record["key"] else None,
        record["value"].encode() if record["value"] else None,
    )


def test_insert_has_exact_decimals_structured_json_arrays_and_zoned_timestamps():
    change = _decode("products_insert")
    assert (change.table, change.op, change.key) == ("products", "c", {"id": 1})
    after = change.after
    assert after["price"] == Decimal("12.50") and isinstance(after["price"], Decimal)
    assert after["tags"] == ["kitchen", "blue"]
    assert after["attributes"] == {"color": "blue", "dims": {"h": 10}}
    assert isinstance(after["updated_at"], datetime) and after["updated_at"].utcoffset() is not None
    assert change.unavailable == frozenset()
    assert change.columns["price"] == ColumnType("NUMERIC", 12, 2)
    assert change.columns["tags"].is_array and change.columns["attributes"].name == "JSONB"


def test_unchanged_toast_column_is_named_and_never_left_as_the_placeholder():
    change = _decode("products_update_unchanged_toast")
    assert change.op == "u"
    assert change.unavailable == frozenset({"description"})
    assert "description" not in change.after
    assert UNAVAILABLE not in json.dumps(change.after, default=str)
    assert change.after["price"] == Decimal("6.00")


def test_snapshot_record_sorts_before_every_streamed_change():
    snapshot = _decode("customers_snapshot")
    streamed = [_decode(name) for name in ("orders_update", "order_items_delete", "products_insert")]
    assert snapshot.op == "r" and snapshot.snapshot in ("true", "first", "last")
    assert snapshot.sequence[0] == 0
    assert all(snapshot.sequence < change.sequence for change in streamed)


def test_enum_arrives_as_its_label():
    assert _decode("orders_update").after["status"] == "paid"


def test_delete_has_the_key_and_before_image_and_its_tombstone_decodes_to_none():
    change = _decode("order_items_delete")
    assert change.op == "d" and change.is_delete
    assert change.key == {"order_id": 1, "line_no": 1}
    assert change.after is None
    assert _decode("order_items_tombstone") is None


def test_truncate_is_a_table_level_change_with_a_commit_ordered_sequence():
    change = _decode("order_items_truncate")
    assert (change.table, change.op, change.key, change.after) == ("order_items", "t", {}, None)
    assert change.sequence[0] > 0 and change.commit_ts_ms > 0


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{not json", "value is not JSON"),
        (b'{"payload": 3}', "no Debezium payload"),
        (b'{"payload": {"op": "x", "source": {"table": "t"}}}', "unknown op 'x'"),
        (b'{"payload": {"op": "c", "source": {}}}', "no source.table"),
        (b'{"payload": {"op": "c", "source": {"table": "t"}, "after": null}}', "without an after image"),
    ],
)
def test_malformed_records_raise_with_a_reason(value, reason):
    with pytest.raises(DecodeError, match=reason):
        decode("tideline.public.t", b'{"id": 1}', value)


def test_a_value_that_does_not_fit_its_declared_type_is_a_decode_error():
    record = json.loads(RECORDS["products_insert"]["value"])
    record["payload"]["after"]["price"] = "twelve"
    with pytest.raises(DecodeError, match="column price"):
        decode("tideline.public.products", b'{"id": 1}', json.dumps(record).encode())


@pytest.mark.parametrize(
    ("column", "schema", "value"),
    [
        ("at_local", {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}, 9223372036825200000),
        ("born", {"type": "int32", "name": "io.debezium.time.Date"}, 2147483647),
        ("at_tz", {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, "infinity"),
    ],
)
def test_a_date_or_time_out_of_pythons_range_is_a_decode_error_not_a_crash(column, schema, value):
    """PostgreSQL's infinity (and years past 9999) cannot be a Python date: dead-lettered with the reason."""
    record = json.loads(RECORDS["products_insert"]["value"])
    after_schema = next(f for f in record["schema"]["fields"] if f["field"] == "after")
    after_schema["fields"].append({**schema, "optional": True, "field": column})
    record["payload"]["after"][column] = value
    with pytest.raises(DecodeError, match=f"column {column}: cannot convert"):
        decode("tideline.public.products", b'{"id": 1}', json.dumps(record).encode())

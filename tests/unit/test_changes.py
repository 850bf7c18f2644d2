"""Decoding real Debezium 3.7 records in Python (the inspection tools' decoder): the connector's
schemaless records (fixtures/debezium_records.json) and an older topic's records with Connect's
schema (fixtures/debezium_records_with_schema.json), captured from the stack."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest

from spark_jobs.changes import ColumnType, DecodeError, decode
from spark_jobs.changes.envelope import UNAVAILABLE, row_id, version

FIXTURES = Path(__file__).parent / "fixtures"
RECORDS = {r["name"]: r for r in json.loads((FIXTURES / "debezium_records.json").read_text())}
WITH_SCHEMA = {r["name"]: r for r in json.loads((FIXTURES / "debezium_records_with_schema.json").read_text())}


def _decode(name: str, records: dict = RECORDS):
    record = records[name]
    return decode(record["topic"], record["key"].encode() if record["key"] else None,
                  record["value"].encode() if record["value"] else None)


def test_a_schemaless_insert_keeps_the_values_json_gives():
    change = _decode("products_insert")
    assert (change.table, change.op) == ("products", "c")
    after = change.after
    assert after["price"] == "12.50", "NUMERIC arrives as exact text (decimal.handling.mode=string)"
    assert after["tags"] == ["kitchen", "blue"]
    assert json.loads(after["attributes"]) == {"color": "blue", "dims": {"h": 10}}
    assert datetime.fromisoformat(after["updated_at"]).utcoffset() is not None  # time.precision.mode=isostring
    assert change.unavailable == frozenset() and change.columns == {}


def test_an_older_topics_record_with_its_schema_is_typed_from_the_schema():
    change = _decode("products_insert", WITH_SCHEMA)
    after = change.after
    assert after["price"] == Decimal("12.50") and isinstance(after["price"], Decimal)
    assert after["attributes"] == {"color": "blue", "dims": {"h": 10}}
    assert isinstance(after["updated_at"], datetime)
    assert change.columns["price"] == ColumnType("NUMERIC", 12, 2)


@pytest.mark.parametrize("records", [RECORDS, WITH_SCHEMA], ids=["schemaless", "with schema"])
def test_unchanged_toast_column_is_named_and_never_left_as_the_placeholder(records):
    change = _decode("products_update_unchanged_toast", records)
    assert change.op == "u"
    assert change.unavailable == frozenset({"description"})
    assert "description" not in change.after
    assert UNAVAILABLE not in json.dumps(change.after, default=str)


@pytest.mark.parametrize("records", [RECORDS, WITH_SCHEMA], ids=["schemaless", "with schema"])
def test_snapshot_record_sorts_before_every_streamed_change(records):
    snapshot = _decode("customers_snapshot", records)
    streamed = [_decode(name, records) for name in ("orders_update", "order_items_delete", "products_insert")]
    assert snapshot.op == "r" and snapshot.sequence[0] == 0
    assert all(snapshot.sequence < change.sequence for change in streamed)


def _without_previous_commit(name: str, lsn: int):
    """A streamed record as Debezium sends it for the first transaction after its snapshot."""
    record = RECORDS[name]
    value = json.loads(record["value"])
    value["source"].update(sequence=json.dumps([None, str(lsn)]), lsn=lsn)
    return decode(record["topic"], record["key"].encode(), json.dumps(value).encode())


def test_first_transaction_after_the_snapshot_outranks_it_even_when_it_began_below_the_snapshot_point():
    # The chaos smoke run found this: a transaction begun before the slot was consistent and committed
    # after it is streamed with no previous commit and a WAL position below the snapshot's.
    snapshot = _decode("customers_snapshot")
    first = _without_previous_commit("orders_update", snapshot.sequence[1] - 1000)
    second_transaction = _decode("orders_update")
    assert snapshot.sequence < first.sequence < second_transaction.sequence


def test_the_version_rule():
    assert version(None, 42, "true") == (0, 42)
    assert version('["100","200"]', 200, "false") == (100, 200)
    assert version("[null,\"200\"]", 200, "false") == (200, 200)  # first streamed transaction
    assert version("[null,\"200\"]", 200, "true") == (0, 200)  # a snapshot record
    with pytest.raises(ValueError, match="two-element"):
        version('["1"]', 1, "false")


def test_enum_arrives_as_its_label():
    assert _decode("orders_update").after["status"] == "paid"


def test_delete_has_the_key_and_its_tombstone_decodes_to_none():
    change = _decode("order_items_delete")
    assert change.op == "d" and change.is_delete and change.after is None
    assert list(change.key) == ["order_id", "line_no"]
    assert _decode("order_items_tombstone") is None


def test_truncate_is_a_table_level_change_with_a_commit_ordered_sequence():
    change = _decode("order_items_truncate")
    assert (change.table, change.op, change.key, change.after) == ("order_items", "t", {}, None)
    assert change.sequence[0] > 0 and change.commit_ts_ms > 0


def test_row_ids_are_the_key_value_or_a_json_list():
    assert row_id([5]) == "5"
    assert row_id(["ab"]) == "ab"
    assert row_id([1, 2]) == "[1,2]"
    assert row_id(["é", 3]) == '["é",3]'
    assert row_id(["x" * 600]).startswith("sha256:")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{not json", "value is not JSON"),
        (b"3", "not a Debezium change event"),
        (b'{"op": "x", "source": {"table": "t"}}', "unknown op 'x'"),
        (b'{"op": "c", "source": {}}', "no source.table"),
        (b'{"op": "c", "source": {"table": "t"}, "after": null}', "without an after image"),
        (b'{"schema": {}, "payload": {"op": "c", "source": {"table": "t"}, "after": null}}', "without an after image"),
    ],
)
def test_malformed_records_raise_with_a_reason(value, reason):
    with pytest.raises(DecodeError, match=reason):
        decode("tideline.public.t", b'{"id": 1}', value)


def test_a_value_that_does_not_fit_its_declared_type_is_a_decode_error_in_a_record_with_a_schema():
    record = json.loads(WITH_SCHEMA["products_insert"]["value"])
    record["payload"]["after"]["price"] = "twelve"
    with pytest.raises(DecodeError, match="column price"):
        decode("tideline.public.products", b'{"id": 1}', json.dumps(record).encode())

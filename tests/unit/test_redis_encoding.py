"""The cache sink's pure parts: the stored text and how readers type it again, key names, and the
script arguments Spark SQL builds per change (parsed back from their wire format). No Redis."""

from __future__ import annotations

import json
import pickle

import pytest

from spark_jobs.model import config
from spark_jobs.sinks.base import VERSION_MAJOR
from spark_jobs.sinks.redis import (
    RedisSink,
    columns_key,
    decode_row,
    glob_escape,
    row_key,
    tombstone_key,
    typed_value,
    watermark_key,
)
from spark_jobs.sinks.redis._commands import commands, writer_rows
from spark_jobs.sinks.redis._scripts import MAX_EXACT_VERSION, ROW_ARGS
from tests.unit.spark_frames import change, frame


def resp_arguments(blob: bytes) -> list[str]:
    """RESP bulk strings ($<length>\\r\\n<bytes>\\r\\n ...) back to their texts."""
    found, at = [], 0
    while at < len(blob):
        assert blob[at:at + 1] == b"$", blob[at:at + 20]
        end = blob.index(b"\r\n", at)
        length = int(blob[at + 1:end])
        found.append(blob[end + 2:end + 2 + length].decode())
        assert blob[end + 2 + length:end + 4 + length] == b"\r\n"
        at = end + 4 + length
    return found


def test_key_names():
    assert row_key("orders", "7", "p:") == "p:orders:7"
    assert tombstone_key("orders", "7") == "tideline:tombstone:orders:7"
    assert watermark_key("orders") == "tideline:truncated:orders"
    assert columns_key("orders", "p:") == "p:tideline:columns:orders"
    assert glob_escape("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"


@pytest.mark.parametrize(
    ("text", "type_name", "value"),
    [
        ("42", "INT8", 42), ("1.5", "FLOAT8", 1.5), ("NaN", "FLOAT8", "NaN"), ("true", "BOOL", True),
        ("false", "BOOL", False), ("12.50", "NUMERIC", "12.50"), ('["a","b"]', "_TEXT", ["a", "b"]),
        ('{"x": [1]}', "JSONB", {"x": [1]}),
        ("2024-01-01T10:00:00.123456Z", "TIMESTAMPTZ", "2024-01-01T10:00:00.123456Z"),
        ("paid", "ORDER_STATUS", "paid"), ("text", None, "text"),
    ],
)
def test_stored_text_is_typed_again_by_the_column_type(text, type_name, value):
    assert typed_value(text, type_name) == value


def test_a_stored_hash_reads_back_as_a_typed_row_with_absent_fields_as_null():
    fields = {b"id": b"1", b"price": b"12.50", b"tags": b'["a"]', VERSION_MAJOR.encode(): b"5"}
    row = decode_row(fields, {"id": "INT8", "price": "NUMERIC", "tags": "_TEXT", "sku": "TEXT"})
    assert row == {"id": 1, "price": "12.50", "tags": ["a"], "sku": None, VERSION_MAJOR: "5"}


def test_the_sink_pickles_with_plain_settings():
    sink = RedisSink("redis://localhost:1/0", config.load(), key_prefix="p:")
    assert pickle.loads(pickle.dumps(sink)).key_prefix == "p:"


def _commands(spark, rows):
    return {r["origin"]["offset"]: r.asDict(recursive=True) for r in commands(frame(spark, rows), "p:").collect()}


def test_an_upsert_is_its_keys_version_commit_time_and_after_image_as_json(spark):
    row = _commands(spark, [change((5, 7), key=3, after={"id": "3", "name": "Ada", "sku": None})])[0]
    args = resp_arguments(row["args"])
    assert row["arg_count"] == len(args) == 1 + ROW_ARGS and args[0] == str(ROW_ARGS)
    assert args[1:14] == ["p:products:3", "p:tideline:tombstone:products:3", "p:tideline:truncated:products", "", "",
                          "u", "5", "7", "products", "3", "0", "2024-01-01T00:00:00.000Z", "{}"]
    assert json.loads(args[14]) == {"id": "3", "name": "Ada", "sku": None}, "the script leaves NULL out of the hash"


def test_unavailable_and_filled_columns_are_sent_with_the_version_the_stored_row_must_reach(spark):
    partial = change((6, 0), key=1, after={"id": "1", "name": "b"}, unavailable=("description",))
    partial["filled"] = {"attributes": {"major": 5, "minor": 1}}
    args = resp_arguments(_commands(spark, [partial])[0]["args"])
    assert args[11] == "2"
    assert json.loads(args[13]) == {"description": {"major": 0, "minor": 0}, "attributes": {"major": 5, "minor": 1}}


def test_deletes_name_the_move_and_creates_the_old_key(spark):
    rows = _commands(spark, [
        {**change((5, 1), op="d", key=7), "moved": True},
        change((5, 2), op="c", key=8, old_row_id="7", offset=1),
        change((5, 3), op="d", key=9, offset=2),
    ])
    moved, created, deleted = (resp_arguments(rows[i]["args"]) for i in range(3))
    assert moved[6] == "m" and deleted[6] == "d" and len(deleted) == 1 + ROW_ARGS and deleted[13:] == ["", ""]
    assert created[4:6] == ["p:products:7", "p:tideline:tombstone:products:7"]


def test_truncates_pass_through_and_bad_rows_carry_their_reason(spark):
    rows = _commands(spark, [
        change((5, 1), op="t"),
        change((5, 2), key=2, after={"id": "2", "tl_x": "1"}, offset=1),
        change((MAX_EXACT_VERSION, 0), key=3, offset=2),
    ])
    assert rows[0]["op"] == "t" and rows[0]["args"] is None and rows[0]["error"] is None
    assert "clashes with the sink's metadata prefix" in rows[1]["error"]
    assert "cannot be compared exactly in Lua" in rows[2]["error"]


def _writer_rows(spark, rows):
    return {r["origin"]["offset"]: r.asDict(recursive=True)
            for r in writer_rows(frame(spark, rows), "p[1]:", "cache").collect()}


def test_the_jvm_writer_gets_the_same_arguments_the_shipper_sends_as_a_list(spark):
    rows = [change((5, 7), key=3, after={"id": "3", "name": "Ada"}, unavailable=("description",)),
            change((5, 8), op="d", key=4, offset=1)]
    shipped = {r["origin"]["offset"]: resp_arguments(r["args"])
               for r in commands(frame(spark, rows), "p[1]:").collect()}
    for offset, row in _writer_rows(spark, rows).items():
        assert row["kind"] == "row" and row["letter"] is None and row["watermark"] is None
        assert row["args"] == shipped[offset]


def test_the_jvm_writer_gets_truncates_with_their_keys_and_escaped_patterns(spark):
    (row,) = _writer_rows(spark, [change((5, 1), op="t", table="odd*table")]).values()
    assert row["kind"] == "truncate" and row["args"] is None
    assert row["watermark"] == watermark_key("odd*table", "p[1]:") and (row["major"], row["minor"]) == (5, 1)
    assert row["row_prefix"] == row_key("odd*table", "", "p[1]:")
    assert row["row_pattern"] == glob_escape(row_key("odd*table", "", "p[1]:")) + "*"
    assert row["tombstone_pattern"] == glob_escape(tombstone_key("odd*table", "", "p[1]:")) + "*"


def test_the_jvm_writer_gets_undecoded_and_refused_changes_as_ready_dead_letters(spark):
    undecoded = {**change((5, 1)), "error": "value is not JSON", "letter_value": b"{nope"}
    rows = _writer_rows(spark, [undecoded, change((5, 2), key=2, after={"id": "2", "tl_x": "1"}, offset=1)])
    letters = {offset: json.loads(bytes(row["letter"])) for offset, row in rows.items()}
    assert all(row["kind"] == "letter" and row["args"] is None for row in rows.values())
    assert letters[0]["stage"] == "decode:cache" and letters[0]["reason"] == "value is not JSON"
    assert letters[0]["value"] == "{nope" and letters[0]["offset"] == 0
    assert letters[1]["stage"] == "apply:cache" and "clashes with the sink's metadata prefix" in letters[1]["reason"]

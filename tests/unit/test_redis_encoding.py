"""The Redis sink's pure parts: value encoding, key names, version arguments. No network."""

from __future__ import annotations

import pickle
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from spark_jobs import config
from spark_jobs.changes import Change
from spark_jobs.config import CacheView, PipelineConfig, TableConfig, WarehouseView
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.redis import (
    MAX_EXACT_VERSION,
    RedisSink,
    decode_row,
    encode_value,
    glob_escape,
    row_fields,
    row_key,
    tombstone_key,
    version_args,
    watermark_key,
)


def change(seq=(5, 7), after=None, commit_ts_ms=1_700_000_000_123):
    return Change(
        table="products", op="u", key={"id": 1}, before=None, after={"id": 1} if after is None else after,
        sequence=seq, lsn=None, tx_id=None, commit_ts_ms=commit_ts_ms, snapshot=None,
    )


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (Decimal("12.50"), '"12.50"'),  # a JSON string keeps the scale and every digit
        (Decimal("12345678901234567890.000000001"), '"12345678901234567890.000000001"'),
        (datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC), '"2026-01-02T03:04:05.006000+00:00"'),
        (datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2))), '"2026-01-02T03:04:05+02:00"'),
        (date(2026, 1, 2), '"2026-01-02"'),
        ({"color": "blue", "dims": {"h": 10}}, '{"color":"blue","dims":{"h":10}}'),
        (["kitchen", None, "blue"], '["kitchen",null,"blue"]'),
        (None, "null"),
        (42, "42"),
        (True, "true"),
        ("Ada «é»", '"Ada «é»"'),
        (b"\x00\xff", '"AP8="'),
    ],
)
def test_values_are_json_text(value, encoded):
    assert encode_value(value) == encoded


def test_values_json_cannot_carry_are_refused():
    with pytest.raises(ValueError):
        encode_value(float("nan"))
    with pytest.raises(TypeError):
        encode_value(object())


def test_a_stored_hash_decodes_back_to_values():
    fields = row_fields(change(after={"id": 1, "price": Decimal("3.10"), "tags": ["a"], "meta": {"k": [1]}}))
    stored = {name.encode(): value.encode() for name, value in zip(fields[0::2], fields[1::2])}
    assert decode_row(stored) == {
        "id": 1, "price": "3.10", "tags": ["a"], "meta": {"k": [1]},
        VERSION_MAJOR: 5, VERSION_MINOR: 7, COMMIT_TS: "2023-11-14T22:13:20.123+00:00",
    }


def test_metadata_fields_are_decimal_strings():
    fields = dict(zip(*[iter(row_fields(change(seq=(2**52, 3), commit_ts_ms=None)))] * 2))
    assert fields[VERSION_MAJOR] == str(2**52) and fields[VERSION_MINOR] == "3"
    assert fields[COMMIT_TS] == "null"


def test_a_column_named_like_metadata_is_refused():
    with pytest.raises(ValueError, match="metadata prefix"):
        row_fields(change(after={"id": 1, VERSION_MAJOR: 9}))


def test_versions_beyond_what_lua_compares_exactly_are_refused():
    assert version_args(change(seq=(MAX_EXACT_VERSION - 1, 0))) == [str(MAX_EXACT_VERSION - 1), "0"]
    with pytest.raises(ValueError, match="2\\^53"):
        version_args(change(seq=(MAX_EXACT_VERSION, 0)))


def test_key_names():
    assert row_key("customers", "42") == "customers:42"
    assert row_key("order_items", "[7,2]", prefix="t1:") == "t1:order_items:[7,2]"
    assert tombstone_key("customers", "42", "t1:") == "t1:tideline:tombstone:customers:42"
    assert watermark_key("customers", "t1:") == "t1:tideline:truncated:customers"


def test_glob_escape_makes_scan_patterns_literal():
    assert glob_escape("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"
    assert glob_escape("order_items") == "order_items"


def test_sink_pickles_and_keeps_only_tables_with_a_cache_view():
    pipeline = PipelineConfig(
        tables={"customers": TableConfig(cache=CacheView()), "audit": TableConfig(warehouse=WarehouseView())}
    )
    sink = pickle.loads(pickle.dumps(RedisSink("redis://cache:6379/0", pipeline, key_prefix="p:")))
    assert (sink.url, sink.key_prefix, sink.tables) == ("redis://cache:6379/0", "p:", frozenset({"customers"}))
    assert RedisSink("redis://x", config.load()).tables == {"customers", "products", "orders", "order_items"}


"""Pure parts of the search sink: mappings from source types, documents, and the compare-and-set plan."""

from __future__ import annotations

import json
import pickle
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from spark_jobs import config
from spark_jobs.changes import Change, ColumnType
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.elasticsearch import (
    KEYWORD_IGNORE_ABOVE,
    TOMBSTONES,
    ElasticsearchSink,
    Stored,
    below,
    document,
    field_mapping,
    infer_type,
    plan,
    properties,
    restyled,
    to_json,
    tombstone_id,
)


def change(seq, op="u", key=1, after=None, unavailable=frozenset(), columns=None):
    if after is None and op != "d":
        after = {"id": key, "name": f"v{seq}", "description": f"text {seq}"}
    return Change(
        table="products", op=op, key={"id": key}, before=None, after=after, sequence=seq, lsn=seq[1],
        tx_id=None, commit_ts_ms=1_700_000_000_123, snapshot=None, unavailable=frozenset(unavailable),
        columns=columns or {},
    )


def stored(version, source=None, seq_no=7, term=1):
    return Stored(version, {VERSION_MAJOR: version[0], VERSION_MINOR: version[1], **(source or {})}, seq_no, term)


@pytest.mark.parametrize(
    ("source_type", "mapping"),
    [
        (ColumnType("INT2"), {"type": "long"}),
        (ColumnType("INT4", 10, 0), {"type": "long"}),
        (ColumnType("INT8", 19, 0), {"type": "long"}),
        (ColumnType("NUMERIC", 12, 2), {"type": "double"}),
        (ColumnType("FLOAT8"), {"type": "double"}),
        (ColumnType("BOOL"), {"type": "boolean"}),
        (ColumnType("TIMESTAMPTZ", 35, 6), {"type": "date"}),
        (ColumnType("TIMESTAMP"), {"type": "date"}),
        (ColumnType("DATE"), {"type": "date"}),
        (ColumnType("JSONB"), {"type": "object", "dynamic": True}),
        (ColumnType("_INT8"), {"type": "long"}),
        (ColumnType("_TEXT"), {"type": "keyword", "ignore_above": KEYWORD_IGNORE_ABOVE}),
        (ColumnType("TEXT"), {"type": "keyword", "ignore_above": KEYWORD_IGNORE_ABOVE}),
        (ColumnType("BPCHAR", 2), {"type": "keyword", "ignore_above": KEYWORD_IGNORE_ABOVE}),
        (ColumnType("ORDER_STATUS"), {"type": "keyword", "ignore_above": KEYWORD_IGNORE_ABOVE}),
    ],
)
def test_each_source_type_maps_explicitly(source_type, mapping):
    assert field_mapping(source_type) == mapping


def test_full_text_columns_are_text_with_a_keyword_sub_field():
    mapping = field_mapping(ColumnType("VARCHAR", 200), full_text=True)
    assert mapping["type"] == "text" and mapping["fields"]["keyword"]["type"] == "keyword"
    assert field_mapping(ColumnType("_TEXT"), full_text=True)["type"] == "text"


def test_properties_use_source_types_and_infer_only_what_a_change_does_not_name():
    typed = change((1, 1), after={"id": 1, "name": "mug", "price": Decimal("1.00"), "extra": [date(2024, 1, 2)],
                                  "unknown": None},
                   columns={"id": ColumnType("INT8"), "name": ColumnType("TEXT"), "price": ColumnType("NUMERIC")})
    props = properties(typed, full_text=["name"])
    assert props["id"] == {"type": "long"} and props["price"] == {"type": "double"}
    assert props["name"]["type"] == "text"
    assert props["extra"] == {"type": "date"}, "inferred from the value: a list of dates"
    assert "unknown" not in props, "a typeless null gets no mapping; it stays in _source"


def test_inference_checks_bool_before_int_and_datetime_before_date():
    assert infer_type(True) == ColumnType("BOOL")
    assert infer_type(3) == ColumnType("INT8")
    assert infer_type(datetime(2024, 1, 1, tzinfo=UTC)) == ColumnType("TIMESTAMPTZ")
    assert infer_type(date(2024, 1, 1)) == ColumnType("DATE")
    assert infer_type([None, "a"]) == ColumnType("_TEXT")
    assert infer_type([]) is None


def test_document_keeps_decimals_exact_timestamps_zoned_and_carries_the_version():
    updated = datetime(2026, 11, 22, 6, 55, 32, 381955, tzinfo=UTC)
    row = {"id": 1, "price": Decimal("12.50"), "updated_at": updated, "attributes": {"dims": {"h": 10}},
           "tags": ["a", "b"], "raw": b"\x00\x01"}
    doc = document(row, change((5, 6), after=row))
    assert doc["price"] == "12.50" and doc["updated_at"] == "2026-11-22T06:55:32.381955+00:00"
    assert doc["attributes"] == {"dims": {"h": 10}} and doc["tags"] == ["a", "b"] and doc["raw"] == "AAE="
    assert (doc[VERSION_MAJOR], doc[VERSION_MINOR]) == (5, 6)
    assert doc[COMMIT_TS] == "2023-11-14T22:13:20.123+00:00"
    json.dumps(doc)  # everything is plain JSON


def test_to_json_converts_nested_values():
    assert to_json({"a": [Decimal("0.10"), None]}) == {"a": ["0.10", None]}


def test_tombstone_ids_stay_within_the_id_limit():
    assert tombstone_id("products", "[7,2]") == "products/[7,2]"
    long_id = tombstone_id("products", "x" * 512)
    assert long_id.startswith("products/sha256:") and len(long_id.encode()) <= 512


def test_plan_creates_an_absent_document_and_guards_an_existing_one_by_seq_no():
    ((header, body),) = plan(change((2, 0)), "products", "products", None, None, None)
    assert header == {"create": {"_index": "products", "_id": "1", "require_alias": True}}
    assert body[VERSION_MAJOR] == 2

    ((header, _),) = plan(change((2, 0)), "products-v2", "products", stored((1, 0), seq_no=9, term=3), None, None)
    assert header == {"index": {"_index": "products-v2", "_id": "1", "if_seq_no": 9, "if_primary_term": 3}}


def test_plan_skips_replays_and_older_changes():
    assert plan(change((2, 0)), "p", "p", stored((2, 0)), None, None) == []
    assert plan(change((1, 9)), "p", "p", stored((2, 0)), None, None) == []
    assert plan(change((3, 0)), "p", "p", None, stored((4, 0)), None) == [], "a tombstone beats it"
    assert plan(change((3, 0)), "p", "p", None, None, (3, 1)) == [], "the watermark beats it"


def test_plan_deletes_with_seq_no_and_writes_a_guarded_tombstone():
    delete = change((5, 0), op="d")
    ops = plan(delete, "p", "p", stored((4, 0), seq_no=11), stored((2, 0), seq_no=3), None)
    assert ops[0] == ({"delete": {"_index": "p", "_id": "1", "if_seq_no": 11, "if_primary_term": 1}}, None)
    header, body = ops[1]
    assert header["index"]["_index"] == TOMBSTONES and header["index"]["_id"] == "p/1"
    assert header["index"]["if_seq_no"] == 3
    assert body == {"alias": "p", "id": "1", VERSION_MAJOR: 5, VERSION_MINOR: 0}

    (only,) = plan(delete, "p", "p", None, None, None)
    assert "create" in only[0], "deleting an absent row still records its tombstone"


def test_plan_removes_a_stale_document_even_when_the_change_is_a_replay():
    # The tombstone landed but the document's delete did not (or a rebuild index missed a live delete).
    ops = plan(change((5, 0), op="d"), "p", "p", stored((4, 0), seq_no=8), stored((5, 0)), None)
    assert ops == [({"delete": {"_index": "p", "_id": "1", "if_seq_no": 8, "if_primary_term": 1}}, None)]
    ops = plan(change((2, 0)), "p", "p", stored((2, 0)), None, (3, 0))
    assert [next(iter(h)) for h, _ in ops] == ["delete"], "below the truncate watermark"


def test_plan_keeps_the_stored_value_of_unavailable_columns():
    update = change((3, 0), after={"id": 1, "name": "new"}, unavailable={"description"})
    ((_, body),) = plan(update, "p", "p", stored((2, 0), {"description": "kept", "name": "old"}), None, None)
    assert body["description"] == "kept" and body["name"] == "new"


def test_below_selects_versions_lexicographically_under_the_watermark():
    query = below((20, 5))["bool"]
    assert query["minimum_should_match"] == 1
    assert {"range": {VERSION_MAJOR: {"lt": 20}}} in query["should"]
    same_major = {"bool": {"filter": [{"term": {VERSION_MAJOR: 20}}, {"range": {VERSION_MINOR: {"lt": 5}}}]}}
    assert same_major in query["should"]


def test_a_rebuild_mapping_follows_the_current_full_text_columns():
    keyword = field_mapping(ColumnType("TEXT"))
    current = {"dynamic": "false", "properties": {"name": keyword, "sku": field_mapping(ColumnType("TEXT"), True),
                                                  "id": {"type": "long"}}}
    new = restyled(current, ["name"])
    assert new["dynamic"] == "false" and new["properties"]["id"] == {"type": "long"}
    assert new["properties"]["name"]["type"] == "text" and new["properties"]["sku"] == keyword


def test_the_sink_pickles_with_plain_settings_and_names_its_aliases():
    pipeline = config.load()
    sink = ElasticsearchSink("http://127.0.0.1:9200", pipeline, bulk_size=10, targets={"products": "products-v2"})
    copy = pickle.loads(pickle.dumps(sink))
    assert copy.url == sink.url and copy.bulk_size == 10
    assert copy.alias("products") == "products" and copy.target("products") == "products-v2"
    assert copy.target("orders") == "order_rows"  # the flat index; `orders` is the nested view's
    assert copy.aliases()[-1] == "orders"
    assert copy.alias("no_such_table") is None

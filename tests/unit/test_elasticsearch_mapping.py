"""The search sink's pure parts: mappings from the catalogue, the documents and request fragments
Spark SQL builds, and the version guard decided on Arrow columns. No Elasticsearch."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow as pa
import pytest

from spark_jobs.model import config
from spark_jobs.model.catalogue import Column
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.elasticsearch import ElasticsearchSink
from spark_jobs.sinks.elasticsearch._documents import TOMBSTONES, documents
from spark_jobs.sinks.elasticsearch._mapping import KEYWORD_IGNORE_ABOVE, field_mapping, restyled
from spark_jobs.sinks.elasticsearch._ship import _MGET, _State
from spark_jobs.sinks.elasticsearch._store import below
from tests.demo_catalogue import demo_catalogue
from tests.unit.spark_frames import change, frame

TABLES = ["customers", "products", "orders", "order_items"]
ALIASES = {table: table for table in TABLES}


@pytest.mark.parametrize(
    ("column", "mapping"),
    [
        (Column("c", "INT2"), {"type": "long"}),
        (Column("c", "INT8"), {"type": "long"}),
        (Column("c", "NUMERIC", 12, 2), {"type": "double"}),
        (Column("c", "FLOAT8"), {"type": "double"}),
        (Column("c", "BOOL"), {"type": "boolean"}),
        (Column("c", "TIMESTAMPTZ"), {"type": "date"}),
        (Column("c", "DATE"), {"type": "date"}),
        (Column("c", "JSONB"), {"type": "object", "dynamic": True}),
        (Column("c", "_INT8"), {"type": "long"}),
        (Column("c", "_TEXT"), {"type": "keyword", "ignore_above": KEYWORD_IGNORE_ABOVE}),
        (Column("c", "BPCHAR", 2), {"type": "keyword", "ignore_above": KEYWORD_IGNORE_ABOVE}),
        (Column("c", "ORDER_STATUS", values=("paid",)), {"type": "keyword", "ignore_above": KEYWORD_IGNORE_ABOVE}),
    ],
)
def test_each_source_type_maps_explicitly(column, mapping):
    assert field_mapping(column) == mapping


def test_full_text_columns_are_text_with_a_keyword_sub_field():
    mapping = field_mapping(Column("name", "TEXT"), full_text=True)
    assert mapping["type"] == "text" and mapping["fields"]["keyword"]["type"] == "keyword"


def test_a_rebuild_mapping_follows_the_current_full_text_columns():
    keyword = field_mapping(Column("c", "TEXT"))
    current = {"dynamic": "false", "properties": {"name": keyword, "sku": field_mapping(Column("c", "TEXT"), True),
                                                  "id": {"type": "long"}}}
    new = restyled(current, ["name"])
    assert new["dynamic"] == "false" and new["properties"]["id"] == {"type": "long"}
    assert new["properties"]["name"]["type"] == "text" and new["properties"]["sku"] == keyword


def test_below_selects_versions_lexicographically_under_the_watermark():
    query = json.dumps(below((5, 7)))
    assert '"lt": 5' in query and '"lt": 7' in query and '"term": {"tl_version_major": 5}' in query


def test_the_sink_pickles_with_plain_settings_and_names_its_aliases():
    sink = ElasticsearchSink("http://127.0.0.1:9200", config.load(), bulk_size=10, targets={"products": "products-v2"})
    copy = pickle.loads(pickle.dumps(sink))
    assert copy.url == sink.url and copy.bulk_size == 10
    assert copy.alias("products") == "products" and copy.target("products") == "products-v2"
    assert copy.target("orders") == "order_rows"  # the flat index; `orders` is the nested view's
    assert copy.aliases()[-1] == "orders" and copy.alias("no_such_table") is None


def shipped(spark, rows, refused=None):
    prepared = documents(frame(spark, rows), demo_catalogue(), TABLES, ALIASES, ALIASES, refused or {})
    return prepared.toArrow().to_batches()[0] if rows else None


PRODUCT = {"id": "1", "sku": "S-1", "name": 'Ada "L"', "price": "12.50", "tags": '["a","b"]',
           "attributes": '{"c": {"d": 1}}', "updated_at": "2024-01-01T10:00:00.123456Z", "description": None}


def test_a_document_has_json_types_from_the_catalogue_exact_decimals_and_the_version(spark):
    rows = shipped(spark, [change((5, 7), key=1, after=PRODUCT)]).to_pylist()
    doc = json.loads(rows[0]["doc"])
    assert doc == {"id": 1, "sku": "S-1", "name": 'Ada "L"', "price": "12.50", "tags": ["a", "b"],
                   "attributes": {"c": {"d": 1}}, "updated_at": "2024-01-01T10:00:00.123456Z", "description": None,
                   VERSION_MAJOR: 5, VERSION_MINOR: 7, COMMIT_TS: "2024-01-01T00:00:00.000Z"}
    assert rows[0]["partial"] is None and rows[0]["has_keep"] is False
    mget = json.loads("[" + rows[0]["mget_pair"][:-1] + "]")
    assert [m["_index"] for m in mget] == ["products", TOMBSTONES] and mget[1]["_id"] == "products/1"
    assert json.loads("{" + rows[0]["head"] + "}") == {"_index": "products", "_id": "1"}
    assert json.loads(rows[0]["tomb_doc"]) == {"alias": "products", "id": "1", VERSION_MAJOR: 5, VERSION_MINOR: 7}


def test_an_image_with_other_columns_than_the_catalogue_knows_gets_the_same_document_rules(spark):
    """A full image is built per table without a lambda, any other by the lambda: both give the same fields."""
    images = [PRODUCT, {**PRODUCT, "added": '{"x": 1}'}, {k: v for k, v in PRODUCT.items() if k != "description"}]
    full, added, removed = (json.loads(r["doc"]) for r in shipped(spark, [
        change((5, 7), key=1, after=after, offset=i) for i, after in enumerate(images)]).to_pylist())
    assert added == {**full, "added": '{"x": 1}'}, "a column the catalogue does not know is quoted"
    assert removed == {k: v for k, v in full.items() if k != "description"}
    assert full["tags"] == ["a", "b"] and full["attributes"] == {"c": {"d": 1}} and full["description"] is None


def test_kept_columns_leave_the_partial_document_and_json_columns_mark_it(spark):
    partial = change((6, 0), key=1, after={"id": "1", "name": "b", "attributes": "{}"}, unavailable=("description",))
    partial["filled"] = {"price": {"major": 5, "minor": 1}}
    partial["after"]["price"] = "3.00"
    row = shipped(spark, [partial]).to_pylist()[0]
    assert "price" in json.loads(row["doc"]) and "description" not in json.loads(row["doc"])
    assert set(json.loads(row["partial"])) - {VERSION_MAJOR, VERSION_MINOR, COMMIT_TS} == {"id", "name", "attributes"}
    assert row["has_keep"] and row["keeps_objects"], "an update would merge the json object field by field"
    assert row["fill_low"] == row["fill_high"] == {"major": 5, "minor": 1}


def test_long_row_ids_hash_in_the_tombstone_id_and_refused_columns_reject_the_row(spark):
    rows = shipped(spark, [change((5, 1), key="x" * 600), change((5, 2), key=2, offset=1)],
                   refused={"products": {"name": "elasticsearch mapping conflict on name: no"}}).to_pylist()
    tomb = json.loads("{" + rows[0]["tomb_head"] + "}")["_id"]
    assert tomb.startswith("products/sha256:") and len(tomb.encode()) < 512
    assert rows[1]["error"] == "elasticsearch mapping conflict on name: no"


# ---- the guard on Arrow columns --------------------------------------------------------------------


def stored(found: list, versions: list, seq: list | None = None) -> pa.StructArray:
    """mget hits as the shipper's Arrow reader gives them."""
    items = [{"found": f, "_seq_no": (seq or [7] * len(found))[i] if f else None, "_primary_term": 1 if f else None,
              "_source": {VERSION_MAJOR: v[0], VERSION_MINOR: v[1]} if f else None, "error": None}
             for i, (f, v) in enumerate(zip(found, versions, strict=True))]
    return pa.array(items, type=_MGET.field("docs").type.value_type)


def decide(rows: pa.RecordBatch, docs: pa.StructArray, tombs: pa.StructArray, marks=None) -> tuple[_State, dict]:
    version = rows.column("version")
    state = _State(rows, docs, tombs, marks or {}, (version.field(0), version.field(1)))
    lines = {}
    for group, index, _ in state.lines():
        for line, i in zip(group.to_pylist(), index, strict=True):
            lines.setdefault(int(i), []).append(json.loads(line.split("\n")[0]))
    return state, lines


def test_an_absent_document_is_created_and_a_present_older_one_replaced_guarded_by_seq_no(spark):
    rows = shipped(spark, [change((5, 1), key=1), change((5, 2), key=2, offset=1)])
    _, lines = decide(rows, stored([False, True], [(0, 0), (4, 0)], [0, 9]), stored([False, False], [(0, 0)] * 2))
    assert list(lines[0][0]) == ["create"] and lines[0][0]["create"]["require_alias"]
    assert lines[1][0]["index"]["if_seq_no"] == 9


def test_replays_and_older_changes_write_nothing(spark):
    rows = shipped(spark, [change((5, 1), key=1), change((5, 2), key=2, offset=1)])
    _, lines = decide(rows, stored([True, True], [(5, 1), (6, 0)]), stored([False, False], [(0, 0)] * 2))
    assert lines == {}


def test_a_delete_removes_the_document_and_writes_its_tombstone_guarded(spark):
    rows = shipped(spark, [change((5, 1), op="d", key=1)])
    _, lines = decide(rows, stored([True], [(4, 0)]), stored([True], [(3, 0)], [11]))
    assert [list(action) for action in lines[0]] == [["delete"], ["index"]]
    assert lines[0][1]["index"]["_index"] == TOMBSTONES and lines[0][1]["index"]["if_seq_no"] == 11


def test_a_late_older_change_neither_resurrects_a_deleted_row_nor_survives_a_watermark(spark):
    rows = shipped(spark, [change((4, 0), key=1), change((4, 0), key=2, offset=1)])
    _, lines = decide(rows, stored([False, True], [(0, 0), (3, 0)]), stored([True, False], [(5, 0), (0, 0)]),
                      {"products": (4, 5)})
    assert 0 not in lines, "below its tombstone: not created"
    assert list(lines[1][0]) == ["delete"], "a stale document below the watermark is removed"


def test_kept_columns_update_in_place_unless_json_objects_or_mixed_fills_need_the_stored_row(spark):
    plain = change((6, 0), key=1, after={"id": "1", "name": "b"}, unavailable=("description",))
    objects = change((6, 0), key=2, after={"id": "2", "attributes": "{}"}, unavailable=("description",), offset=1)
    rows = shipped(spark, [plain, objects])
    state, lines = decide(rows, stored([True, True], [(5, 0), (5, 0)]), stored([False, False], [(0, 0)] * 2))
    assert list(lines[0][0]) == ["update"] and 1 not in lines
    assert list(np.asarray(state.rare())) == [1]


def test_filled_values_are_written_only_over_a_stored_row_older_than_their_change(spark):
    filled = change((6, 0), key=1, after={"id": "1", "name": "b", "description": "old text"})
    filled["filled"] = {"description": {"major": 5, "minor": 1}}
    rows = shipped(spark, [filled, {**filled, "row_id": "2", "origin": {**filled["origin"], "offset": 1}}])
    state, _lines = decide(rows, stored([True, True], [(4, 0), (5, 5)]), stored([False, False], [(0, 0)] * 2))
    bodies = next(group.to_pylist() for group, _, _ in state.lines())
    first, second = (json.loads(body.split("\n")[1])["doc"] for body in bodies)
    assert first["description"] == "old text", "the stored row is older than the fill: the filled value is written"
    assert "description" not in second, "the stored row is at least as new: it keeps its own"

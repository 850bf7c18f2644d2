"""The apply jobs' decoder (Spark SQL) on real Debezium records: it agrees with the Python decoder
on every fixture, in both converter layouts, and turns what it cannot read into dead letters."""

from __future__ import annotations

import json

import pytest

from spark_jobs.changes import decode
from spark_jobs.changes.envelope import UNAVAILABLE, UNAVAILABLE_BYTEA, row_id
from spark_jobs.changes.stream import decode_stream
from tests.unit.test_changes import RECORDS, WITH_SCHEMA

TABLES = ["customers", "orders", "order_items", "products"]
KAFKA = ("topic string, partition int, offset bigint, key binary, value binary, "
         "headers array<struct<key: string, value: binary>>")


def kafka_rows(records: list[dict]) -> list[tuple]:
    return [(r["topic"], 0, offset, r["key"].encode() if r["key"] else None,
             r["value"].encode() if r["value"] else None,
             [(k, v.encode()) for k, v in r.get("headers", {}).items()])
            for offset, r in enumerate(records)]


def decoded(spark, records: list[dict], tables=TABLES):
    frame = spark.createDataFrame(kafka_rows(records), KAFKA)
    return [row.asDict(recursive=True) for row in decode_stream(frame, tables).orderBy("origin.offset").collect()]


@pytest.mark.parametrize("records", [RECORDS, WITH_SCHEMA], ids=["schemaless", "with schema"])
def test_both_decoders_agree_on_every_record(spark, records):
    fixtures = list(records.values())
    rows = decoded(spark, fixtures)
    python = [(r, decode(r["topic"], r["key"].encode() if r["key"] else None, r["value"].encode()))
              for r in fixtures if r["value"]]
    assert len(rows) == len(python), "a tombstone is dropped, nothing else"
    for row, (record, change) in zip(rows, python, strict=True):
        assert row["error"] is None, (record["name"], row["error"])
        assert (row["table"], row["op"]) == (change.table, change.op)
        assert (row["version"]["major"], row["version"]["minor"]) == change.sequence
        assert sorted(row["unavailable"]) == sorted(change.unavailable)
        if change.op != "t":
            assert row["row_id"] == row_id(list(change.key.values()))
            assert list(row["key"]) == list(change.key)
        if change.after is not None:
            assert set(row["after"]) == set(change.after), record["name"]
        assert row["commit_ts"] is not None


@pytest.mark.parametrize("placeholder", [UNAVAILABLE, [UNAVAILABLE], UNAVAILABLE_BYTEA],
                         ids=["text", "array", "bytea"])
def test_each_form_of_the_placeholder_alone_is_taken_out_and_named_unavailable(spark, placeholder):
    # A text column carries the placeholder itself, an array column a one-element array, bytea its base64.
    template = RECORDS["products_update_unchanged_toast"]
    value = json.loads(template["value"])
    value["after"] |= {"description": "a mug", "image": placeholder}
    (row,) = decoded(spark, [{**template, "value": json.dumps(value)}])
    assert row["unavailable"] == ["image"]
    assert "image" not in row["after"] and row["after"]["description"] == "a mug"


def test_values_stay_as_their_text_and_the_placeholder_never_reaches_after(spark):
    rows = {r["origin"]["offset"]: r for r in decoded(spark, list(RECORDS.values()))}
    names = list(RECORDS)
    insert = rows[names.index("products_insert")]["after"]
    assert insert["price"] == "12.50" and insert["tags"] == '["kitchen","blue"]'
    assert json.loads(insert["attributes"]) == {"color": "blue", "dims": {"h": 10}}
    toast = rows[names.index("products_update_unchanged_toast")]
    assert toast["unavailable"] == ["description"] and "description" not in toast["after"]


def test_a_primary_key_change_names_the_old_key_on_the_create_and_marks_the_delete_moved(spark):
    rows = {r["origin"]["offset"]: r for r in decoded(spark, list(RECORDS.values()))}
    names = list(RECORDS)
    create, delete = rows[names.index("products_key_change_create")], rows[names.index("products_key_change_delete")]
    old = json.loads(RECORDS["products_key_change_create"]["headers"]["__debezium.oldkey"])
    assert create["old_row_id"] == str(old["id"]) == delete["row_id"]
    assert delete["moved"] is True and create["moved"] is False
    assert create["unavailable"] == ["description"]


def test_composite_keys_are_json_lists(spark):
    row = decoded(spark, [RECORDS["order_items_delete"]])[0]
    key = json.loads(RECORDS["order_items_delete"]["key"])
    assert row["row_id"] == json.dumps(list(key.values()), separators=(",", ":"))


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("{not json", "value is not JSON"),
        ('{"something": 1}', "value has no Debezium op"),
        ('{"op": "x", "source": {"table": "products"}}', "unknown op x"),
        ('{"op": "c", "source": {}, "after": {"id": 1}}', "payload has no source.table"),
        ('{"op": "c", "source": {"table": "products"}}', "op c without an after image"),
        ('{"op": "c", "source": {"table": "secrets"}, "after": {"id": 1}}', "table secrets is not configured"),
        ('{"op": "c", "source": {"table": "products", "sequence": "[1]"}, "after": {"id": 1}}', "two-element list"),
    ],
)
def test_what_cannot_be_read_is_a_dead_letter_with_the_reason_and_the_bytes(spark, value, reason):
    record = {"topic": "tideline.public.products", "key": '{"id":1}', "value": value}
    row = decoded(spark, [record])[0]
    assert reason in row["error"]
    assert row["letter_value"] == value.encode()


def test_a_key_that_is_not_an_object_is_a_dead_letter(spark):
    record = {**RECORDS["products_insert"], "key": "not a key"}
    assert decoded(spark, [record])[0]["error"] == "key is not a JSON object"


def test_times_without_a_zone_lose_the_utc_mark_debezium_gives_them_and_nothing_else_does(spark):
    """isostring writes a date, a timestamp and a time as if they were UTC instants ("1901-12-13Z");
    with the catalogue the decoder keeps the text before the Z, in arrays too. A timestamptz keeps
    its Z (it is an instant), and so does text that merely ends in Z."""
    from spark_jobs.model.catalogue import Column, TableSchema

    columns = {"id": Column("id", "INT8"), "born": Column("born", "DATE"), "at": Column("at", "TIMESTAMP"),
               "at_time": Column("at_time", "TIME"), "days": Column("days", "_DATE"),
               "at_tz": Column("at_tz", "TIMESTAMPTZ"), "note": Column("note", "TEXT")}
    after = {"id": 1, "born": "1901-12-13Z", "at": "1900-01-01T00:00:00.5Z", "at_time": "20:17:40.123456Z",
             "days": ["2024-02-29Z", None], "at_tz": "1969-07-20T20:17:40.123456Z", "note": "ends in Z"}
    infinite = {"id": 2, "born": "+5877611-06-21Z", "at": "-292275055-05-16T23:00:00Z", "at_tz": "-infinity"}
    minus = {"id": 3, "born": "-5877611-06-22Z", "at": "+292278994-08-16T23:00:00Z"}
    far = {"id": 4, "born": "+5874897-12-31Z", "at": "-4713-11-24T00:00:00Z"}  # the edges PostgreSQL stores
    source = {"table": "events", "lsn": 10, "sequence": '[null,"10"]', "snapshot": "false", "ts_ms": 1}
    records = [("t.public.events", 0, offset, json.dumps({"id": row["id"]}).encode(),
                json.dumps({"op": "c", "after": row, "source": source}).encode(), [])
               for offset, row in enumerate((after, infinite, minus, far))]
    frame = spark.createDataFrame(records, KAFKA)
    catalogue = {"events": TableSchema(columns, ("id",))}
    plain = decode_stream(frame, ["events"]).orderBy("origin.offset").collect()[0]["after"]
    local, infinite, minus, far = (row["after"] for row in
                                   decode_stream(frame, ["events"], catalogue).orderBy("origin.offset").collect())
    assert plain["born"] == "1901-12-13Z", "without the catalogue the text is Debezium's"
    assert {name: local[name] for name in after if name != "id"} == {
        "born": "1901-12-13", "at": "1900-01-01T00:00:00.5", "at_time": "20:17:40.123456",
        "days": '["2024-02-29",null]', "at_tz": "1969-07-20T20:17:40.123456Z", "note": "ends in Z"}
    assert (infinite["born"], infinite["at"], infinite["at_tz"]) == ("infinity", "-infinity", "-infinity")
    assert (minus["born"], minus["at"]) == ("-infinity", "infinity"), "PostgreSQL's words for its infinite times"
    assert (far["born"], far["at"]) == ("+5874897-12-31", "-4713-11-24T00:00:00"), "a time PostgreSQL can store stays"


def test_the_decoders_rules_read_each_record_parsed_once_below_them(spark):
    """The decoder parses a record's JSON in a projection of its own and its rules (row id, version,
    errors) read the parsed columns from the one above: merged into one projection, Spark would parse
    the JSON again for each use (docs/apply.md, "Generated code, and what stays out of it")."""
    frame = spark.createDataFrame(kafka_rows(list(RECORDS.values())), KAFKA).repartition(1)  # not folded locally
    plan = decode_stream(frame, TABLES)._jdf.queryExecution().executedPlan().toString()
    top = plan.splitlines()[0]
    assert "Project" in top and "row_id" in top and "from_json" not in top, plan
    assert "from_json" in plan, plan


def test_a_real_time_query_keeps_each_tombstone_as_a_pass_for_both_writers(spark):
    # So that a writer counts a tombstone as applied; dropped, a partition ending in one looked behind
    # until the epoch's end (spark_jobs/jars' ChangeWriter).
    from spark_jobs.model import config
    from spark_jobs.sinks.elasticsearch import ElasticsearchSink
    from spark_jobs.sinks.redis._commands import writer_rows
    from tests.demo_catalogue import demo_catalogue

    fixtures = list(RECORDS.values())
    tombstones = {offset for offset, record in enumerate(fixtures) if not record["value"]}
    assert tombstones, "the fixtures hold a tombstone"
    changes = decode_stream(spark.createDataFrame(kafka_rows(fixtures), KAFKA), TABLES, tombstones=True)
    assert [row["error"] for row in changes.collect()] == [None] * len(fixtures)
    search = ElasticsearchSink("http://127.0.0.1:9200", config.load())
    for rows in (writer_rows(changes, "p:", "cache"), search.writer_rows(changes, demo_catalogue())):
        kinds = {row["origin"]["offset"]: row["kind"] for row in rows.collect()}
        assert {offset for offset, kind in kinds.items() if kind == "pass"} == tombstones
        assert len(kinds) == len(fixtures) and "letter" not in kinds.values()

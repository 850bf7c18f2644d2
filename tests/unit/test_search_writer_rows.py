"""What the search sink's JVM writer gets in Real-Time Mode (spark_jobs/sinks/elasticsearch/_documents.py,
writer_rows): the micro-batch shipper's documents and request fragments, the old key's heads of a
primary-key move, the nested views' lookups, truncates, and dead letters ready to produce."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.model import config
from spark_jobs.realtime import optimized
from spark_jobs.sinks.elasticsearch import ElasticsearchSink
from spark_jobs.sinks.elasticsearch._documents import TOMBSTONES, documents
from tests.demo_catalogue import demo_catalogue
from tests.unit.spark_frames import change, frame

PIPELINE = config.load()
SINK = ElasticsearchSink("http://127.0.0.1:9200", PIPELINE, targets={"products": "products-v2"})


def writer_rows(spark, rows):
    found = SINK.writer_rows(frame(spark, rows), demo_catalogue()).collect()
    return {row["origin"]["offset"]: row.asDict(recursive=True) for row in found}


def test_a_row_carries_the_shippers_document_and_fragments(spark):
    rows = [change((5, 7), key=1), change((5, 8), op="d", key=2, offset=1)]
    tables = SINK.tables()
    shipped = {r["origin"]["offset"]: r.asDict(recursive=True) for r in documents(
        frame(spark, rows), demo_catalogue(), tables, {t: SINK.alias(t) for t in tables},
        {t: SINK.target(t) for t in tables}, {}).collect()}
    for offset, row in writer_rows(spark, rows).items():
        assert row["kind"] == "row" and row["letter"] is None and row["old_head"] is None
        for column in ("doc", "partial", "tomb_doc", "head", "tomb_head", "alias", "target", "keeps_objects"):
            assert row[column] == shipped[offset][column], column
    assert json.loads("{" + writer_rows(spark, rows[:1])[0]["head"] + "}") == {"_index": "products-v2", "_id": "1"}


def test_the_create_of_a_moved_row_names_the_old_keys_document_and_tombstone(spark):
    (row,) = writer_rows(spark, [change((5, 7), op="c", key=2, old_row_id="1", unavailable=("description",))]).values()
    assert json.loads("{" + row["old_head"] + "}") == {"_index": "products-v2", "_id": "1"}
    assert json.loads("{" + row["old_tomb_head"] + "}") == {"_index": TOMBSTONES, "_id": "products/1"}
    assert row["unavailable"] == ["description"] and "description" not in json.loads(row["partial"])


def test_each_change_lists_the_nested_views_lookups_it_makes(spark):
    rows = writer_rows(spark, [change((5, 7), table="customers", key=3, after={"id": "3", "name": "Ada"}),
                               change((5, 8), op="t", table="customers", offset=1)])
    lookups = {offset: {(t["view"], t["kind"], t["value"]) for t in map(json.loads, row["touches"])}
               for offset, row in rows.items()}
    assert ("orders", "ref", "customers:3") in lookups[0]
    assert lookups[1] == {("orders", "prefix", "customers:")} and rows[1]["kind"] == "truncate"
    assert (rows[1]["alias"], rows[1]["version"]) == ("customers", {"major": 5, "minor": 8})


def test_undecoded_and_refused_changes_come_as_ready_dead_letters_with_no_lookups(spark):
    undecoded = {**change((5, 1)), "error": "value is not JSON", "letter_value": b"{nope"}
    rows = writer_rows(spark, [undecoded, change((5, 2), key=2, after={"id": "2", "tl_x": "1"}, offset=1)])
    letters = {offset: json.loads(bytes(row["letter"])) for offset, row in rows.items()}
    assert all(row["kind"] == "letter" for row in rows.values()) and rows[0]["touches"] is None
    assert letters[0]["stage"] == "decode:search" and letters[0]["value"] == "{nope"
    assert letters[1]["stage"] == "apply:search" and "clashes with the sink's metadata prefix" in letters[1]["reason"]


def test_the_real_time_query_is_handed_its_rows_optimized_once_and_they_come_out_the_same(spark):
    rows = [change((5, 7), key=1), change((5, 8), op="d", key=2, offset=1),
            change((5, 9), op="c", key=3, old_row_id="1", unavailable=("description",), offset=2)]
    planned = SINK.writer_rows(frame(spark, rows), demo_catalogue())
    once = optimized(planned)
    # Spark plans each epoch again from this plan: an optimized one leaves its optimizer nothing to do.
    assert once.queryExecution().optimizedPlan().toString() == once.queryExecution().analyzed().toString()
    assert sorted(map(str, DataFrame(once, spark).collect())) == sorted(map(str, planned.collect()))
    with pytest.raises(ValueError, match="reads the clock"):
        optimized(planned.withColumn("seen", F.current_timestamp()))

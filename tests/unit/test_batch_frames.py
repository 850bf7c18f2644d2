"""A micro-batch's changes are decoded once: a sink that runs several Spark actions per batch (the Delta
MERGEs) reads the persisted changes, never the topics again; a single-pass sink's one job reads them as
they come."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from spark_jobs.model.config import load
from spark_jobs.model.settings import JobSettings
from spark_jobs.pipeline import batch_frames
from spark_jobs.sinks.base import build_sink
from tests.unit.spark_frames import change, frame

ROWS = [change((5, 1), key=1), change((5, 2), key=1), change((6, 0), key=2),
        # a primary-key move with an unchanged-TOAST column: the key moves' join has something to find
        change((7, 0), key=3, old_row_id="2", after={"id": "3", "name": "moved"}, unavailable=("description",))]


def counted_reads(spark, sink_name: str, tmp_path, actions: int) -> int:
    """How many times the batch's rows were read (decoded) while `actions` Spark actions ran on the
    newest change per row, as the pipeline hands them to `sink_name`."""
    reads = spark.sparkContext.accumulator(0)

    def read(table):  # unannotated: PySpark 4.2 takes a hinted function for an Arrow UDF
        reads.add(1)
        return table

    decoded = frame(spark, ROWS).withColumn("table", F.udf(read, StringType())("table"))
    sink = build_sink(sink_name, JobSettings(warehouse_dir=tmp_path), load())
    with batch_frames(decoded, sink) as (_, newest):
        for _ in range(actions):
            assert newest.count() == 3
    return reads.value


@pytest.mark.parametrize("sink_name", ["warehouse", "analytics"])
def test_a_sink_of_several_actions_decodes_each_change_once(spark, sink_name, tmp_path):
    assert counted_reads(spark, sink_name, tmp_path, actions=3) == len(ROWS)


def test_a_single_pass_sink_gets_its_frames_unpersisted(spark, tmp_path):
    # Its one job per batch reads the changes as its plan does: a cache would cost a pass of its own.
    sink = build_sink("cache", JobSettings(warehouse_dir=tmp_path), load())
    with batch_frames(frame(spark, ROWS), sink) as (changes, newest):
        assert not changes.is_cached and not newest.is_cached

"""The change, as the apply jobs carry it: one Spark struct, defined here and nowhere else.

Every micro-batch is decoded into rows of `CHANGE` (stream.py), reduced to the newest change per row
(spark_jobs/changes/newest.py), and handed to a sink as a DataFrame of these columns. Column values stay the
text Debezium sent (`after`: column -> JSON text, a string's own text unquoted, NULL as null); each
sink types them from PostgreSQL's catalogue (spark_jobs/model/catalogue.py) the way its store needs.

A row with `error` set is a dead letter: a record that could not be decoded, or a change a sink could
not apply; only its origin, `error` and `letter_value` (the record's bytes) mean anything then.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# A change's position in commit order (envelope.version), compared as a struct: lexicographically.
VERSION = StructType([StructField("major", LongType()), StructField("minor", LongType())])
ORIGIN = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
])
TEXT_MAP = MapType(StringType(), StringType(), valueContainsNull=True)

CHANGE = StructType([
    StructField("table", StringType()),
    StructField("op", StringType()),  # r, c, u, d, or t (a truncate of the whole table)
    StructField("row_id", StringType()),  # envelope.row_id of the key; NULL for a truncate
    StructField("key", MapType(StringType(), StringType())),  # primary-key columns' text, in key order
    StructField("after", TEXT_MAP),  # NULL for a delete or truncate; unchanged-TOAST columns left out
    StructField("unavailable", ArrayType(StringType(), False)),  # columns Debezium sent as the placeholder
    # Columns of `after` filled from an older change of the batch (spark_jobs/changes/newest.py), each with the
    # version of the change its value came from: a sink whose row is at least that new keeps its own.
    StructField("filled", MapType(StringType(), VERSION, False)),
    StructField("version", VERSION),
    StructField("commit_ts", TimestampType()),
    # A primary-key change arrives as a delete of the old key and a create of the new one (Debezium's
    # newkey and oldkey headers). The delete is `moved`; the create names the old key's row id, so a
    # sink takes the create's unchanged-TOAST columns from what it holds for the old key.
    StructField("moved", BooleanType()),
    StructField("old_row_id", StringType()),
    StructField("origin", ORIGIN),
    StructField("error", StringType()),  # the dead-letter reason
    StructField("letter_value", BinaryType()),  # the record's value, for a record that could not be decoded
])
FIELDS = tuple(field.name for field in CHANGE.fields)

"""Each change as the arguments of one row of `APPLY_BATCH`, built by Spark SQL expressions.

The arguments are already in Redis's wire format (RESP bulk strings, concatenated), so the Python
shipper on the executor only joins a chunk's bytes behind an EVALSHA header and writes them to the
socket: no Python object per row. In Real-Time Mode the same arguments go, as a list, to the JVM
writer (`writer_rows`), with the truncates' keys and the dead letters built here too. Values are
stored as their text (docs/sinks/redis.md): the change's `after` already holds each column's text,
NULL columns are left out of the hash.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.changes.newest import keep_versions
from spark_jobs.runtime.expressions import reused
from spark_jobs.sinks.base import COMMIT_TS, META_PREFIX, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.redis._scripts import MAX_EXACT_VERSION, ROW_FIXED_ARGS

# The columns the shipper reads (and passes on for rejected rows).
SHIPPED = ("op", "table", "version", "origin", "args", "arg_count", "error")
# The columns the JVM writer reads (`writer_rows`; spark_jobs/jars/src: RedisChangeWriter).
WRITER_ROWS = ("kind", "args", "origin", "letter", "table", "watermark", "major", "minor", "row_pattern",
               "row_prefix", "tombstone_pattern")


def resp(text: Column) -> Column:
    """One RESP bulk string: $<byte length>\\r\\n<bytes>\\r\\n."""
    return F.concat(F.lit("$"), F.octet_length(text).cast("string"), F.lit("\r\n"), text, F.lit("\r\n"))


def row_key(prefix: str, table: Column, row_id: Column) -> Column:
    return F.concat(F.lit(prefix), table, F.lit(":"), row_id)


def tombstone_key(prefix: str, table: Column, row_id: Column) -> Column:
    return F.concat(F.lit(f"{prefix}tideline:tombstone:"), table, F.lit(":"), row_id)


def watermark_key(prefix: str, table: Column) -> Column:
    return F.concat(F.lit(f"{prefix}tideline:truncated:"), table)


def _fields() -> Column:
    """The hash's fields: the non-NULL columns' text, then the version and commit time."""
    meta = F.create_map(
        F.lit(VERSION_MAJOR), F.col("version.major").cast("string"),
        F.lit(VERSION_MINOR), F.col("version.minor").cast("string"),
        F.lit(COMMIT_TS), F.date_format("commit_ts", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"),
    )
    return F.map_concat(F.map_filter("after", lambda _, v: v.isNotNull()),
                        F.map_filter(meta, lambda _, v: v.isNotNull()))


def _error() -> Column:
    """What the sink refuses before Redis sees it: a column named like its metadata, a version Lua
    cannot compare exactly."""
    clashing = F.filter(F.map_keys(F.coalesce("after", F.create_map().cast("map<string,string>"))),
                        lambda k: k.startswith(META_PREFIX))
    version = F.col("version")
    return (
        F.when(F.size(clashing) > 0, F.concat(F.lit("column "), clashing[0],
                                               F.lit(f" clashes with the sink's metadata prefix {META_PREFIX}")))
        .when((version["major"] >= MAX_EXACT_VERSION) | (version["minor"] >= MAX_EXACT_VERSION)
              | (version["major"] < 0) | (version["minor"] < 0),
              F.concat(F.lit("version ("), version["major"].cast("string"), F.lit(", "),
                       version["minor"].cast("string"),
                       F.lit(") is outside [0, 2^53) and cannot be compared exactly in Lua")))
    )


def commands(newest: DataFrame, prefix: str) -> DataFrame:
    """`newest` (CHANGE rows) → the SHIPPED columns: truncates pass as they are; every other change
    gets `args` (its APPLY_BATCH arguments, count first) and `arg_count` (bulk strings in `args`)."""
    return newest.select(*_command_columns(prefix))


@reused
def _command_columns(prefix: str) -> list[Column | str]:
    arguments = _arguments(prefix)
    truncate = F.col("op") == "t"
    return [
        "op", "table", "version", "origin",
        F.when(~truncate, F.array_join(F.transform(arguments, resp), "").cast("binary")).alias("args"),
        F.when(~truncate, F.size(arguments)).cast("int").alias("arg_count"),
        F.when(~truncate, _error()).alias("error"),
    ]


def _arguments(prefix: str) -> Column:
    """One change's APPLY_BATCH arguments as a list of text, their count first (ROW_FIXED_ARGS, then
    each kept column's name and version, then the hash's fields). Both writers send this list: the
    Python shipper RESP-encoded (`args`), the JVM writer as it is (`writer_rows`)."""
    table, row_id, version = F.col("table"), F.col("row_id"), F.col("version")
    upsert = F.col("after").isNotNull()
    keep = F.when(upsert, keep_versions()).otherwise(
        F.create_map().cast("map<string, struct<major: bigint, minor: bigint>>"))
    fields = F.when(upsert, _fields()).otherwise(F.create_map().cast("map<string,string>"))
    moved_from = F.col("old_row_id").isNotNull()
    count = F.lit(ROW_FIXED_ARGS) + 3 * F.size(keep) + 2 * F.size(fields)
    op = F.when(~upsert, F.when(F.col("moved"), F.lit("m")).otherwise(F.lit("d"))).otherwise(F.lit("u"))
    fixed = F.array(
        count.cast("string"),
        row_key(prefix, table, row_id), tombstone_key(prefix, table, row_id), watermark_key(prefix, table),
        F.when(moved_from, row_key(prefix, table, F.col("old_row_id"))).otherwise(F.lit("")),
        F.when(moved_from, tombstone_key(prefix, table, F.col("old_row_id"))).otherwise(F.lit("")),
        op, version["major"].cast("string"), version["minor"].cast("string"), table, row_id,
        F.size(keep).cast("string"),
    )
    kept = F.flatten(F.transform(F.map_entries(keep), lambda e: F.array(
        e["key"], e["value"]["major"].cast("string"), e["value"]["minor"].cast("string"))))
    sent = F.flatten(F.transform(F.map_entries(fields), lambda e: F.array(e["key"], e["value"])))
    return F.concat(fixed, kept, sent)


def glob_escaped(text: Column) -> Column:
    """`text` as a literal in a SCAN MATCH pattern (spark_jobs.sinks.redis.glob_escape in SQL)."""
    return F.regexp_replace(text, r"([*?\[\]\\])", r"\\$1")


def writer_rows(changes: DataFrame, prefix: str, sink: str) -> DataFrame:
    """`changes` (CHANGE rows, dead letters included) → WRITER_ROWS, what the JVM writer
    (dev.tideline.writers.RedisChangeWriter) takes in Real-Time Mode: `kind` row (its APPLY_BATCH
    arguments), truncate (its watermark, version and SCAN patterns) or letter (a dead letter, ready)."""
    return changes.select(*_writer_columns(prefix, sink))


@reused
def _writer_columns(prefix: str, sink: str) -> list[Column]:
    from spark_jobs.changes.dead_letters import letter_value

    undecoded, refused = F.col("error").isNotNull(), _error().isNotNull()
    truncate = F.col("op") == "t"
    table, version = F.col("table"), F.col("version")
    rows = row_key(prefix, table, F.lit(""))
    on_truncate = {
        "table": table,
        "watermark": watermark_key(prefix, table),
        "major": version["major"], "minor": version["minor"],
        "row_pattern": F.concat(glob_escaped(rows), F.lit("*")),
        "row_prefix": rows,
        "tombstone_pattern": F.concat(glob_escaped(tombstone_key(prefix, table, F.lit(""))), F.lit("*")),
    }
    return [
        F.when(undecoded | (~truncate & refused), F.lit("letter")).when(truncate, F.lit("truncate"))
        .otherwise(F.lit("row")).alias("kind"),
        # Text, not binary: a cast of each element would need a lambda, which runs every expression
        # under it interpreted (docs/apply.md, "Generated code"); the writer encodes them as UTF-8.
        F.when(~undecoded & ~truncate & ~refused, _arguments(prefix)).alias("args"),
        F.col("origin"),
        F.when(undecoded, letter_value(f"decode:{sink}", F.col("error")))
        .when(~truncate & refused, letter_value(f"apply:{sink}", _error())).alias("letter"),
        *(F.when(~undecoded & truncate, value).alias(name) for name, value in on_truncate.items()),
    ]

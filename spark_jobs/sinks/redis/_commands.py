"""Each change as the arguments of one row of `APPLY_BATCH`, built by Spark SQL expressions.

The arguments are already in Redis's wire format (RESP bulk strings, concatenated), so the Python
shipper on the executor only joins a chunk's bytes behind an EVALSHA header and writes them to the
socket: no Python object per row. In Real-Time Mode the same arguments go, as a list, to the JVM
writer (`writer_rows`), with the truncates' keys and the dead letters built here too. Values are
stored as their text (docs/sinks/redis.md): the change's `after` already holds each column's text and
goes to the script as one JSON object, which leaves NULL columns out of the hash.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.changes.newest import keep_versions
from spark_jobs.runtime.expressions import reused
from spark_jobs.sinks.base import META_PREFIX
from spark_jobs.sinks.redis._scripts import MAX_EXACT_VERSION, ROW_ARGS

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


def _clashing(after: Column) -> Column:
    """Whether a column of `after` is named like the sink's metadata. Its keys joined by NUL (which no
    column name holds), not a lambda: this runs for every change (docs/apply.md, "Generated code")."""
    names = F.concat(F.lit("\u0000"), F.array_join(F.map_keys(after), "\u0000"))
    return names.contains(f"\u0000{META_PREFIX}")


def _error() -> Column:
    """What the sink refuses before Redis sees it: a column named like its metadata, a version Lua
    cannot compare exactly."""
    after = F.coalesce("after", F.create_map().cast("map<string,string>"))
    version = F.col("version")
    return (
        F.when(_clashing(after), F.concat(
            F.lit("column "), F.filter(F.map_keys(after), lambda k: k.startswith(META_PREFIX))[0],
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
    truncate = F.col("op") == "t"
    return [
        "op", "table", "version", "origin",
        F.when(~truncate, F.concat(*(resp(argument) for argument in _arguments(prefix))).cast("binary")).alias("args"),
        F.when(~truncate, F.lit(1 + ROW_ARGS)).cast("int").alias("arg_count"),
        F.when(~truncate, _error()).alias("error"),
    ]


def _arguments(prefix: str) -> list[Column]:
    """One change's APPLY_BATCH arguments as text, their count first (ROW_ARGS): the keys, op, version
    and row, the columns that may keep their stored value (`keep_versions`) and the after image, both
    as JSON. Both writers send these: the Python shipper RESP-encoded (`args`), the JVM writer as a
    list (`writer_rows`). A fixed number of plain expressions: no function per element, so every
    change's arguments are generated code."""
    table, row_id, version = F.col("table"), F.col("row_id"), F.col("version")
    upsert = F.col("after").isNotNull()
    keep = keep_versions()
    moved_from = F.col("old_row_id").isNotNull()
    op = F.when(~upsert, F.when(F.col("moved"), F.lit("m")).otherwise(F.lit("d"))).otherwise(F.lit("u"))
    return [
        F.lit(str(ROW_ARGS)),
        row_key(prefix, table, row_id), tombstone_key(prefix, table, row_id), watermark_key(prefix, table),
        F.when(moved_from, row_key(prefix, table, F.col("old_row_id"))).otherwise(F.lit("")),
        F.when(moved_from, tombstone_key(prefix, table, F.col("old_row_id"))).otherwise(F.lit("")),
        op, version["major"].cast("string"), version["minor"].cast("string"), table, row_id,
        F.when(upsert, F.size(keep)).otherwise(F.lit(0)).cast("string"),
        F.coalesce(F.date_format("commit_ts", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"), F.lit("")),
        F.when(upsert, F.to_json(keep)).otherwise(F.lit("")),
        F.when(upsert, F.to_json("after")).otherwise(F.lit("")),
    ]


def glob_escaped(text: Column) -> Column:
    """`text` as a literal in a SCAN MATCH pattern (spark_jobs.sinks.redis.glob_escape in SQL)."""
    return F.regexp_replace(text, r"([*?\[\]\\])", r"\\$1")


def writer_rows(changes: DataFrame, prefix: str, sink: str) -> DataFrame:
    """`changes` (CHANGE rows, dead letters included) → WRITER_ROWS, what the JVM writer
    (dev.tideline.writers.RedisChangeWriter) takes in Real-Time Mode: `kind` row (its APPLY_BATCH
    arguments), truncate (its watermark, version and SCAN patterns), letter (a dead letter, ready) or
    pass (a tombstone)."""
    return changes.select(*_writer_columns(prefix, sink))


@reused
def _writer_columns(prefix: str, sink: str) -> list[Column]:
    from spark_jobs.changes.dead_letters import letter_value
    from spark_jobs.changes.stream import writer_kind

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
        writer_kind(undecoded, refused).alias("kind"),
        # Text, not binary: a cast of each element would need a lambda, which runs every expression
        # under it interpreted (docs/apply.md, "Generated code"); the writer encodes them as UTF-8.
        F.when(~undecoded & ~truncate & ~refused, F.array(*_arguments(prefix))).alias("args"),
        F.col("origin"),
        F.when(undecoded, letter_value(f"decode:{sink}", F.col("error")))
        .when(~truncate & refused, letter_value(f"apply:{sink}", _error())).alias("letter"),
        *(F.when(~undecoded & truncate, value).alias(name) for name, value in on_truncate.items()),
    ]

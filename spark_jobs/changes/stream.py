"""Kafka records → `CHANGE` rows (the apply jobs' decoder), in the JVM: `from_json` and column expressions,
no Python per row.

Nothing downstream reads raw Debezium JSON. A record that cannot be read becomes a row with `error`
set (a dead letter), never a failed batch; a tombstone (NULL value) is dropped: it only serves
compaction, and the delete record before it carries the delete. A real-time query keeps its tombstones
as rows of kind `pass` (`writer_kind`), so that its writers can count them as applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.changes import envelope
from spark_jobs.changes.schema import CHANGE, FIELDS
from spark_jobs.model.catalogue import TableSchema
from spark_jobs.runtime.expressions import reused

_SOURCE = "struct<table: string, lsn: bigint, sequence: string, snapshot: string, ts_ms: bigint>"
_ENVELOPE = f"after: map<string, string>, source: {_SOURCE}, op: string"
# Both layouts at once: the bare envelope (schemas.enable=false) and {"schema", "payload"} (true).
_VALUE = f"struct<payload: struct<{_ENVELOPE}>, {_ENVELOPE}>"
# A key as the JSON converter writes it, either way; variant keeps each value's JSON type, which a
# composite row id needs (a string key part is quoted, a number is not).
_KEY = "struct<payload: map<string, variant>>"
_KEY_MAP = "map<string, variant>"


def row_id_column(key: Column) -> Column:
    """envelope.row_id in SQL, for a key parsed as map<string, variant>."""
    values = F.map_values(key)
    # A composite id is the values' JSON list (to_json keeps each value's JSON type).
    encoded = F.when(F.size(values) == 1, values[0].cast("string")).otherwise(F.to_json(values))
    return F.when(
        F.octet_length(encoded) > envelope.MAX_ID_BYTES, F.concat(F.lit("sha256:"), F.sha2(encoded, 256))
    ).otherwise(encoded)


def version_column(source: Column, sequence: Column) -> Column:
    """envelope.version in SQL: struct<major, minor>; NULL when the sequence cannot be read.
    `sequence`: source.sequence parsed as array<string> (by the caller, in a projection of its own)."""
    lsn = F.coalesce(source["lsn"], F.lit(0).cast("bigint"))
    minor = F.coalesce(sequence[1].cast("bigint"), lsn)
    streamed = source["snapshot"].isNull() | (source["snapshot"] == "false")
    major = (
        F.when(source["sequence"].isNull() | (source["sequence"] == ""), F.lit(0).cast("bigint"))
        .when(sequence[0].isNull() & streamed, minor)
        .otherwise(F.coalesce(sequence[0].cast("bigint"), F.lit(0).cast("bigint")))
    )
    valid = source["sequence"].isNull() | (source["sequence"] == "") | (F.size(sequence) == 2)
    return F.when(valid, F.struct(major.alias("major"), minor.alias("minor")))


def _placeholder(value: Column) -> Column:
    return value.isin(*envelope.UNAVAILABLE_FORMS)


def _header(name: str, present: bool) -> Column:
    """A header's value as text (the first header of that name), NULL when absent or when the records
    carry no headers (`present`). array_position, not a lambda: a higher-order function keeps its
    whole projection out of generated code."""
    if not present:
        return F.lit(None).cast("string")
    position = F.array_position(F.col("headers")["key"], name)
    return F.when(position > 0, F.element_at(F.col("headers")["value"], position.cast("int")).cast("string"))


def _key_map(raw: Column) -> Column:
    """The key's columns (map<string, variant>) from its bytes, either converter layout. A key without
    the word "payload" cannot be Connect's layout with a schema: it is parsed once, as a map."""
    text = raw.cast("string")
    bare = F.from_json(text, _KEY_MAP)
    return F.when(text.contains('"payload"'), F.coalesce(F.from_json(text, _KEY)["payload"], bare)).otherwise(bare)


def _placeholders(text: Column) -> Column:
    """Whether a record's text holds Debezium's unchanged-TOAST placeholder in any of its forms. Most
    records do not, and theirs skip the after image's filter (a lambda: run interpreted, per column).
    Two scans of the text: the array form holds the text form."""
    return text.contains(envelope.UNAVAILABLE) | text.contains(envelope.UNAVAILABLE_BYTEA)


# Types without a time zone. Debezium's isostring mode writes them as if they were UTC instants
# ("2024-02-29Z", "1900-01-01T00:00:00Z", "20:17:40.123456Z"); the value is the text before the Z.
LOCAL_TIME_TYPES = frozenset({"DATE", "TIMESTAMP", "TIME"})
# PostgreSQL's infinite dates and timestamps reach the record as sentinel times beyond the type's range
# ("+5877611-06-21", "-292275055-05-16T23:00:00"); a year past the latest PostgreSQL stores is infinity,
# one before the earliest (4713 BC) -infinity: the words PostgreSQL itself prints (a timestamptz's
# record already carries them).
LATEST_YEAR = {"DATE": 5_874_897, "TIMESTAMP": 294_276}
EARLIEST_YEAR = -4_713
_ARRAY = "ARRAY"


def local_time_columns(catalogue: Mapping[str, TableSchema], tables: Iterable[str]) -> dict[str, str]:
    """{"table\u0000column": its type, or ARRAY for an array of them} for the columns of `tables`
    whose type has no time zone."""
    return {
        f"{table}\u0000{column.name}": _ARRAY if column.is_array else column.type
        for table in tables if table in catalogue
        for column in catalogue[table].columns.values() if column.element.type in LOCAL_TIME_TYPES
    }


def _infinite(text: Column, latest_year: int) -> Column:
    year = F.regexp_extract(text, r"^([+-]?[0-9]+)-", 1).try_cast("bigint")
    return (F.when(year > latest_year, F.lit("infinity")).when(year < EARLIEST_YEAR, F.lit("-infinity"))
            .otherwise(text))


def _local_times(after: Column, table: Column, columns: dict[str, str]) -> Column:
    """`after` with the UTC mark Debezium puts on zone-less times removed (an array's, from each
    element), and infinite dates and timestamps as PostgreSQL's words."""
    if not columns:
        return after
    kinds = F.create_map(*(F.lit(part) for item in sorted(columns.items()) for part in item))

    def local(name: Column, text: Column) -> Column:
        kind = kinds[F.concat(table, F.lit("\u0000"), name)]
        plain = F.regexp_replace(text, "Z$", "")
        return (F.when(kind.isNull(), text)
                .when(kind == _ARRAY, F.regexp_replace(text, 'Z"', '"'))
                .when(kind == "DATE", _infinite(plain, LATEST_YEAR["DATE"]))
                .when(kind == "TIMESTAMP", _infinite(plain, LATEST_YEAR["TIMESTAMP"]))
                .otherwise(plain))

    return F.transform_values(after, local)


def decode_stream(records: DataFrame, tables: Iterable[str],
                  catalogue: Mapping[str, TableSchema] | None = None, *, tombstones: bool = False) -> DataFrame:
    """`records` (Kafka source columns: topic, partition, offset, key, value, and headers if the source
    includes them) as `CHANGE` rows. A change to a table not in `tables` is a dead letter too: the
    sink's query subscribes only to its own tables' topics, so such a record is misrouted. With
    `catalogue`, dates, timestamps and times without a zone lose the UTC mark Debezium gives them.
    With `tombstones`, each tombstone stays as a row with neither `op` nor `error` (`is_tombstone`)."""
    wanted = tuple(sorted(set(tables)))
    local_times = tuple(sorted(local_time_columns(catalogue or {}, wanted).items()))
    parsed, unpacked, changes = _decoding(wanted, local_times, "headers" in records.columns)
    kept = records if tombstones else records.where(F.col("value").isNotNull())
    return kept.select(*parsed).select(*unpacked).select(*changes)


def is_tombstone(undecoded: Column) -> Column:
    """Whether a `CHANGE` row is a kept tombstone: no op, and not a record that failed to decode
    (`undecoded`: its `error` is set; a record that is not a tombstone always has an op or an error)."""
    return F.col("op").isNull() & ~undecoded


def writer_kind(undecoded: Column, refused: Column) -> Column:
    """A real-time writer row's `kind` (spark_jobs/jars' ChangeWriter) from its `CHANGE` row: pass (a
    tombstone: nothing to apply, its position still counts), letter (`undecoded`, or a change the sink
    `refused`), truncate or row."""
    truncate = F.col("op") == envelope.TRUNCATE
    return (F.when(is_tombstone(undecoded), F.lit("pass")).when(undecoded | (~truncate & refused), F.lit("letter"))
            .when(truncate, F.lit("truncate")).otherwise(F.lit("row")))


@reused
def _decoding(wanted: tuple[str, ...], local_times: tuple[tuple[str, str], ...],
              headers: bool) -> tuple[list[Column | str], list[Column | str], list[Column]]:
    """The decoder's three projections. Spark runs `from_json` and higher-order functions (lambdas)
    interpreted, and a projection holding one of them is generated again by every task instead of
    joining the stage's generated code. So they stand in two small projections of their own: the
    record, key and old key parsed; then the sequence parsed and the after image cleaned. The third,
    every rule, is plain expressions. Each parsed column is used several times downstream, which also
    keeps Spark from merging a projection into the next (it would parse the JSON again per use)."""
    text = F.col("value").cast("string")
    value = F.from_json(text, _VALUE)
    parsed: list[Column | str] = [
        "topic", "partition", "offset", "value",
        F.coalesce(value["payload"], F.struct(value["after"], value["source"], value["op"])).alias("_e"),
        _placeholders(text).alias("_toasted"),
        _key_map(F.col("key")).alias("_key"),
        F.from_json(_header(envelope.OLD_KEY_HEADER, headers), _KEY_MAP).alias("_old_key"),
        _header(envelope.NEW_KEY_HEADER, headers).alias("_new_key"),
    ]
    e = F.col("_e")
    toasted = F.col("_toasted")
    cleaned = F.when(toasted, F.map_filter(e["after"], lambda _, v: v.isNull() | ~_placeholder(v)))
    kept = _local_times(cleaned.otherwise(e["after"]), e["source"]["table"], dict(local_times))
    unpacked: list[Column | str] = [
        "topic", "partition", "offset", "value", "_e", "_key", "_old_key", "_new_key", "_toasted",
        F.from_json(e["source"]["sequence"], "array<string>").alias("_sequence"), kept.alias("_after")]
    key, op, source = F.col("_key"), e["op"], e["source"]
    version = version_column(source, F.col("_sequence"))
    truncate = op == envelope.TRUNCATE
    none = F.array().cast("array<string>")
    error = (
        F.when(F.col("value").isNull(), F.lit(None).cast("string"))  # a tombstone (kept: `tombstones`)
        .when(op.isNull(), F.when(F.get_json_object(F.col("value").cast("string"), "$").isNull(),
                                   F.lit("value is not JSON")).otherwise(F.lit("value has no Debezium op")))
        .when(~op.isin(*envelope.OPS), F.concat(F.lit("unknown op "), op))
        .when(source["table"].isNull(), F.lit("payload has no source.table"))
        .when(op.isin("r", "c", "u") & F.col("_after").isNull(),
              F.concat(F.lit("op "), op, F.lit(" without an after image")))
        .when(~source["table"].isin(*wanted) if wanted else F.lit(True),
              F.concat(F.lit("table "), source["table"], F.lit(" is not configured in pipeline.yaml for this sink")))
        .when(version.isNull(), F.concat(F.lit("source.sequence is not a two-element list: "), source["sequence"]))
        .when(~truncate & key.isNull(), F.lit("key is not a JSON object"))
    )
    changes = [
        source["table"].alias("table"),
        op.alias("op"),
        F.when(~truncate, row_id_column(key)).alias("row_id"),
        F.when(~truncate, key.cast("map<string, string>")).alias("key"),
        F.col("_after").alias("after"),
        # The keys the cleaning removed: those whose value was the placeholder.
        F.when(toasted, F.coalesce(F.array_except(F.map_keys(e["after"]), F.map_keys(F.col("_after"))), none))
        .otherwise(none).alias("unavailable"),
        F.create_map().cast(CHANGE["filled"].dataType).alias("filled"),
        version.alias("version"),
        F.timestamp_millis(source["ts_ms"]).alias("commit_ts"),
        ((op == envelope.DELETE) & F.col("_new_key").isNotNull()).alias("moved"),
        F.when(F.col("_old_key").isNotNull(), row_id_column(F.col("_old_key"))).alias("old_row_id"),
        F.struct("topic", "partition", "offset").alias("origin"),
        error.alias("error"),
        F.when(error.isNotNull(), F.col("value")).alias("letter_value"),
    ]
    return parsed, unpacked, changes


__all__ = ["FIELDS", "LOCAL_TIME_TYPES", "decode_stream", "is_tombstone", "local_time_columns", "row_id_column",
           "version_column", "writer_kind"]

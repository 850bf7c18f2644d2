"""Each change as the JSON the search sink sends, built by Spark SQL expressions per row.

For every change the job builds its document (`doc`: the columns as JSON, typed by the catalogue's
JSON kinds, plus the version and commit time), the document without the columns whose stored value
may be kept (`partial`, for unchanged-TOAST and filled columns), the tombstone document, and the
request fragments the shipper concatenates: its pair of mget entries and the `"_index"/"_id"` heads of
its bulk lines. The shipper on the executor then only joins bytes and decides per row with Arrow
compute kernels which fragment to send (spark_jobs/sinks/elasticsearch/_ship.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.changes.envelope import MAX_ID_BYTES
from spark_jobs.model.catalogue import Catalogue
from spark_jobs.runtime.expressions import reused
from spark_jobs.sinks.base import COMMIT_TS, META_PREFIX, VERSION_MAJOR, VERSION_MINOR

TOMBSTONES = "tideline-tombstones"
WATERMARKS = "tideline-watermarks"
_VERSION_SOURCE = f'"_source":["{VERSION_MAJOR}","{VERSION_MINOR}"]'
# What the shipper reads of each row.
SHIPPED = ("op", "moved", "table", "alias", "target", "version", "origin", "error", "row_id", "old_row_id",
           "unavailable", "filled", "has_keep", "fill_low", "fill_high", "keeps_objects", "doc", "partial",
           "tomb_doc", "mget_pair", "head", "tomb_head")


def json_string(text: Column) -> Column:
    """`text` as a JSON string literal (quoted and escaped) by Spark's own JSON writer; NULL as null."""
    encoded = F.to_json(F.array(text))  # ["..."]
    return encoded.substr(F.lit(2), F.length(encoded) - 2)


def kinds(catalogue: Catalogue, tables: list[str]) -> Column:
    """A literal map `<table>\\u0000<column>` → true for the columns whose text is raw JSON (numbers,
    booleans, arrays, json): the others are quoted as JSON strings. A column the catalogue does not
    know (dropped since) is quoted."""
    raw = [f"{table}\u0000{name}" for table in tables for name, column in catalogue.get(table, _NONE).columns.items()
           if column.json_kind == "raw"]
    if not raw:
        return F.create_map().cast("map<string,boolean>")
    return F.create_map(*[part for key in raw for part in (F.lit(key), F.lit(True))])


class _NoTable:
    columns: Mapping = {}


_NONE = _NoTable()


def _fragment(table: Column, raw_kinds: Column, key: Column, value: Column) -> Column:
    """One `"column":value` of a document, its JSON kind looked up per row."""
    raw = F.coalesce(raw_kinds[F.concat(table, F.lit("\u0000"), key)], F.lit(False))
    return _field(json_string(key), value, raw)


def _field(name: Column, value: Column, raw: Column) -> Column:
    """`"column":value`: `name` the column's name as a JSON string; `raw` whether the text is JSON
    already (numbers, booleans, arrays, json), else it is quoted; NULL as null."""
    return F.concat(name, F.lit(":"), F.coalesce(F.when(raw, value).otherwise(json_string(value)), F.lit("null")))


def _document(columns: Column, table: Column, raw_kinds: Column, by_table: Column | None = None) -> Column:
    """A `_source`: the columns of `columns` (a map of text), then the version and commit time.
    `by_table`: the same fields built without a lambda when the image is one `_fields_by_table` knows."""
    meta = F.concat(
        F.lit(f'"{VERSION_MAJOR}":'), F.col("version.major").cast("string"),
        F.lit(f',"{VERSION_MINOR}":'), F.col("version.minor").cast("string"),
        F.lit(f',"{COMMIT_TS}":'),
        F.coalesce(json_string(F.date_format("commit_ts", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX")), F.lit("null")),
    )
    fields = F.array_join(
        F.transform(F.map_entries(columns), lambda e: _fragment(table, raw_kinds, e["key"], e["value"])), ",")
    if by_table is not None:
        fields = F.coalesce(by_table, fields)
    return F.concat(F.lit("{"), F.when(F.size(columns) > 0, F.concat(fields, F.lit(","))).otherwise(F.lit("")), meta,
                    F.lit("}"))


def _fields_by_table(columns: Column, table: Column, catalogue: Catalogue, tables: list[str]) -> Column | None:
    """A document's fields as `_document`'s lambda builds them, for an image that holds exactly the
    columns the catalogue knows for its table (most changes), as plain expressions: Spark runs a lambda
    interpreted, once per column of every row, and in a profile of search draining alone that took 38 %
    of the jobs' CPU (docs/apply.md, "Search's documents without lambdas"). NULL for any other image
    (columns removed as unchanged TOAST, a column the catalogue does not know yet): the lambda builds it."""
    names = F.map_keys(columns)
    fields: Column | None = None
    for name in tables:
        known = catalogue.get(name, _NONE).columns
        if not known:
            continue
        exact = ((table == name) & (F.size(columns) == len(known))
                 & (F.size(F.array_except(names, F.array(*[F.lit(c) for c in known]))) == 0))
        fragments = [_field(F.lit(json.dumps(c, ensure_ascii=False)), columns[c], F.lit(column.json_kind == "raw"))
                     for c, column in known.items()]
        branch = F.concat_ws(",", *fragments)
        fields = F.when(exact, branch) if fields is None else fields.when(exact, branch)
    return fields


def _id(alias: Column, row_id: Column) -> Column:
    """The tombstone's id: `<alias>/<row id>`, the row id hashed when the whole would exceed the limit."""
    whole = F.concat(alias, F.lit("/"), row_id)
    return F.when(F.octet_length(whole) > MAX_ID_BYTES,
                  F.concat(alias, F.lit("/sha256:"), F.sha2(row_id, 256))).otherwise(whole)


def _head(index: Column, doc_id: Column) -> Column:
    return F.concat(F.lit('"_index":'), json_string(index), F.lit(',"_id":'), json_string(doc_id))


def _fill_bound(pick: str) -> Column:
    """The lowest or highest version among the row's fill versions (NULL when nothing was filled)."""
    versions = F.map_values("filled")
    return F.when(F.size(versions) > 0, F.array_min(versions) if pick == "min" else F.array_max(versions))


def documents(newest: DataFrame, catalogue: Catalogue, tables: list[str], aliases: Mapping[str, str],
              targets: Mapping[str, str], refused: Mapping[str, Mapping[str, str]]) -> DataFrame:
    """`newest` (CHANGE rows of the search tables) → the SHIPPED columns. `aliases`: table → alias;
    `targets`: table → physical index written (the alias, or a rebuild's new index); `refused`:
    table → column → why Elasticsearch refused to map it (rows carrying a value there are rejected)."""
    return newest.select(*_document_columns(catalogue, tables, aliases, targets, refused))


@reused
def _document_columns(catalogue: Catalogue, tables: list[str], aliases: Mapping[str, str],
                      targets: Mapping[str, str], refused: Mapping[str, Mapping[str, str]]) -> list[Column | str]:
    table = F.col("table")
    alias = _lookup(aliases, table)
    target = _lookup(targets, table)
    raw_kinds = kinds(catalogue, tables)
    after = F.coalesce(F.col("after"), F.create_map().cast("map<string,string>"))
    keep = F.concat(F.col("unavailable"), F.map_keys("filled"))
    partial = F.map_filter(after, lambda k, _: ~F.array_contains(keep, k))
    tomb_id = _id(alias, F.col("row_id"))
    objects = _object_columns(catalogue, tables)
    version_json = F.concat(F.lit(f'"{VERSION_MAJOR}":'), F.col("version.major").cast("string"),
                            F.lit(f',"{VERSION_MINOR}":'), F.col("version.minor").cast("string"))
    return [
        "op", "moved", "table", alias.alias("alias"), target.alias("target"), "version", "origin",
        _error(after, refused).alias("error"), "row_id", "old_row_id", "unavailable", "filled",
        (F.size(keep) > 0).alias("has_keep"), _fill_bound("min").alias("fill_low"),
        _fill_bound("max").alias("fill_high"),
        # An `update` merges objects field by field: a json column's new value must replace, not merge.
        # Some json column of the table is in `partial` (the image's columns but the kept ones), without a lambda.
        (F.size(F.array_except(F.array_intersect(F.coalesce(objects[table], F.array().cast("array<string>")),
                                                 F.map_keys(after)), keep)) > 0)
        .alias("keeps_objects"),
        F.when(F.col("after").isNotNull(),
               _document(after, table, raw_kinds, _fields_by_table(after, table, catalogue, tables))).alias("doc"),
        F.when(F.col("after").isNotNull() & (F.size(keep) > 0), _document(partial, table, raw_kinds)).alias("partial"),
        F.concat(F.lit('{"alias":'), json_string(alias), F.lit(',"id":'), json_string(F.col("row_id")), F.lit(","),
                 version_json, F.lit("}")).alias("tomb_doc"),
        F.concat(F.lit("{"), _head(target, F.col("row_id")), F.lit(f",{_VERSION_SOURCE}}},{{"),
                 _head(F.lit(TOMBSTONES), tomb_id), F.lit(f",{_VERSION_SOURCE}}},")).alias("mget_pair"),
        _head(target, F.col("row_id")).alias("head"),
        _head(F.lit(TOMBSTONES), tomb_id).alias("tomb_head"),
    ]


def _lookup(mapping: Mapping[str, str], key: Column) -> Column:
    if not mapping:
        return F.lit(None).cast("string")
    return F.create_map(*[F.lit(part) for item in sorted(mapping.items()) for part in item])[key]


def _object_columns(catalogue: Catalogue, tables: list[str]) -> Column:
    """table → its json/jsonb columns (stored as objects)."""
    found = {table: [name for name, column in catalogue[table].columns.items()
                     if column.is_json and not column.is_array]
             for table in tables if table in catalogue}
    found = {table: names for table, names in found.items() if names}
    if not found:
        return F.create_map().cast("map<string,array<string>>")
    return F.create_map(*[part for table, names in sorted(found.items())
                          for part in (F.lit(table), F.array(*[F.lit(n) for n in names]))])


def _error(after: Column, refused: Mapping[str, Mapping[str, str]]) -> Column:
    """What is refused before Elasticsearch sees it: a column named like the sink's metadata, a value in a
    column Elasticsearch would not map."""
    names = F.map_keys(after)
    # Looked for in the names joined first: the lambda that finds the name runs only for such a row.
    clashes = F.concat(F.lit("\u0000"), F.array_join(names, "\u0000")).contains(f"\u0000{META_PREFIX}")
    clashing = F.filter(names, lambda k: k.startswith(META_PREFIX))
    error = F.when(clashes, F.concat(F.lit("column "), clashing[0],
                                                   F.lit(f" clashes with the sink's metadata prefix {META_PREFIX}")))
    for table, columns in sorted(refused.items()):
        for column, reason in sorted(columns.items()):
            error = error.when((F.col("table") == table) & after[column].isNotNull(), F.lit(reason))
    return error


# What the real-time writer (dev.tideline.writers.SearchChangeWriter) reads of each row: the columns
# it shares with the micro-batch shipper's rows, then its own.
_SHARED_COLUMNS = ("moved", "alias", "target", "version", "row_id", "old_row_id", "unavailable", "keeps_objects",
                   "doc", "partial", "tomb_doc", "head", "tomb_head")
WRITER_COLUMNS = ("kind", "origin", "letter", "touches", *_SHARED_COLUMNS, "old_head", "old_tomb_head")


def writer_rows(changes: DataFrame, catalogue: Catalogue, tables: list[str], aliases: Mapping[str, str],
                targets: Mapping[str, str], refused: Mapping[str, Mapping[str, str]], touches: Column,
                sink: str) -> DataFrame:
    """`changes` (CHANGE rows of the search tables, dead letters included, in partition order) → the
    WRITER_COLUMNS the JVM writer takes in Real-Time Mode: `kind` row (the same documents and request
    fragments the micro-batch shipper joins, plus the old key's heads for a primary-key move), truncate,
    letter (a dead letter, ready) or pass (a tombstone). `touches`: per change, the JSON lookups of the nested views it
    may affect, which the writer produces once the change is applied (an empty array without views)."""
    from spark_jobs.changes.dead_letters import letter_value
    from spark_jobs.changes.stream import writer_kind

    undecoded = F.col("error").isNotNull()
    prepared = changes.select(
        *_document_columns(catalogue, tables, aliases, targets, refused),
        undecoded.alias("undecoded"), "letter_value",
        F.when(undecoded, letter_value(f"decode:{sink}", F.col("error"))).alias("decode_letter"),
        F.when(~undecoded, touches).alias("touches"),
    )
    truncate, refused_here = F.col("op") == "t", F.col("error").isNotNull()
    return prepared.select(
        writer_kind(F.col("undecoded"), refused_here).alias("kind"),
        "origin",
        F.coalesce(F.col("decode_letter"),
                   F.when(~truncate & refused_here, letter_value(f"apply:{sink}", F.col("error"))))
        .alias("letter"),
        "touches", *_SHARED_COLUMNS,
        F.when(F.col("old_row_id").isNotNull(), _head(F.col("target"), F.col("old_row_id"))).alias("old_head"),
        F.when(F.col("old_row_id").isNotNull(), _head(F.lit(TOMBSTONES), _id(F.col("alias"), F.col("old_row_id"))))
        .alias("old_tomb_head"),
    )

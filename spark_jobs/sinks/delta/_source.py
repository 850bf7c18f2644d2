"""A table's changes as the source rows of its MERGE: typed columns, the keep map, the version.

Pure DataFrame → DataFrame functions over `CHANGE` rows of one table (tests/unit/test_delta_frames.py
runs them on tiny frames). Nothing here reads or writes a table.

- `rejected`: the changes that cannot be applied, as CHANGE rows with `error` set (the dead-letter
  topic's): a value the column's type cannot hold, an incompatible type change, a key that is not the
  table's primary key. Never a failed batch.
- `merge_source`: the others, one row each, with the columns of the table (typed), the version and
  commit time, `_op`, `_keep` (column → the version the stored row must have reached to keep its
  own value: (0, 0) for an unchanged-TOAST column, the fill version for one filled from an older
  change: the fill-version rule) and the row's tombstone version (`_tomb_major/_tomb_minor`).
- `key_of_row_id` / `image`: a row id back to typed key columns, and a row as a text map: what a
  primary-key move's create takes its unchanged-TOAST columns from (`with_images`).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.changes.newest import keep_versions
from spark_jobs.changes.schema import FIELDS
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.delta._merge import KEEP, OP, TOMB_MAJOR, TOMB_MINOR
from spark_jobs.sinks.delta._plan import TablePlan
from spark_jobs.sinks.delta._types import as_text, typed, unreadable

ROW_ID = "_row_id"


def _text(plan: TablePlan, column: str) -> Column:
    """A column's text in a change: a key column from the key (a delete has no after image)."""
    after = F.try_element_at(F.col("after"), F.lit(column))
    if column in plan.keys:
        return F.coalesce(F.try_element_at(F.col("key"), F.lit(column)), after)
    return after


def _error(plan: TablePlan) -> Column:
    """Why a change cannot be applied (the first reason found), NULL if it can."""
    keys = F.array(*(F.lit(k) for k in sorted(plan.keys)))
    key_reason = F.when(
        F.array_sort(F.map_keys(F.col("key"))) != keys,
        F.concat(F.lit(f"{plan.table}: primary key ("), F.array_join(F.map_keys(F.col("key")), ", "),
                 F.lit(f") is not the table's ({', '.join(plan.keys)})")),
    )
    upsert = F.col("after").isNotNull()
    refused = [F.when(upsert & F.map_contains_key(F.col("after"), F.lit(c)), F.lit(reason))
               for c, reason in plan.refused.items()]
    unstorable = []
    for column, dtype in plan.fields.items():
        if column in plan.refused:
            continue
        text = _text(plan, column)
        reason = F.concat(F.lit(f"{plan.table}.{column}: cannot store "), F.substring(text, 1, 80),
                          F.lit(f" as {dtype.simpleString()}"))
        unstorable.append(F.when(unreadable(text, typed(text, dtype), dtype), reason))
    return F.coalesce(key_reason, *refused, *unstorable)


def rejected(changes: DataFrame, plan: TablePlan) -> DataFrame:
    """The table's changes that cannot be applied, as CHANGE rows with `error` set."""
    return changes.withColumn("error", _error(plan)).where(F.col("error").isNotNull()).select(*FIELDS)


def merge_source(changes: DataFrame, plan: TablePlan) -> DataFrame:
    """The table's applicable changes (CHANGE rows plus `tomb`, the row's newest tombstone or NULL) as
    MERGE source rows: the table's columns typed, then the metadata the MERGE's conditions read."""
    tomb = F.col("tomb") if "tomb" in changes.columns else F.lit(None).cast("struct<major:bigint,minor:bigint>")
    return changes.where(_error(plan).isNull()).select(
        *(typed(_text(plan, column), dtype).alias(column) for column, dtype in plan.fields.items()),
        F.col("version.major").alias(VERSION_MAJOR), F.col("version.minor").alias(VERSION_MINOR),
        F.col("commit_ts").alias(COMMIT_TS), F.col("op").alias(OP), keep_versions().alias(KEEP),
        tomb["major"].alias(TOMB_MAJOR), tomb["minor"].alias(TOMB_MINOR), F.col("row_id").alias(ROW_ID),
    )


def key_of_row_id(row_id: Column, plan: TablePlan) -> list[Column]:
    """The typed key columns a row id names (envelope.row_id: the value's text for one column, a JSON
    list for a composite key). A hashed id (a key over 512 bytes) names nothing: NULL."""
    if len(plan.keys) == 1:
        (only,) = plan.keys
        return [typed(row_id, plan.fields[only]).alias(only)]
    parts = F.from_json(row_id, "array<string>")
    return [typed(parts[index], plan.fields[key]).alias(key) for index, key in enumerate(plan.keys)]


def image(plan: TablePlan) -> Column:
    """A stored row's data columns (not its key) as a text map, NULL values included."""
    columns = plan.data_columns
    return F.map_from_arrays(F.array(*(F.lit(c) for c in columns)).cast("array<string>"),
                             F.array(*(as_text(F.col(c), plan.fields[c]) for c in columns)).cast("array<string>"))


def with_images(changes: DataFrame, images: DataFrame) -> DataFrame:
    """`changes` (CHANGE rows) with each primary-key move's unchanged-TOAST columns taken from the old
    key's row: `images` has one row per old row id (`_old`) with that row as a text map (`_image`)."""
    joined = changes.join(images, changes["old_row_id"] == images["_old"], "left")
    wanted = F.map_filter(F.col("_image"), lambda k, _: F.array_contains(F.col("unavailable"), k))
    fill = F.col("_image").isNotNull() & F.col("after").isNotNull()
    return joined.select(
        *(F.when(fill, F.map_concat(F.col("after"), wanted)).otherwise(F.col("after")).alias("after") if name == "after"
          else F.when(fill, F.array_except(F.col("unavailable"), F.map_keys(wanted))).otherwise(F.col("unavailable"))
          .alias("unavailable") if name == "unavailable"
          else F.col(name) for name in changes.columns)
    )


__all__ = ["KEEP", "OP", "ROW_ID", "TOMB_MAJOR", "TOMB_MINOR", "image", "key_of_row_id", "merge_source",
           "rejected", "with_images"]

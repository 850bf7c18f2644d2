"""The newest change per row of a micro-batch, in the JVM: one grouping, one fold per row.

Per (table, row) the batch's changes are folded in version order (`aggregate` over the sorted
list); per table its truncates likewise; a dead letter is a group of its own and passes through.
The fold keeps the newest change, and fills each of its unchanged-TOAST columns from the newest
older change since the row's last delete that carried the column, recording in `filled` the version
that value came from. A sink whose row is at least that new keeps its own value instead (the
fill-version rule, docs/apply.md "TOAST and partial images"): the older change may be a stale
redelivery, so its value is not trusted over the sink's. An equal version is a duplicate.

The fold is associative over version order, so its result does not depend on how Spark groups or
orders a batch; tests/unit/test_newest.py checks it against every order of small histories.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.changes.schema import CHANGE, FIELDS
from spark_jobs.runtime.expressions import reused


def group_column() -> Column:
    """What a batch is grouped on: the row, the table for truncates, the record for dead letters."""
    origin = F.col("origin")
    return (
        F.when(F.col("error").isNotNull(),
               F.concat_ws("\u0000", F.lit("\u0001letter"), origin["topic"], origin["partition"], origin["offset"]))
        .when(F.col("op") == "t", F.concat_ws("\u0000", F.col("table"), F.lit("\u0001truncate")))
        .otherwise(F.concat_ws("\u0000", F.col("table"), F.col("row_id")))
    )


def _compare(left: Column, right: Column) -> Column:
    """A comparator of two changes by version, for array_sort."""
    return (F.when(left["version"] < right["version"], F.lit(-1))
            .when(left["version"] > right["version"], F.lit(1)).otherwise(F.lit(0)))


def _with(change: Column, **replaced: Column) -> Column:
    """`change` (a CHANGE struct) with some fields replaced, in CHANGE's field order."""
    return F.struct(*(replaced[name].alias(name) if name in replaced else change[name].alias(name) for name in FIELDS))


def newer(older: Column, change: Column) -> Column:
    """`change` (not older than `older`, of the same row) with its unchanged-TOAST columns filled from
    `older`'s image; a delete on either side breaks the chain (nothing is filled across it)."""
    wanted = F.map_filter(older["after"], lambda k, _: F.array_contains(change["unavailable"], k))
    filled = F.transform_values(wanted, lambda k, _: F.coalesce(older["filled"][k], older["version"]))
    merged = _with(
        change,
        after=F.map_concat(change["after"], wanted),
        unavailable=F.array_except(change["unavailable"], F.map_keys(older["after"])),
        filled=F.map_concat(change["filled"], filled),
        # The row moved here from another key in this batch: what is still unavailable is that key's.
        old_row_id=F.coalesce(change["old_row_id"], older["old_row_id"]),
    )
    return F.when(change["after"].isNull() | older["after"].isNull(), change).otherwise(merged)


def newest_per_row(changes: DataFrame) -> DataFrame:
    """One `CHANGE` row per (table, row), per table's truncates and per dead letter: the newest, with
    unchanged-TOAST columns filled as the module says. One shuffle (Spark's default parallelism), and a
    broadcast of the batch's primary-key moves (`_moved_images`)."""
    group, gathered, folded = _folding()
    return changes.unionByName(_moved_images(changes)).groupBy(group).agg(gathered).select(folded).select("_c.*")


def _moved_images(changes: DataFrame) -> DataFrame:
    """A primary-key move (`old_row_id`) whose unchanged-TOAST columns the row had under its old key:
    the batch's upserts of the old key older than the move, given the new key, so that the fold fills
    the move from them like any older change of the row (`filled` records their version). Without
    them the newest change of the old key, the move's delete, would hide an update of the same batch,
    and a sink would take the value it held before that update."""
    moves = changes.where(F.col("error").isNull() & F.col("after").isNotNull() & F.col("old_row_id").isNotNull()
                          & (F.size("unavailable") > 0)).select(
        F.col("table").alias("_table"), F.col("old_row_id").alias("_old"), F.col("row_id").alias("_new"),
        F.col("key").alias("_key"), F.col("version").alias("_move"))
    upserts = changes.where(F.col("error").isNull() & F.col("after").isNotNull())
    older_of_old_key = ((upserts["table"] == moves["_table"]) & (upserts["row_id"] == moves["_old"])
                        & (upserts["version"] < moves["_move"]))
    found = upserts.join(F.broadcast(moves), older_of_old_key)
    renamed = {"row_id": F.col("_new"), "key": F.col("_key"), "old_row_id": F.lit(None).cast("string")}
    return found.select(*(renamed.get(name, F.col(name)).alias(name) for name in FIELDS))


@reused
def _folding() -> tuple[Column, Column, Column]:
    """The grouping, the gathering of a group's changes and their fold (built once, runtime/expressions.py)."""
    row = F.struct(*(F.col(name) for name in FIELDS))
    changes = F.col("_changes")
    ordered = F.array_sort(changes, _compare)
    # Most rows change once per batch: their group is not sorted (the sort's comparator is a lambda,
    # run interpreted).
    folded = F.when(F.size(changes) == 1, changes[0]).otherwise(
        F.aggregate(F.slice(ordered, 2, F.size(ordered)), ordered[0], newer)
    )
    return group_column().alias("_group"), F.collect_list(row).alias("_changes"), folded.alias("_c")


def keep_versions() -> Column:
    """Of a CHANGE row: each column that may keep the sink's stored value, with the version the stored
    row must have reached for that (the fill-version rule above): (0, 0) for an unchanged-TOAST column,
    the fill version for a filled one. No lambda (`array_repeat`), so generated code goes through it."""
    unavailable = F.coalesce(F.col("unavailable"), F.array().cast("array<string>"))
    zero = F.struct(F.lit(0).cast("bigint").alias("major"), F.lit(0).cast("bigint").alias("minor"))
    zeros = F.map_from_arrays(unavailable, F.array_repeat(zero, F.size(unavailable)))
    return F.map_concat(zeros, F.coalesce(F.col("filled"), F.create_map().cast(CHANGE["filled"].dataType)))


__all__ = ["CHANGE", "group_column", "keep_versions", "newer", "newest_per_row"]

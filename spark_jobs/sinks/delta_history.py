"""SCD type 2 history tables: every committed version of each row of the tables marked
`warehouse: {history: true}`, in `<warehouse_dir>/<table>_history` (docs/sinks/delta.md).

Per micro-batch, from every decoded change of the batch (not only the newest per row):

1. `row_versions` (spark_jobs/scd2.py) keeps each row's distinct versions and fills
   unchanged-TOAST columns from the previous version in the batch;
2. the batch's versions are put beside the stored versions of the same rows; a (primary key,
   version) the table holds already is taken as stored, so a replayed batch or a re-delivered
   record never adds a second copy of a version;
3. the affected rows' intervals are computed over all their versions (a window over the key, in
   version order): valid_to = the next version's valid_from, is_current = newest and not a
   delete. A version that arrives late, between two stored ones, closes and is closed correctly.
   Columns a version could not fill in step 1 are taken from the stored version before it;
4. one MERGE per table inserts the new versions and updates the stored ones whose values change
   (one MERGE, not an insert and then an update: each costs a scan of the table and a commit).
   A replay changes nothing and commits nothing.

A truncate closes every row that was live at its version with a version of op 't'.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, LongType, StringType, StructField, TimestampType

from spark_jobs.changes import Change
from spark_jobs.config import history_table
from spark_jobs.merge import ZERO
from spark_jobs.scd2 import ENDS, row_versions
from spark_jobs.sinks.base import COMMIT_TS, KEYS_PROPERTY, VERSION_MAJOR, VERSION_MINOR, Rejected
from spark_jobs.sinks.delta import (
    _KEEP,
    _OP,
    _collect_facts,
    _delta,
    _encode,
    _plan,
    _q,
    _TableFacts,
    _TablePlan,
    evolve,
    stored_schema,
)

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("tideline.history")

VALID_FROM, VALID_TO, IS_CURRENT, SOURCE_OP = "valid_from", "valid_to", "is_current", "source_op"
UNAVAILABLE = "tl_unavailable"  # columns whose value no earlier version could supply (normally empty)
HISTORY_META = [
    StructField(SOURCE_OP, StringType()), StructField(VALID_FROM, TimestampType()),
    StructField(VALID_TO, TimestampType()), StructField(IS_CURRENT, BooleanType()),
    StructField(VERSION_MAJOR, LongType()), StructField(VERSION_MINOR, LongType()),
    StructField(UNAVAILABLE, ArrayType(StringType())),
]


class DeltaHistory:
    """The history tables of one warehouse; driven by `DeltaSink.write_history` on the driver."""

    def __init__(self, warehouse_dir: str, tables: list[str]) -> None:
        self.warehouse_dir = warehouse_dir
        self.tables = frozenset(tables)

    def path(self, table: str) -> str:
        return f"{self.warehouse_dir}/{history_table(table)}"

    def write(self, spark: SparkSession, changes: RDD[Change]) -> list[Rejected]:
        if not self.tables:
            return []
        tables = self.tables
        versions = changes.filter(lambda change: change.table in tables).mapPartitions(row_versions).persist()
        try:
            facts = _collect_facts(versions)
            rejected: list[Rejected] = []
            for table in sorted(facts):
                if facts[table].keys:
                    started = time.monotonic()
                    rows = versions.filter(lambda change, t=table: change.table == t and change.op != "t")
                    rejected += self._apply_table(spark, table, facts[table], rows)
                    log.info("history %s: written in %.0f ms", table, (time.monotonic() - started) * 1000)
                if facts[table].truncate is not None:
                    truncates = versions.filter(lambda change, t=table: change.table == t and change.op == "t")
                    for truncate in truncates.collect():  # a handful at most
                        self._truncate(spark, table, truncate)
            return rejected
        finally:
            versions.unpersist()

    def _apply_table(self, spark: SparkSession, table: str, facts: _TableFacts, changes: RDD[Change]) -> list[Rejected]:
        path = self.path(table)
        stored = _data_columns(stored_schema(spark, path))
        plan = _plan(table, facts, stored or {})
        evolve(spark, path, plan, stored, HISTORY_META, {KEYS_PROPERTY: ",".join(plan.keys)})
        encoded = changes.map(partial(_encode, plan=plan)).persist()
        try:
            rejected = encoded.filter(lambda pair: pair[1] is not None).map(lambda pair: pair[1]).collect()
            rows = encoded.filter(lambda pair: pair[0] is not None).map(lambda pair: pair[0])
            source = spark.createDataFrame(rows, plan.source_schema())
            self._merge_versions(spark, path, plan.keys, _as_versions(source, plan))
        finally:
            encoded.unpersist()
        return rejected

    def _merge_versions(self, spark: SparkSession, path: str, keys: tuple[str, ...] | list[str], arriving: DataFrame) -> None:
        """One MERGE per batch: each arriving version the table lacks (by primary key and version) is
        inserted, and each stored version of the same rows whose interval, current flag or inherited
        values change is updated. `arriving` has the history table's columns (`_as_versions`)."""
        history = spark.read.format("delta").load(path)
        keys = list(keys)
        versions = [*keys, VERSION_MAJOR, VERSION_MINOR]
        # In the table's column order and types; a column this batch does not carry is NULL.
        arriving = arriving.select(*(
            (F.col(_q(f.name)) if f.name in arriving.columns else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in history.schema.fields
        ))
        stored = history.join(arriving.select(*(_q(k) for k in keys)).distinct(), keys, "left_semi")
        # A version stored already (a replay, a re-delivered record) is taken as stored: never added twice.
        first = Window.partitionBy(*(_q(c) for c in versions)).orderBy(F.col("_stored").desc())
        rows = (
            stored.withColumn("_stored", F.lit(True)).unionByName(arriving.withColumn("_stored", F.lit(False)))
            .withColumn("_copy", F.row_number().over(first)).where(F.col("_copy") == 1).drop("_copy")
        )
        data = [f.name for f in history.schema.fields if f.name not in keys and f.name not in _META_NAMES]
        order = Window.partitionBy(*(_q(k) for k in keys)).orderBy(VERSION_MAJOR, VERSION_MINOR)
        earlier = order.rowsBetween(Window.unboundedPreceding, -1)
        # An unchanged-TOAST column takes its value from the nearest earlier version that had it
        # (wrapped in a struct, so a real NULL counts as known): a run of such versions fills at once.
        known = {
            c: F.last(F.when(~F.array_contains(UNAVAILABLE, c), F.struct(F.col(_q(c)).alias("v"))), ignorenulls=True)
            .over(earlier)
            for c in data
        }
        inherited = {
            c: F.when(F.array_contains(UNAVAILABLE, c) & known[c].isNotNull(), known[c].getField("v")).otherwise(F.col(_q(c)))
            for c in data
        }
        found = F.array(*(F.when(known[c].isNotNull(), F.lit(c)) for c in data)) if data else F.array()
        wanted = rows.select(
            *(_q(k) for k in keys), VERSION_MAJOR, VERSION_MINOR, SOURCE_OP, VALID_FROM, "_stored",
            F.lead(VALID_FROM).over(order).alias("_valid_to"),
            (F.lead(VERSION_MAJOR).over(order).isNull() & ~F.col(SOURCE_OP).isin(*ENDS)).alias("_is_current"),
            F.array_except(F.col(UNAVAILABLE), found).alias("_unavailable"),
            *(expr.alias(f"_v_{c}") for c, expr in inherited.items()), F.col(VALID_TO), F.col(IS_CURRENT),
            F.size(UNAVAILABLE).alias("_had_unavailable"),
        )
        changed = wanted.where(
            ~F.col("_stored") | ~F.col(VALID_TO).eqNullSafe(F.col("_valid_to")) | (F.col(IS_CURRENT) != F.col("_is_current"))
            | (F.col("_had_unavailable") != F.size("_unavailable"))
        ).persist()
        try:
            if changed.isEmpty():
                return  # a replay: nothing to commit
            updates = {VALID_TO: "s._valid_to", IS_CURRENT: "s._is_current", UNAVAILABLE: "s._unavailable"}
            updates |= {_q(c): f"s.{_q('_v_' + c)}" for c in data}
            inserts = updates | {_q(c): f"s.{_q(c)}" for c in (*versions, SOURCE_OP, VALID_FROM)}
            (
                _delta().forPath(spark, path).alias("t")
                .merge(changed.alias("s"), _same_version(keys))
                .whenMatchedUpdate(set=updates)
                .whenNotMatchedInsert(values=inserts)
                .execute()
            )
        finally:
            changed.unpersist()

    def _truncate(self, spark: SparkSession, table: str, truncate: Change) -> None:
        """Close every row live just before the truncate with a version of op 't' at the truncate's
        version (inserted if absent, so a replayed truncate adds nothing)."""
        path = self.path(table)
        if not _delta().isDeltaTable(spark, path):
            return
        history = spark.read.format("delta").load(path)
        columns = [f.name for f in history.schema.fields if f.name not in _META_NAMES]
        keys = _key_columns(spark, path)
        major, minor = truncate.sequence
        below = (F.col(VERSION_MAJOR) < major) | ((F.col(VERSION_MAJOR) == major) & (F.col(VERSION_MINOR) < minor))
        newest_first = Window.partitionBy(*(_q(k) for k in keys)).orderBy(
            F.col(VERSION_MAJOR).desc(), F.col(VERSION_MINOR).desc()
        )
        live = (
            history.where(below).withColumn("_rank", F.row_number().over(newest_first))
            .where((F.col("_rank") == 1) & ~F.col(SOURCE_OP).isin(*ENDS))
        )
        committed = None if truncate.commit_ts_ms is None else truncate.commit_ts_ms / 1000
        closing = live.select(
            *(F.col(_q(c)) if c in keys else F.lit(None).cast(history.schema[c].dataType).alias(c) for c in columns),
            F.lit("t").alias(SOURCE_OP), F.lit(committed).cast(TimestampType()).alias(VALID_FROM),
            F.lit(None).cast(TimestampType()).alias(VALID_TO), F.lit(False).alias(IS_CURRENT),
            F.lit(major).cast(LongType()).alias(VERSION_MAJOR), F.lit(minor).cast(LongType()).alias(VERSION_MINOR),
            F.array().cast(ArrayType(StringType())).alias(UNAVAILABLE),
        )
        self._merge_versions(spark, path, keys, closing)


def _as_versions(source: DataFrame, plan: _TablePlan) -> DataFrame:
    """The batch's encoded changes as history rows (interval and current flag are set by the MERGE)."""
    return source.select(
        *(F.col(_q(c)) for c in plan.fields),
        F.col(_OP).alias(SOURCE_OP), F.col(COMMIT_TS).alias(VALID_FROM),
        F.lit(None).cast(TimestampType()).alias(VALID_TO), F.lit(False).alias(IS_CURRENT),
        F.col(VERSION_MAJOR), F.col(VERSION_MINOR), _unavailable(F.col(_KEEP)).alias(UNAVAILABLE),
    )


def _unavailable(keep: Column) -> Column:
    """The unchanged-TOAST columns no earlier version in the batch filled: those `merge.keep_from`
    keeps from any stored version (ZERO); a filled column names the real version it came from."""
    def from_any_version(_: Column, version: Column) -> Column:
        return (version[VERSION_MAJOR] == ZERO[0]) & (version[VERSION_MINOR] == ZERO[1])

    return F.array_sort(F.map_keys(F.map_filter(keep, from_any_version)))


_META_NAMES = frozenset(field.name for field in HISTORY_META)


def _key_columns(spark: SparkSession, path: str) -> list[str]:
    """The history table's primary-key columns, kept in its table properties when it is created."""
    properties = spark.sql(f"SHOW TBLPROPERTIES delta.{_q(path)}").collect()
    keys = next((row["value"] for row in properties if row["key"] == KEYS_PROPERTY), "")
    return [k for k in keys.split(",") if k]


def _data_columns(stored: dict | None) -> dict | None:
    return None if stored is None else {c: t for c, t in stored.items() if c not in _META_NAMES}


def _same_version(keys: tuple[str, ...] | list[str]) -> str:
    on = [f"t.{_q(k)} <=> s.{_q(k)}" for k in keys]
    return " AND ".join([*on, f"t.{VERSION_MAJOR} = s.{VERSION_MAJOR}", f"t.{VERSION_MINOR} = s.{VERSION_MINOR}"])

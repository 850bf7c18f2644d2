"""Event-time window tables: sum(value) and count(*) per window of a table's rows, from a current-state
table of it (the analytics query's own copy, spark_jobs/sinks/delta_analytics.py), with a watermark
and recorded late changes (docs/sinks/delta.md).

What the figures mean: the rows as they are now (the current state), not the first image of each row.
A change data capture stream carries edits and deletes, which an append-only streaming aggregation
(Spark's withWatermark + window) cannot retract; and the demo's order is inserted with total 0 and
given its total by an update in the same transaction. So the analytics query, after MERGEing its copy
of a table, recomputes the windows that are still open from it, and the watermark decides which are open:

- watermark = the newest event time the table has held, minus `allowed_lateness_seconds`; it never
  goes back (kept in `_tideline/window_watermarks`), and a batch uses the one left by the batches
  before it, as Spark does;
- a window whose end is at or below the watermark is closed: its figures no longer change;
- a change that would alter a closed window (a new row in it, a deleted or edited one) is late: its
  effect on that window (value and count delta, relative to the row the warehouse held) is recorded
  in `<name>_late` with the reason, and counted in the driver's log. So for every window,
  figures + the sum of its late deltas = the aggregate over the source's rows now.

Every step is idempotent: open windows are recomputed (not incremented), late records are inserted
if absent by (window, row, version) and written before the MERGE that would hide their delta.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from spark_jobs.config import WindowSpec, WindowView, late_table
from spark_jobs.sinks.base import VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.delta import _DOC_ID, _KEEP, _OP, _TablePlan, _delta, _newer, _q, create_table

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("tideline.windows")

SIZE, SLIDE, START, END = "window_size_seconds", "window_slide_seconds", "window_start", "window_end"
VALUE_SUM, ROW_COUNT = "value_sum", "row_count"
VALUE_DELTA, COUNT_DELTA, ROW_ID, WATERMARK, REASON = "value_delta", "count_delta", "row_id", "watermark", "reason"
_WATERMARKS_SCHEMA = StructType([StructField("view", StringType()), StructField("watermark", TimestampType())])


class DeltaWindows:
    """The window tables of one warehouse, refreshed by a `DeltaSink` after each MERGE of their table."""

    def __init__(self, warehouse_dir: str, views: dict[str, WindowView]) -> None:
        self.warehouse_dir = warehouse_dir
        self.views = dict(views)
        self._created: set[str] = set()  # tables known to exist: createIfNotExists reads the log each time
        self._batch_watermark: dict[str, datetime | None] = {}

    def _ensure(self, spark: SparkSession, path: str, schema: StructType) -> None:
        if path not in self._created:
            create_table(spark, path, schema)
            self._created.add(path)

    def path(self, name: str) -> str:
        return f"{self.warehouse_dir}/{name}"

    @property
    def watermarks_path(self) -> str:
        return f"{self.warehouse_dir}/_tideline/window_watermarks"

    def setup(self, spark: SparkSession) -> None:
        if self.views:
            create_table(spark, self.watermarks_path, _WATERMARKS_SCHEMA)

    def _of(self, table: str) -> dict[str, WindowView]:
        return {name: view for name, view in self.views.items() if view.table == table}

    def watermark(self, spark: SparkSession, name: str) -> datetime | None:
        """The highest watermark recorded for the view (the table only gains rows: see `_raise_watermark`)."""
        table = spark.read.format("delta").load(self.watermarks_path)
        return table.where(F.col("view") == name).agg(F.max("watermark")).first()[0]

    # -------------------------------------------------------------- late changes (before the MERGE)

    def record_late(self, spark: SparkSession, plan: _TablePlan, fresh: DataFrame, current_path: str) -> None:
        """Record the changes of `fresh` that would alter a closed window of `plan.table`."""
        for name, view in self._of(plan.table).items():
            stored = self._batch_watermark[name] = self.watermark(spark, name)  # the same one for this batch's refresh
            if stored is None or not _delta().isDeltaTable(spark, current_path):
                continue  # no window is closed yet
            late = self._late(spark, view, plan, fresh, current_path, _at(stored)).persist()
            try:
                count = late.count()
                if count:
                    self._insert_late(spark, name, late)
                    log.warning("%s: %d window figures changed after their window closed (allowed lateness %ss): "
                                "recorded in %s", name, count, view.allowed_lateness_seconds, self.path(late_table(name)))
            finally:
                late.unpersist()

    def _late(
        self, spark: SparkSession, view: WindowView, plan: _TablePlan, fresh: DataFrame, current_path: str, watermark: Column
    ) -> DataFrame:
        time_column, value_column = view.time_column, view.value_column
        held = spark.read.format("delta").load(current_path).select(
            *(F.col(_q(k)) for k in plan.keys),
            F.col(_q(time_column)).alias("_old_time"), F.col(_q(value_column)).alias("_old_value"),
            F.col(VERSION_MAJOR).alias("_old_major"), F.col(VERSION_MINOR).alias("_old_minor"),
        )
        joined = fresh.join(held, list(plan.keys), "left")
        wins = F.col("_old_major").isNull() | _newer(
            F.col(VERSION_MAJOR), F.col(VERSION_MINOR), F.col("_old_major"), F.col("_old_minor")
        )
        joined = joined.where(wins)

        def arriving(column: str, old: str) -> Column:
            if column not in plan.fields:
                return F.lit(None)
            # merge.kept_columns: the held value stays where the held row is at least the version keep_from names.
            needed = F.col(_KEEP)[column]
            kept = needed.isNotNull() & ~_newer(
                needed[VERSION_MAJOR], needed[VERSION_MINOR], F.col("_old_major"), F.col("_old_minor")
            )
            return F.when(F.col(_OP) == "d", F.lit(None)).when(kept, F.col(old)).otherwise(F.col(_q(column)))

        identity = [F.col(_DOC_ID).alias(ROW_ID), F.col(VERSION_MAJOR), F.col(VERSION_MINOR)]
        old = joined.where(F.col("_old_time").isNotNull()).select(
            *identity, F.col("_old_time").alias("_time"), (-F.col("_old_value")).alias("_value"), F.lit(-1).alias("_count")
        )
        new = joined.select(
            *identity, arriving(time_column, "_old_time").cast(TimestampType()).alias("_time"),
            arriving(value_column, "_old_value").alias("_value"), F.lit(1).alias("_count"),
        ).where(F.col("_time").isNotNull())
        contributions = _in_windows(old.unionByName(new, allowMissingColumns=False), view.windows)
        deltas = contributions.groupBy(ROW_ID, VERSION_MAJOR, VERSION_MINOR, SIZE, SLIDE, START, END).agg(
            F.sum("_value").alias(VALUE_DELTA), F.sum("_count").alias(COUNT_DELTA)
        )
        return deltas.where(
            (F.col(END) <= watermark)
            & ((F.coalesce(F.col(VALUE_DELTA), F.lit(0)) != 0) | (F.col(COUNT_DELTA) != 0))
        ).select(
            SIZE, SLIDE, START, END, ROW_ID, VERSION_MAJOR, VERSION_MINOR, VALUE_DELTA, COUNT_DELTA,
            watermark.alias(WATERMARK),
            F.lit(f"window closed: its end is not after the watermark (newest event time minus "
                  f"{view.allowed_lateness_seconds} s)").alias(REASON),
            F.current_timestamp().alias("recorded_at"),
        )

    def _insert_late(self, spark: SparkSession, name: str, late: DataFrame) -> None:
        path = self.path(late_table(name))
        self._ensure(spark, path, late.schema)
        on = " AND ".join(f"t.{c} = s.{c}" for c in (SIZE, SLIDE, START, ROW_ID, VERSION_MAJOR, VERSION_MINOR))
        _delta().forPath(spark, path).alias("t").merge(late.alias("s"), on).whenNotMatchedInsertAll().execute()

    # -------------------------------------------------------------- open windows (after the MERGE)

    def refresh(self, spark: SparkSession, table: str, current_path: str) -> None:
        """Recompute every open window of `table`'s views from its current state, then raise the watermark."""
        for name, view in self._of(table).items():
            if not _delta().isDeltaTable(spark, current_path):
                continue
            rows = spark.read.format("delta").load(current_path)
            missing = [c for c in (view.time_column, view.value_column) if c not in rows.columns]
            if missing:
                raise ValueError(f"windows.{name}: the warehouse table {table} has no column {', '.join(missing)}")
            # The watermark record_late used (one read per batch), else the stored one (a truncate).
            known = name in self._batch_watermark
            stored = self._batch_watermark.pop(name) if known else self.watermark(spark, name)
            started = time.monotonic()
            self._recompute(spark, name, view, rows, None if stored is None else _at(stored))
            self._raise_watermark(spark, name, view, rows, stored)
            log.info("windows %s: open windows and watermark written in %.0f ms", name, (time.monotonic() - started) * 1000)

    def _recompute(self, spark: SparkSession, name: str, view: WindowView, rows: DataFrame, watermark: Column | None) -> None:
        timed = rows.select(F.col(_q(view.time_column)).cast(TimestampType()).alias("_time"),
                            F.col(_q(view.value_column)).alias("_value")).where(F.col("_time").isNotNull())
        if watermark is not None:  # only rows that can be in an open window
            longest = max(spec.size_seconds for spec in view.windows)
            timed = timed.where(F.col("_time") > watermark - F.expr(f"INTERVAL {longest} SECONDS"))
        windows = _in_windows(timed.withColumn("_count", F.lit(1)), view.windows)
        if watermark is not None:
            windows = windows.where(F.col(END) > watermark)
        figures = windows.groupBy(SIZE, SLIDE, START, END).agg(
            F.sum("_value").alias(VALUE_SUM), F.count(F.lit(1)).alias(ROW_COUNT)
        )
        path = self.path(name)
        self._ensure(spark, path, figures.schema)
        merge = _delta().forPath(spark, path).alias("t").merge(
            figures.alias("s"), " AND ".join(f"t.{c} = s.{c}" for c in (SIZE, SLIDE, START))
        )
        differs = f"NOT (t.{VALUE_SUM} <=> s.{VALUE_SUM}) OR t.{ROW_COUNT} <> s.{ROW_COUNT}"
        merge = merge.whenMatchedUpdate(differs, set={VALUE_SUM: f"s.{VALUE_SUM}", ROW_COUNT: f"s.{ROW_COUNT}"})
        merge = merge.whenNotMatchedInsertAll()
        if watermark is None:
            merge = merge.whenNotMatchedBySourceDelete()
        else:
            merge = merge.whenNotMatchedBySourceDelete(F.col(f"t.{END}") > watermark)
        merge.execute()

    def _raise_watermark(
        self, spark: SparkSession, name: str, view: WindowView, rows: DataFrame, stored: datetime | None
    ) -> None:
        """Append the new watermark if it is higher than the stored one. Appended, not MERGEd: the
        reader takes the maximum, which a lower or repeated row cannot change, and an append is one
        Spark job where a MERGE is several (this runs in every batch that changes the table)."""
        lateness = F.expr(f"INTERVAL {view.allowed_lateness_seconds} SECONDS")
        candidate = rows.select((F.max(F.col(_q(view.time_column)).cast(TimestampType())) - lateness)).first()[0]
        if candidate is not None and (stored is None or candidate > stored):
            spark.createDataFrame([(name, candidate)], _WATERMARKS_SCHEMA).write.format("delta").mode("append").save(
                self.watermarks_path
            )


def _at(moment: datetime) -> Column:
    return F.lit(moment).cast(TimestampType())


def _in_windows(rows: DataFrame, specs: list[WindowSpec]) -> DataFrame:
    """Each row once per window of each spec containing its `_time` (epoch-aligned, as
    spark_jobs.event_windows.window_starts): columns SIZE, SLIDE, START, END added."""
    assigned = None
    for spec in specs:
        slide_us, count = spec.slide * 1_000_000, spec.size_seconds // spec.slide
        micros = F.unix_micros(F.col("_time"))
        last_start = micros - F.pmod(micros, F.lit(slide_us))  # floor to the slide, also before the epoch
        one = (
            rows.select("*", F.explode(F.sequence(F.lit(0), F.lit(count - 1))).alias("_k"))
            .select(
                *rows.columns, F.lit(spec.size_seconds).alias(SIZE), F.lit(spec.slide).alias(SLIDE),
                F.timestamp_micros(last_start - F.col("_k") * F.lit(slide_us)).alias(START),
            )
            .withColumn(END, F.col(START) + F.expr(f"INTERVAL {spec.size_seconds} SECONDS"))
        )
        assigned = one if assigned is None else assigned.unionByName(one)
    assert assigned is not None
    return assigned

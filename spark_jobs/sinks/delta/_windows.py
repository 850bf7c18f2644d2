"""Event-time window tables: sum(value) and count(*) per window of a table's rows as they are now, with
a watermark and recorded late changes (docs/sinks/delta.md, "Event-time windows").

The figures are over the current rows, not over change events: a changelog carries edits and deletes,
which Spark's append-only windowed aggregation cannot retract. So the analytics query keeps its own
current-state copy of each windowed table (spark_jobs/sinks/delta/_current.py, in
`_tideline/analytics`), and `Windows` is that copy's `Hooks`:

- `extras`: the newest event time among the batch's upserts of the table, computed in the batch's
  one facts job; after the batch, watermark = max(watermark, that time − allowed lateness). It never
  goes back (appended to `_tideline/window_watermarks`, the highest counting, read once at start);
  a batch uses the one left by the batches before it, as Spark does;
- `before_merge`: the changes the MERGE will apply (newer than the held row, or than the row's
  tombstone where none is held) that would alter a closed window (end at or below the watermark),
  each with its effect relative to the row the copy holds, are inserted if absent into
  `<name>_late`: before the MERGE that would hide the held row;
- `after_write`: the open windows (end after the watermark) are recomputed from the copy and MERGEd
  into `<name>` (a window whose rows are all gone is removed).

So for every window, figures + the sum of its late deltas = the aggregate over the source rows now.
Every step is idempotent: open windows are recomputed, not incremented; late records are keyed by
(window, row, version).
"""

from __future__ import annotations

import logging
from datetime import datetime
from functools import reduce
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from spark_jobs.model.catalogue import Catalogue
from spark_jobs.model.config import WindowSpec, WindowView, late_table
from spark_jobs.sinks.base import VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.delta._facts import Facts
from spark_jobs.sinks.delta._merge import KEEP, OP, TOMB_MAJOR, TOMB_MINOR
from spark_jobs.sinks.delta._plan import TablePlan
from spark_jobs.sinks.delta._source import ROW_ID
from spark_jobs.sinks.delta._tables import Tables
from spark_jobs.sinks.delta._version import Version, keep_stored, newer, newer_or_absent, quote
from spark_jobs.sinks.delta.layout import (
    COUNT_DELTA,
    END,
    REASON,
    ROW_COUNT,
    SIZE,
    SLIDE,
    START,
    VALUE_DELTA,
    VALUE_SUM,
    WATERMARK,
)
from spark_jobs.sinks.delta.layout import ROW_ID as LATE_ROW_ID

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("tideline.windows")

WATERMARKS = StructType([StructField("view", StringType()), StructField("watermark", TimestampType())])
_HELD = Version.of(None, "_old_major", "_old_minor")
_TOMB = Version.of(None, TOMB_MAJOR, TOMB_MINOR)


def in_windows(rows: DataFrame, specs: list[WindowSpec]) -> DataFrame:
    """Each row once per window of each spec containing its `_time` (epoch-aligned, as
    spark_jobs.model.event_windows.window_starts): columns SIZE, SLIDE, START, END added."""
    parts = []
    for spec in specs:
        slide_us, count = spec.slide * 1_000_000, spec.size_seconds // spec.slide
        micros = F.unix_micros(F.col("_time"))
        last_start = micros - F.pmod(micros, F.lit(slide_us))  # floor to the slide, also before the epoch
        parts.append(
            rows.select("*", F.explode(F.sequence(F.lit(0), F.lit(count - 1))).alias("_k")).select(
                *rows.columns, F.lit(spec.size_seconds).alias(SIZE), F.lit(spec.slide).alias(SLIDE),
                F.timestamp_micros(last_start - F.col("_k") * F.lit(slide_us)).alias(START),
            ).withColumn(END, F.col(START) + F.expr(f"INTERVAL {spec.size_seconds} SECONDS"))
        )
    return reduce(lambda a, b: a.unionByName(b), parts)


def late_changes(view: WindowView, plan: TablePlan, source: DataFrame, held: DataFrame,
                 watermark: datetime) -> DataFrame:
    """The late effects of `source` (a current-state MERGE source) on closed windows, relative to the
    rows `held` (the copy before the MERGE): a record per (window, row, version) with its deltas."""
    time_column, value_column = view.time_column, view.value_column
    held = held.select(
        *(F.col(quote(k)) for k in plan.keys),
        F.col(quote(time_column)).alias("_old_time"), F.col(quote(value_column)).alias("_old_value"),
        F.col(VERSION_MAJOR).alias("_old_major"), F.col(VERSION_MINOR).alias("_old_minor"),
    )
    # The changes the MERGE applies: newer than the held row, or, where none is held, newer than the
    # row's tombstone (a stale upsert of a deleted row is refused, so it must not count as late either).
    applied = F.when(F.col("_old_major").isNull(), F.expr(newer_or_absent(Version.of(), _TOMB))).otherwise(
        F.expr(newer(Version.of(), _HELD)))
    joined = source.join(held, list(plan.keys), "left").where(applied)

    def arriving(column: str, old: str) -> Column:
        if column not in plan.fields:
            return F.lit(None)
        # The fill-version rule, as the MERGE applies it: the held value stays where the held row is new enough.
        kept = F.expr(keep_stored(Version.field(f"try_element_at({KEEP}, '{column}')"), _HELD))
        return (F.when(F.col(OP) == "d", F.lit(None)).when(F.coalesce(kept, F.lit(False)), F.col(old))
                .otherwise(F.col(quote(column))))

    identity = [F.col(ROW_ID).alias(LATE_ROW_ID), F.col(VERSION_MAJOR), F.col(VERSION_MINOR)]
    old = joined.where(F.col("_old_time").isNotNull()).select(
        *identity, F.col("_old_time").cast(TimestampType()).alias("_time"), (-F.col("_old_value")).alias("_value"),
        F.lit(-1).alias("_count"))
    new = joined.select(
        *identity, arriving(time_column, "_old_time").cast(TimestampType()).alias("_time"),
        arriving(value_column, "_old_value").alias("_value"), F.lit(1).alias("_count"),
    ).where(F.col("_time").isNotNull())
    at = F.lit(watermark).cast(TimestampType())
    deltas = in_windows(old.unionByName(new), view.windows).groupBy(
        LATE_ROW_ID, VERSION_MAJOR, VERSION_MINOR, SIZE, SLIDE, START, END
    ).agg(F.sum("_value").alias(VALUE_DELTA), F.sum("_count").alias(COUNT_DELTA))
    changed = (F.coalesce(F.col(VALUE_DELTA), F.lit(0)) != 0) | (F.col(COUNT_DELTA) != 0)
    return deltas.where((F.col(END) <= at) & changed).select(
        SIZE, SLIDE, START, END, LATE_ROW_ID, VERSION_MAJOR, VERSION_MINOR, VALUE_DELTA, COUNT_DELTA,
        at.alias(WATERMARK),
        F.lit(f"window closed: its end is not after the watermark (newest event time minus "
              f"{view.allowed_lateness_seconds} s)").alias(REASON),
        F.current_timestamp().alias("recorded_at"),
    )


def window_figures(view: WindowView, rows: DataFrame, watermark: datetime | None) -> DataFrame:
    """(SIZE, SLIDE, START, END, VALUE_SUM, ROW_COUNT) of the open windows over the current `rows`."""
    timed = rows.select(F.col(quote(view.time_column)).cast(TimestampType()).alias("_time"),
                        F.col(quote(view.value_column)).alias("_value")).where(F.col("_time").isNotNull())
    if watermark is not None:  # only rows that can be in an open window
        longest = max(spec.size_seconds for spec in view.windows)
        timed = timed.where(
            F.col("_time") > F.lit(watermark).cast(TimestampType()) - F.expr(f"INTERVAL {longest} SECONDS"))
    windows = in_windows(timed.withColumn("_count", F.lit(1)), view.windows)
    if watermark is not None:
        windows = windows.where(F.col(END) > F.lit(watermark).cast(TimestampType()))
    return windows.groupBy(SIZE, SLIDE, START, END).agg(F.sum("_value").alias(VALUE_SUM),
                                                        F.count(F.lit(1)).alias(ROW_COUNT))


class Windows:
    """The window tables of one warehouse: the `Hooks` of the analytics query's current-state copy."""

    def __init__(self, warehouse_dir: str, views: dict[str, WindowView], tables: Tables) -> None:
        self.warehouse_dir = warehouse_dir
        self.views = dict(views)
        self._tables = tables
        self.watermarks: dict[str, datetime] = {}

    def path(self, name: str) -> str:
        return f"{self.warehouse_dir}/{name}"

    @property
    def watermarks_path(self) -> str:
        return f"{self.warehouse_dir}/_tideline/window_watermarks"

    def folders(self) -> list[str]:
        return [*(self.path(t) for name in self.views for t in (name, late_table(name))), self.watermarks_path]

    def setup(self, spark: SparkSession) -> None:
        if not self.views:
            return
        self._tables.create(spark, self.watermarks_path, WATERMARKS)
        found = spark.read.format("delta").load(self.watermarks_path).groupBy("view").agg(F.max("watermark").alias("w"))
        self.watermarks = {row["view"]: row["w"] for row in found.collect()}

    def _of(self, table: str) -> dict[str, WindowView]:
        return {name: view for name, view in self.views.items() if view.table == table}

    def extras(self, catalogue: Catalogue) -> dict[str, Column]:
        return {
            f"newest_{name}": F.max(F.when(
                (F.col("table") == view.table) & F.col("after").isNotNull(),
                F.try_element_at("after", F.lit(view.time_column)).try_cast(TimestampType())))
            for name, view in self.views.items()
        }

    def before_merge(self, spark: SparkSession, plan: TablePlan, source: DataFrame, path: str) -> None:
        for name, view in self._of(plan.table).items():
            watermark = self.watermarks.get(name)
            if watermark is None:
                continue  # no window is closed yet
            late = late_changes(view, plan, source, spark.read.format("delta").load(path), watermark).persist()
            try:
                count = late.count()
                if count:
                    self._insert_late(spark, name, late)
                    log.warning("%s: %d window figures changed after their window closed (allowed lateness %ss): "
                                "recorded in %s", name, count, view.allowed_lateness_seconds,
                                self.path(late_table(name)))
            finally:
                late.unpersist()

    def _insert_late(self, spark: SparkSession, name: str, late: DataFrame) -> None:
        from delta.tables import DeltaTable

        path = self.path(late_table(name))
        if self._tables.schema(spark, path) is None:
            self._tables.create(spark, path, late.schema)
        on = " AND ".join(f"t.{c} = s.{c}" for c in (SIZE, SLIDE, START, LATE_ROW_ID, VERSION_MAJOR, VERSION_MINOR))
        DeltaTable.forPath(spark, path).alias("t").merge(late.alias("s"), on).whenNotMatchedInsertAll().execute()

    def after_write(self, spark: SparkSession, table: str, path: str, facts: Facts) -> None:
        """Recompute the open windows of `table`'s views from the copy, then raise the watermarks."""
        from delta.tables import DeltaTable

        for name, view in self._of(table).items():
            rows = spark.read.format("delta").load(path)
            missing = [c for c in (view.time_column, view.value_column) if c not in rows.columns]
            if missing:
                raise ValueError(f"windows.{name}: the table {table} has no column {', '.join(missing)}")
            watermark = self.watermarks.get(name)
            figures = window_figures(view, rows, watermark)
            target = self.path(name)
            if self._tables.schema(spark, target) is None:
                self._tables.create(spark, target, figures.schema)
            merge = DeltaTable.forPath(spark, target).alias("t").merge(
                figures.alias("s"), " AND ".join(f"t.{c} = s.{c}" for c in (SIZE, SLIDE, START)))
            differs = f"NOT (t.{VALUE_SUM} <=> s.{VALUE_SUM}) OR t.{ROW_COUNT} <> s.{ROW_COUNT}"
            merge = merge.whenMatchedUpdate(differs, set={VALUE_SUM: f"s.{VALUE_SUM}", ROW_COUNT: f"s.{ROW_COUNT}"})
            merge = merge.whenNotMatchedInsertAll()
            if watermark is None:
                merge = merge.whenNotMatchedBySourceDelete()
            else:
                merge = merge.whenNotMatchedBySourceDelete(F.col(f"t.{END}") > F.lit(watermark).cast(TimestampType()))
            merge.execute()
            self._raise(spark, name, view, facts.extra.get(f"newest_{name}"))

    def _raise(self, spark: SparkSession, name: str, view: WindowView, newest: datetime | None) -> None:
        """Append the view's new watermark if the batch's newest event time moves it up (appended, not
        MERGEd: readers take the highest, which a lower or repeated row cannot change)."""
        if newest is None:
            return
        from datetime import timedelta

        candidate = newest - timedelta(seconds=view.allowed_lateness_seconds)
        held = self.watermarks.get(name)
        if held is None or candidate > held:
            spark.createDataFrame([(name, candidate)], WATERMARKS).write.format("delta").mode("append").save(
                self.watermarks_path)
            self.watermarks[name] = candidate


__all__ = ["WATERMARKS", "Windows", "in_windows", "late_changes", "window_figures"]

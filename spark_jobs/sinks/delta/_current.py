"""Current-state Delta tables kept from the newest change per row: the warehouse's tables, and the
analytics query's own copy of the windowed tables (the same code, another folder).

A batch (`CurrentState.apply`), on the driver:

1. the batch's changes beside each row's newest tombstone (a left join, in the same query) and
   persisted; one aggregate gives the driver every per-table fact it needs (spark_jobs/sinks/delta/_facts.py);
2. per table: the plan (catalogue types against the stored schema), then CREATE or ADD COLUMNS /
   widen, then a truncate if the batch has one above the table's watermark (DELETE the rows at or
   below it, then raise the watermark: in that order, so a batch dying half-way is redone in full);
3. one append of the batch's new tombstones for all tables; a primary-key move's delete keeps the
   deleted row's columns as text (`image`), read from the table before the MERGE removes it;
4. per table one MERGE (spark_jobs/sinks/delta/_merge.py) from the typed source rows above the
   watermark; a primary-key move's create first takes its unchanged-TOAST columns from the old key:
   its newest upsert in the batch, else its row in the table, else its tombstone's image;
5. the rejected changes come back as a lazy frame over the pipeline's persisted batch.

A replayed batch commits nothing: its tombstones exist (no append), its truncates are at the
watermark, its changes equal the stored versions (no MERGE clause matches; with deletion vectors no
commit). `hooks` let the analytics sink see each table's source rows before its MERGE (late window
changes) and act after it (recompute the open windows).
"""

from __future__ import annotations

import logging
from functools import reduce
from typing import TYPE_CHECKING, Protocol

from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, TimestampType

from spark_jobs.model.catalogue import Catalogue
from spark_jobs.model.config import PipelineConfig
from spark_jobs.sinks.base import COMMIT_TS, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.delta._facts import Facts, collect_facts, key_range, key_ranges
from spark_jobs.sinks.delta._marks import Marks
from spark_jobs.sinks.delta._merge import merge_text, run_merge
from spark_jobs.sinks.delta._plan import TablePlan, plan_table
from spark_jobs.sinks.delta._source import image, key_of_row_id, merge_source, rejected, with_images
from spark_jobs.sinks.delta._tables import Tables
from spark_jobs.sinks.delta._version import Version, newer, newer_or_absent, not_newer

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger("tideline.delta")

META = [StructField(VERSION_MAJOR, LongType()), StructField(VERSION_MINOR, LongType()),
        StructField(COMMIT_TS, TimestampType())]
_CHANGE, _TOMB = Version.field("version"), Version.field("tomb")


class Hooks(Protocol):
    """What a caller of `CurrentState.apply` may do around each table's MERGE (the windows)."""

    def extras(self, catalogue: Catalogue) -> dict[str, Column]:
        """Extra per-table aggregates for the facts job (spark_jobs/sinks/delta/_facts.py)."""

    def before_merge(self, spark: SparkSession, plan: TablePlan, source: DataFrame, path: str) -> None:
        """Called with the table's MERGE source rows (typed, above the watermark) before the MERGE."""

    def after_write(self, spark: SparkSession, table: str, path: str, facts: Facts) -> None:
        """Called after the table's MERGE or truncate, with the batch's facts."""


class CurrentState:
    """One current-state Delta table per table under `folder`, with tombstones and watermarks."""

    def __init__(self, folder: str, pipeline: PipelineConfig, tables: list[str],
                 prune_by_key_range: bool = True) -> None:
        self.folder = folder.rstrip("/")
        self.pipeline = pipeline
        self.tables = list(tables)
        self.prune_by_key_range = prune_by_key_range
        self._tables = Tables()
        self.marks = Marks(self.folder, self._tables)

    def path(self, table: str) -> str:
        return f"{self.folder}/{table}"

    def folders(self) -> list[str]:
        return [*(self.path(table) for table in self.tables), *self.marks.folders()]

    def setup(self, spark: SparkSession, catalogue: Catalogue) -> None:
        """Create the bookkeeping tables and each table the catalogue describes (readers see every
        table from the start), read the watermarks. Idempotent."""
        self.marks.setup(spark)
        for table in self.tables:
            if table in catalogue:
                self._ensure(spark, self._plan(spark, table, Facts(), catalogue))

    def _plan(self, spark: SparkSession, table: str, facts: Facts, catalogue: Catalogue) -> TablePlan:
        schema = self._tables.schema(spark, self.path(table))
        meta = {field.name for field in META}
        stored = None if schema is None else {f.name: f.dataType for f in schema.fields if f.name not in meta}
        excluded = self.pipeline.tables[table].exclude_columns if table in self.pipeline.tables else []
        batch_keys = list(facts.keys[0]) if facts.keys else []
        return plan_table(table, catalogue.get(table), stored, list(facts.columns), batch_keys, excluded)

    def _ensure(self, spark: SparkSession, plan: TablePlan) -> None:
        self._tables.ensure(spark, self.path(plan.table), plan.fields, META, plan.added, plan.widened)

    def apply(self, spark: SparkSession, newest: DataFrame, catalogue: Catalogue,
              hooks: Hooks | None = None) -> DataFrame | None:
        """Apply a batch's newest changes (CHANGE rows, one per row and per table's truncates); returns
        the rejected changes as a lazy frame, or None. A primary-key move whose old row changed in the
        same batch arrives filled from that change (spark_jobs/changes/newest.py)."""
        mine = newest.where(F.col("table").isin(*self.tables))
        guarded = mine.join(self.marks.newest(spark, mine), ["table", "row_id"], "left").persist()
        try:
            ranges = key_ranges(self.tables, catalogue) if self.prune_by_key_range else {}
            extras = ranges | (hooks.extras(catalogue) if hooks else {})
            facts = collect_facts(guarded, extras)
            plans = {table: self._plan(spark, table, found, catalogue) for table, found in sorted(facts.items())}
            for table, plan in plans.items():
                self._ensure(spark, plan)
                truncate = facts[table].truncate
                if truncate is not None and self.marks.beats_watermark(table, truncate):
                    self._truncate(spark, table, truncate)
                    if hooks and not facts[table].rows:
                        hooks.after_write(spark, table, self.path(table), facts[table])
            self._record_tombstones(spark, guarded, facts, plans)
            found = []
            for table, plan in plans.items():
                if facts[table].rows:
                    self._merge(spark, plan, guarded, facts[table], hooks)
                    found.append(rejected(mine.where((F.col("table") == table) & (F.col("op") != "t")), plan))
            return reduce(lambda a, b: a.unionByName(b), found) if found else None
        finally:
            guarded.unpersist()

    def _truncate(self, spark: SparkSession, table: str, version: tuple[int, int]) -> None:
        from delta.tables import DeltaTable

        DeltaTable.forPath(spark, self.path(table)).delete(not_newer(Version.of(), Version.literal(version)))
        self.marks.raise_watermark(spark, table, version)

    def _record_tombstones(self, spark: SparkSession, guarded: DataFrame, facts: dict[str, Facts],
                           plans: dict[str, TablePlan]) -> None:
        """One append of the batch's deletes above their row's tombstone, for every table at once; a
        primary-key move's delete with the row it removes (read before the MERGE removes it)."""
        if not any(found.fresh_deletes for found in facts.values()):
            return
        fresh = guarded.where((F.col("op") == "d") & F.expr(newer_or_absent(_CHANGE, _TOMB)))
        images = [self._moved_images(spark, plans[table], fresh)
                  for table, found in facts.items() if found.moved_deletes]
        rows = fresh.select("table", "row_id", F.col("version.major").alias("major"),
                            F.col("version.minor").alias("minor"))
        if images:
            rows = rows.join(reduce(lambda a, b: a.unionByName(b), images), ["table", "row_id"], "left")
        else:
            rows = rows.withColumn("image", F.lit(None).cast("map<string,string>"))
        self.marks.record(rows)

    def _moved_images(self, spark: SparkSession, plan: TablePlan, fresh: DataFrame) -> DataFrame:
        moved = fresh.where((F.col("table") == plan.table) & F.col("moved")).select(
            "table", "row_id", *key_of_row_id(F.col("row_id"), plan))
        stored = spark.read.format("delta").load(self.path(plan.table))
        return stored.join(moved, list(plan.keys)).select("table", "row_id", image(plan).alias("image"))

    def _merge(self, spark: SparkSession, plan: TablePlan, guarded: DataFrame, facts: Facts,
               hooks: Hooks | None) -> None:
        changes = guarded.where((F.col("table") == plan.table) & (F.col("op") != "t"))
        if facts.moved_fills:
            changes = with_images(changes, self._old_rows(spark, plan, changes))
        source = merge_source(changes, plan)
        watermark = self.marks.watermarks.get(plan.table)
        if watermark is not None:
            source = source.where(F.expr(newer(Version.of(), Version.literal(watermark))))
        path = self.path(plan.table)
        if hooks:
            hooks.before_merge(spark, plan, source, path)
        # Always a MERGE, also for keys the table does not hold: Delta then writes only the inserts, and
        # checking first to append instead (as the history does) cost more than it saved (docs/sinks/delta.md).
        run_merge(spark, path, source, merge_text(plan.keys, plan.data_columns, key_range(facts, plan.table)))
        if hooks:
            hooks.after_write(spark, plan.table, path, facts)

    def _old_rows(self, spark: SparkSession, plan: TablePlan, changes: DataFrame) -> DataFrame:
        """(_old, _image) per old row id of the batch's primary-key moves with unchanged-TOAST columns:
        the old key's columns as text, each from the best source that has it (its row in the table over
        its tombstone's image; the batch's own changes of the old key were filled in by
        spark_jobs/changes/newest.py)."""
        olds = changes.where(
            F.col("after").isNotNull() & F.col("old_row_id").isNotNull() & (F.size("unavailable") > 0)
        ).select(F.col("old_row_id").alias("_old"), *key_of_row_id(F.col("old_row_id"), plan)).distinct()
        stored = spark.read.format("delta").load(self.path(plan.table))
        candidates = [
            stored.join(olds, list(plan.keys)).select("_old", image(plan).alias("_image"), F.lit(2).alias("_rank")),
            spark.read.format("delta").load(self.marks.tombstones_path)
            .where((F.col("table") == plan.table) & F.col("image").isNotNull())
            .join(olds.select(F.col("_old").alias("row_id")), "row_id")
            .groupBy("row_id").agg(F.max_by("image", F.struct("major", "minor")).alias("_image"))
            .select(F.col("row_id").alias("_old"), "_image", F.lit(1).alias("_rank")),
        ]
        by_rank = lambda a, b: F.when(a["_rank"] < b["_rank"], -1).when(a["_rank"] > b["_rank"], 1).otherwise(0)  # noqa: E731
        ranked = reduce(lambda a, b: a.unionByName(b), candidates).groupBy("_old").agg(
            F.array_sort(F.collect_list(F.struct("_rank", "_image")), by_rank).alias("_images"))
        empty = F.create_map().cast("map<string,string>")
        best = F.aggregate("_images", empty, lambda acc, x: F.map_concat(
            F.map_filter(acc, lambda k, _: ~F.map_contains_key(x["_image"], k)), x["_image"]))
        return ranked.select("_old", best.alias("_image"))


__all__ = ["META", "CurrentState", "Hooks"]

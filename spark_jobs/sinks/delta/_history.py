"""SCD type 2 history tables: every committed version of each row of the tables marked
`warehouse: {history: true}`, in `<warehouse_dir>/<table>_history` (docs/sinks/delta.md, "SCD2 history").

From every change of the batch (`Batch.every`, not only the newest per row), per table:

1. the changes typed as the current-state tables are (spark_jobs/sinks/delta/_source.py), one row per
   (key, version): a re-delivered record counts once;
2. beside the stored versions of the same rows (a semi-join on the key); a (key, version) the table
   holds already is taken as stored, so a replay never adds a second copy;
3. intervals over all versions of those rows (window functions over the key, in version order):
   valid_to = the next version's valid_from, is_current = newest and not a delete or truncate; an
   unchanged-TOAST column takes the value of the nearest earlier version that had it (nothing is
   inherited across a delete). A late version slots in between and both intervals are right;
4. one MERGE on (key, version): new versions inserted, stored ones whose interval, flag or inherited
   values changed updated. A version's row is written once and changed only when a later version
   closes it, so the history is append-only but for that one update per row and batch (the previous
   current version's valid_to and is_current), which deletion vectors make a row mark, not a file
   rewrite. A replay changes nothing and commits nothing. Steps 2 and 4 read only the files whose key
   statistics overlap the batch's key range (a one-column integer key); a batch that only inserts rows
   the history holds no version of (a snapshot's next key range) is appended instead of merged.

A truncate closes every row live just before it with a version of op 't'.
"""

from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING, Any

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, LongType, StringType, StructField, TimestampType

from spark_jobs.model.catalogue import Catalogue
from spark_jobs.model.config import PipelineConfig, history_table
from spark_jobs.sinks.base import COMMIT_TS, KEYS_PROPERTY, VERSION_MAJOR, VERSION_MINOR
from spark_jobs.sinks.delta._facts import Facts, collect_facts, inserts_only, key_range, key_ranges
from spark_jobs.sinks.delta._merge import KEEP, OP, append_inserts, in_key_range
from spark_jobs.sinks.delta._plan import TablePlan, plan_table
from spark_jobs.sinks.delta._source import image, key_of_row_id, merge_source, rejected, with_images
from spark_jobs.sinks.delta._tables import Tables
from spark_jobs.sinks.delta._version import Version, newer, quote
from spark_jobs.sinks.delta.layout import IS_CURRENT, SOURCE_OP, UNAVAILABLE, VALID_FROM, VALID_TO

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

ENDS = ("d", "t")  # operations that end a row: such a version is never current
HISTORY_META = [
    StructField(SOURCE_OP, StringType()), StructField(VALID_FROM, TimestampType()),
    StructField(VALID_TO, TimestampType()), StructField(IS_CURRENT, BooleanType()),
    StructField(VERSION_MAJOR, LongType()), StructField(VERSION_MINOR, LongType()),
    StructField(UNAVAILABLE, ArrayType(StringType())),
]
_META_NAMES = frozenset(f.name for f in HISTORY_META)


def as_versions(source: DataFrame, plan: TablePlan) -> DataFrame:
    """MERGE source rows (spark_jobs/sinks/delta/_source.py) as history rows, one per (key, version);
    interval and current flag are set by `intervals`. tl_unavailable: the unchanged-TOAST columns."""
    return source.dropDuplicates([*plan.keys, VERSION_MAJOR, VERSION_MINOR]).select(
        *(F.col(quote(c)) for c in plan.fields),
        F.col(OP).alias(SOURCE_OP), F.col(COMMIT_TS).alias(VALID_FROM),
        F.lit(None).cast(TimestampType()).alias(VALID_TO), F.lit(False).alias(IS_CURRENT),
        F.col(VERSION_MAJOR), F.col(VERSION_MINOR), F.array_sort(F.map_keys(F.col(KEEP))).alias(UNAVAILABLE),
    )


def intervals(stored: DataFrame, arriving: DataFrame, keys: list[str]) -> DataFrame:
    """The versions of `arriving` (history rows) and the `stored` versions of the same rows, each with
    what it should hold: `_valid_to`, `_is_current`, `_unavailable` and `_v_<column>` (inherited
    values); `_stored` says which are stored. Only rows that are new or change are returned."""
    versions = [*keys, VERSION_MAJOR, VERSION_MINOR]
    first = Window.partitionBy(*(quote(c) for c in versions)).orderBy(F.col("_stored").desc())
    rows = (
        stored.withColumn("_stored", F.lit(True)).unionByName(arriving.withColumn("_stored", F.lit(False)))
        .withColumn("_copy", F.row_number().over(first)).where(F.col("_copy") == 1).drop("_copy")
    )
    data = [c for c in arriving.columns if c not in keys and c not in _META_NAMES]
    order = Window.partitionBy(*(quote(k) for k in keys)).orderBy(VERSION_MAJOR, VERSION_MINOR)
    earlier = order.rowsBetween(Window.unboundedPreceding, -1)
    # A column unavailable in a version takes the nearest earlier version's value that was known
    # (wrapped in a struct, so a real NULL counts as known: a delete's NULLs stop the inheritance).
    known = {c: F.last(F.when(~F.array_contains(UNAVAILABLE, c), F.struct(F.col(quote(c)).alias("v"))),
                       ignorenulls=True).over(earlier)
             for c in data}
    inherited = {c: F.when(F.array_contains(UNAVAILABLE, c) & known[c].isNotNull(), known[c].getField("v"))
                 .otherwise(F.col(quote(c))) for c in data}
    found = F.array(*(F.when(known[c].isNotNull(), F.lit(c)) for c in data)) if data else F.array()
    wanted = rows.select(
        *(quote(k) for k in keys), VERSION_MAJOR, VERSION_MINOR, SOURCE_OP, VALID_FROM, "_stored",
        F.lead(VALID_FROM).over(order).alias("_valid_to"),
        (F.lead(VERSION_MAJOR).over(order).isNull() & ~F.col(SOURCE_OP).isin(*ENDS)).alias("_is_current"),
        F.array_except(F.col(UNAVAILABLE), found).alias("_unavailable"),
        *(expr.alias(f"_v_{c}") for c, expr in inherited.items()), F.col(VALID_TO), F.col(IS_CURRENT),
        F.size(UNAVAILABLE).alias("_had_unavailable"),
    )
    return wanted.where(
        ~F.col("_stored") | ~F.col(VALID_TO).eqNullSafe(F.col("_valid_to"))
        | (F.col(IS_CURRENT) != F.col("_is_current")) | (F.col("_had_unavailable") != F.size("_unavailable"))
    )


def moved_images(history: DataFrame, changes: DataFrame, plan: TablePlan) -> DataFrame:
    """(_old, _image) per old row id of the batch's primary-key moves with unchanged-TOAST columns: the
    old key's data columns as text in its newest version below the move, from the batch's changes or
    the stored `history` (none if that version is a delete). Without it a moved row's first version
    would have nothing to inherit from: inheritance runs within one key."""
    moves = (changes.where(F.col("after").isNotNull() & F.col("old_row_id").isNotNull() & (F.size("unavailable") > 0))
             .groupBy(F.col("old_row_id").alias("_old")).agg(F.max("version").alias("_move")))
    data = set(plan.data_columns)
    batch = changes.join(moves, changes["row_id"] == moves["_old"]).where(F.col("version") < F.col("_move")).select(
        "_old", F.col("version").alias("_at"), F.map_filter("after", lambda k, _: k.isin(*data)).alias("_image"))
    at = F.struct(F.col(VERSION_MAJOR).alias("major"), F.col(VERSION_MINOR).alias("minor"))
    stored = history.join(moves.select("*", *key_of_row_id(F.col("_old"), plan)), list(plan.keys)) \
        .where(at < F.col("_move")) \
        .select("_old", at.alias("_at"), F.when(~F.col(SOURCE_OP).isin(*ENDS), image(plan)).alias("_image"))
    newest = batch.unionByName(stored).groupBy("_old").agg(F.max_by("_image", "_at").alias("_image"))
    return newest.where(F.col("_image").isNotNull())


class History:
    """The history tables of one warehouse."""

    def __init__(self, warehouse_dir: str, pipeline: PipelineConfig, tables: Tables) -> None:
        self.warehouse_dir = warehouse_dir
        self.pipeline = pipeline
        self.tables = pipeline.history_tables()
        self._tables = tables

    def path(self, table: str) -> str:
        return f"{self.warehouse_dir}/{history_table(table)}"

    def folders(self) -> list[str]:
        return [self.path(table) for table in self.tables]

    def _plan(self, spark: SparkSession, table: str, facts: Facts, catalogue: Catalogue) -> TablePlan:
        schema = self._tables.schema(spark, self.path(table))
        stored = None if schema is None else {f.name: f.dataType for f in schema.fields if f.name not in _META_NAMES}
        excluded = self.pipeline.tables[table].exclude_columns if table in self.pipeline.tables else []
        return plan_table(table, catalogue.get(table), stored, list(facts.columns),
                          list(facts.keys[0]) if facts.keys else [], excluded)

    def setup(self, spark: SparkSession, catalogue: Catalogue) -> None:
        for table in self.tables:
            if table in catalogue:
                self._ensure(spark, self._plan(spark, table, Facts(), catalogue))

    def _ensure(self, spark: SparkSession, plan: TablePlan) -> None:
        self._tables.ensure(spark, self.path(plan.table), plan.fields, HISTORY_META, plan.added, plan.widened,
                            {KEYS_PROPERTY: ",".join(plan.keys)})

    def write(self, spark: SparkSession, every: DataFrame, catalogue: Catalogue) -> DataFrame | None:
        """Every change of the batch into the history tables; returns the rejected changes (lazy) or None."""
        mine = every.where(F.col("table").isin(*self.tables)).withColumn(
            "tomb", F.lit(None).cast("struct<major:bigint,minor:bigint>"))
        if not self.tables:
            return None
        facts = collect_facts(mine, key_ranges(self.tables, catalogue))
        found = []
        for table, table_facts in sorted(facts.items()):
            plan = self._plan(spark, table, table_facts, catalogue)
            self._ensure(spark, plan)
            changes = mine.where((F.col("table") == table) & (F.col("op") != "t"))
            if table_facts.moved_fills:
                stored = spark.read.format("delta").load(self.path(table))
                changes = with_images(changes, moved_images(stored, changes, plan))
            if table_facts.rows:
                self._merge(spark, plan, as_versions(merge_source(changes, plan), plan), key_range(table_facts, table),
                            inserts_only(table_facts))
                found.append(rejected(changes.drop("tomb"), plan))
            if table_facts.truncate is not None:
                self._truncate(spark, plan, mine.where((F.col("table") == table) & (F.col("op") == "t")))
        return reduce(lambda a, b: a.unionByName(b), found) if found else None

    def _merge(self, spark: SparkSession, plan: TablePlan, arriving: DataFrame,
               bounds: tuple[Any, Any] | None = None, inserts: bool = False) -> None:
        """`bounds`: the batch's lowest and highest key (a one-column integer key): the stored versions
        are read, and the MERGE looks for matches, only in the files whose key statistics overlap them.
        `inserts`: the batch only inserts rows; if the table holds no version of their keys (a snapshot's
        next key range), the versions are appended instead of merged."""
        from delta.tables import DeltaTable

        path, keys = self.path(plan.table), list(plan.keys)
        history = spark.read.format("delta").load(path)
        bounds = bounds if len(keys) == 1 else None
        arriving = arriving.select(*(
            (F.col(quote(f.name)) if f.name in arriving.columns else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in history.schema.fields))
        near = history if bounds is None else history.where(in_key_range(quote(keys[0]), bounds))
        stored = near.join(arriving.select(*(quote(k) for k in keys)).distinct(), keys, "left_semi")
        # A snapshot's next key range: no stored version of these rows, so an append with no join left to run.
        appending = inserts and bounds is not None and stored.isEmpty()
        changed = intervals(history.limit(0) if appending else stored, arriving, keys)
        data = [f.name for f in history.schema.fields if f.name not in keys and f.name not in _META_NAMES]
        # SQL text per column, typed as Delta's MERGE API takes it (SQL text or a Column).
        updates: dict[str, str | Column] = {VALID_TO: "s._valid_to", IS_CURRENT: "s._is_current",
                                            UNAVAILABLE: "s._unavailable"}
        updates |= {quote(c): f"s.{quote('_v_' + c)}" for c in data}
        values = {**{c: str(v) for c, v in updates.items()},
                  **{quote(c): f"s.{quote(c)}" for c in (*keys, VERSION_MAJOR, VERSION_MINOR, SOURCE_OP, VALID_FROM)}}
        if appending:
            append_inserts(path, changed, values)
            return
        on = " AND ".join([*(f"t.{quote(k)} <=> s.{quote(k)}" for k in keys),
                           f"t.{VERSION_MAJOR} = s.{VERSION_MAJOR}", f"t.{VERSION_MINOR} = s.{VERSION_MINOR}",
                           *([] if bounds is None else [in_key_range(f"t.{quote(keys[0])}", bounds)])])
        (DeltaTable.forPath(spark, path).alias("t").merge(changed.alias("s"), on)
         .whenMatchedUpdate(set=updates).whenNotMatchedInsert(values=dict(values)).execute())

    def _truncate(self, spark: SparkSession, plan: TablePlan, truncates: DataFrame) -> None:
        """Close every row live just before each truncate with a version of op 't' at its version."""
        history = spark.read.format("delta").load(self.path(plan.table))
        keys = list(plan.keys)
        cut = truncates.select(F.col("version.major").alias("_t_major"), F.col("version.minor").alias("_t_minor"),
                               F.col("commit_ts").alias("_t_at"))
        below = history.crossJoin(F.broadcast(cut)).where(
            F.expr(newer(Version.of(None, "_t_major", "_t_minor"), Version.of())))
        newest_first = Window.partitionBy(*(quote(k) for k in keys), "_t_major", "_t_minor").orderBy(
            F.col(VERSION_MAJOR).desc(), F.col(VERSION_MINOR).desc())
        live = below.withColumn("_rank", F.row_number().over(newest_first)).where(
            (F.col("_rank") == 1) & ~F.col(SOURCE_OP).isin(*ENDS))
        columns = [f for f in history.schema.fields if f.name not in _META_NAMES]
        closing = live.select(
            *(F.col(quote(f.name)) if f.name in keys else F.lit(None).cast(f.dataType).alias(f.name) for f in columns),
            F.lit("t").alias(SOURCE_OP), F.col("_t_at").alias(VALID_FROM),
            F.lit(None).cast(TimestampType()).alias(VALID_TO), F.lit(False).alias(IS_CURRENT),
            F.col("_t_major").alias(VERSION_MAJOR), F.col("_t_minor").alias(VERSION_MINOR),
            F.array().cast(ArrayType(StringType())).alias(UNAVAILABLE),
        )
        self._merge(spark, plan, closing)


__all__ = ["HISTORY_META", "History", "as_versions", "intervals", "moved_images"]

"""Tombstones and truncate watermarks: what a current-state sink remembers of rows it no longer holds.

Layout (one pair per sink folder; docs/sinks/delta.md):

- `_tideline/tombstones` (table, row_id, major, minor, image): the version of each applied delete,
  appended, so a late older change of a deleted row is refused (invariant 3). A row deleted twice has
  two; readers take the highest (`newest`), which an extra, older one cannot change. Appending is one
  Spark job per batch for every table at once; keeping one row per key would need a MERGE per batch.
  `image` is set for the delete of a primary-key change (`moved`): the deleted row's columns as text,
  from which the create of the new key takes its unchanged-TOAST columns when the create is applied
  after the delete (docs/sinks/delta.md, "Primary-key changes").
- `_tideline/truncates` (table, major, minor): each table's truncate watermark, appended, the highest
  counting. Read once when the sink starts and then kept in memory: the sink is its only writer, so
  the watermark is a literal in the MERGE's filter, not a join.

Why a separate table for tombstones and not deleted rows kept in the row table: readers (verify, the
API, users' SQL, delta-rs) read the row tables as the current state; a flag they must remember to
filter would be a trap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import LongType, MapType, StringType, StructField, StructType

from spark_jobs.sinks.delta._tables import Tables
from spark_jobs.sinks.delta._version import Version, not_newer, text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Versions = dict[str, tuple[int, int]]

TOMBSTONES = StructType([
    StructField("table", StringType()), StructField("row_id", StringType()),
    StructField("major", LongType()), StructField("minor", LongType()),
    StructField("image", MapType(StringType(), StringType())),
])
TRUNCATES = StructType([StructField("table", StringType()), StructField("major", LongType()),
                        StructField("minor", LongType())])
_TOMB = Version.of(None, "major", "minor")


class Marks:
    """The tombstones and watermarks of one sink, under `<folder>/_tideline`."""

    def __init__(self, folder: str, tables: Tables) -> None:
        self.tombstones_path = f"{folder}/_tideline/tombstones"
        self.truncates_path = f"{folder}/_tideline/truncates"
        self._tables = tables
        self.watermarks: Versions = {}

    def folders(self) -> list[str]:
        return [self.tombstones_path, self.truncates_path]

    def setup(self, spark: SparkSession) -> None:
        """Create both tables if missing and read the watermarks (called once per query start)."""
        self._tables.create(spark, self.tombstones_path, TOMBSTONES)
        self._tables.create(spark, self.truncates_path, TRUNCATES)
        marks = spark.read.format("delta").load(self.truncates_path).groupBy("table").agg(
            F.max(F.struct("major", "minor")).alias("v")
        ).collect()
        self.watermarks = {row["table"]: (row["v"]["major"], row["v"]["minor"]) for row in marks}

    def newest(self, spark: SparkSession, rows: DataFrame) -> DataFrame:
        """(table, row_id, tomb): the newest tombstone, as struct<major, minor>, of each row of `rows`
        (columns table, row_id) that has one. The table holds every delete ever applied, so only the
        batch's rows are grouped: the rest is dropped by a broadcast semi-join as it is read, where
        grouping the whole table cost every batch more as deletes accumulated (docs/sinks/delta.md)."""
        batch_rows = F.broadcast(rows.select("table", "row_id"))
        found = spark.read.format("delta").load(self.tombstones_path).join(batch_rows, ["table", "row_id"], "left_semi")
        return F.broadcast(found.groupBy("table", "row_id").agg(F.max(F.struct("major", "minor")).alias("tomb")))

    def record(self, deletes: DataFrame) -> None:
        """Append tombstones (columns of TOMBSTONES). The caller knows the frame is not empty: an
        empty append would still add a commit."""
        deletes.select(*TOMBSTONES.fieldNames()).write.format("delta").mode("append").save(self.tombstones_path)

    def beats_watermark(self, table: str, version: tuple[int, int]) -> bool:
        """Whether a truncate at `version` is above the table's watermark (else a replay or an older
        truncate: nothing to do)."""
        held = self.watermarks.get(table)
        return held is None or version > held

    def raise_watermark(self, spark: SparkSession, table: str, version: tuple[int, int]) -> None:
        """Record a truncate's version as the table's watermark, after its rows were removed (so a batch
        that dies in between is redone in full by its replay), and prune the tombstones it covers."""
        from delta.tables import DeltaTable

        below = f"`table` = {text(table)} AND {not_newer(_TOMB, Version.literal(version))}"
        DeltaTable.forPath(spark, self.tombstones_path).delete(below)
        spark.createDataFrame([(table, *version)], TRUNCATES).write.format("delta").mode("append").save(
            self.truncates_path)
        self.watermarks[table] = version


__all__ = ["TOMBSTONES", "TRUNCATES", "Marks"]

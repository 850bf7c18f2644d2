"""Delta tables on the driver: create, evolve, and remember their schemas.

Each sink is the only writer of its tables, so the schema it last wrote is the schema the table has:
`Tables` keeps it in memory (read once per table and driver) instead of reading the log on every
batch. Tables are created with deletion vectors, so a MERGE or DELETE marks rows instead of rewriting
files, and a MERGE that changes nothing commits nothing (a replayed batch leaves every table's
version as it was). Type widening is switched on only when a column first needs it: it is a reader
feature that older readers refuse.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql.types import StructField, StructType

from spark_jobs.sinks.delta._version import quote

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType

# What every table gets (docs/sinks/delta.md, "Table properties", measured). Optimized writes and auto
# compaction were measured and not kept; see the docs for the figures.
TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "true",
}

# How Parquet files are written and read, in the Delta queries' sessions and in maintenance's (whose
# compaction rewrites the files the queries read):
# - row groups of at most 16 MiB (Parquet's default: 128): a reader holds a row group's whole column
#   chunk in memory and a writer buffers one. The demo's products descriptions (~11 KB each) made row
#   groups of 95 MiB in products_history, and an analytics batch reading them beside the other queries
#   ran the shared 2-GiB driver out of heap (docs/apply.md, "Heap and wide rows");
# - vectorized reads of 1,024 rows (Spark's default: 4,096): a column's vector holds a read batch's
#   values, 45 MiB of those descriptions at 4,096.
PARQUET_SETTINGS = {
    "parquet.block.size": str(16 * 2**20),  # Spark passes its SQL settings on to Parquet's writer
    "spark.sql.parquet.columnarReaderBatchSize": "1024",
}

# Settings of the Delta queries' own sessions (a streaming query runs in a clone of the driver's
# session, so these reach no other query), measured per batch (docs/apply.md, "Jobs per batch"):
# - adaptive execution off: it runs every shuffle stage as a Spark job of its own (a four-table
#   warehouse batch ran 70 jobs with it, 45 without); the batches' joins are planned from the
#   sizes of persisted frames and Delta's statistics instead;
# - MERGE reads its source as it is: Delta otherwise copies the source first (a job per MERGE) to
#   guard against a source that changes between its two passes; ours is the batch's persisted
#   frame and tables the batch does not write, the same in both passes;
# - and so a cached source is not refused: Delta >= 4.1 fails a MERGE whose source holds a cached
#   frame it did not copy (DELTA_MERGE_SOURCE_CACHED_DURING_EXECUTION), because a cache does not pin
#   the version of a Delta table read below it. Ours is persisted and read once before any MERGE of
#   the batch (the marks table below it is read before the batch appends to it), so both passes
#   read the same rows, as with Delta 4.0, which had no such check;
# - and PARQUET_SETTINGS.
SESSION_SETTINGS = {
    "spark.sql.adaptive.enabled": "false",
    "spark.databricks.delta.merge.materializeSource": "none",
    "spark.databricks.delta.merge.failSourceCachedAfterMaterialization": "false",
    **PARQUET_SETTINGS,
}


def tune_session(spark: SparkSession) -> None:
    """Apply SESSION_SETTINGS to a Delta query's session (cheap; called per batch)."""
    for key, value in SESSION_SETTINGS.items():
        if spark.conf.get(key, None) != value:
            spark.conf.set(key, value)


def remove_uncommitted_log(path: str) -> None:
    """Remove a `_delta_log` folder that holds no commit. A driver killed while creating a table leaves
    one behind (seen: only `_staged_commits/`); Delta then takes the folder for an existing table it
    cannot load (DELTA_TABLE_NOT_FOUND) on every retry. Nothing was committed, so nothing is lost.
    Local folders only."""
    log = Path(path) / "_delta_log"
    if "://" in path or not log.is_dir():
        return
    if not any(log.glob("*.json")) and not any(log.glob("*.checkpoint*")):
        shutil.rmtree(log)


def remove_folders(folders: list[str]) -> None:
    """A Delta sink's `clear`: its folders gone (local folders, as the local stack keeps them)."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


class Tables:
    """The schemas of one sink's tables, as it last wrote them."""

    def __init__(self, properties: dict[str, str] | None = None) -> None:
        self.properties = TABLE_PROPERTIES | (properties or {})
        self._schemas: dict[str, StructType] = {}

    def schema(self, spark: SparkSession, path: str) -> StructType | None:
        """The table's schema, None if there is no table (read from the log once, then remembered)."""
        if path not in self._schemas:
            from delta.tables import DeltaTable

            remove_uncommitted_log(path)
            if not DeltaTable.isDeltaTable(spark, path):
                return None
            self._schemas[path] = DeltaTable.forPath(spark, path).toDF().schema
        return self._schemas[path]

    def create(self, spark: SparkSession, path: str, schema: StructType,
               properties: dict[str, str] | None = None) -> None:
        """Create the table if it is missing (idempotent)."""
        from delta.tables import DeltaTable

        remove_uncommitted_log(path)
        builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
        for key, value in (self.properties | (properties or {})).items():
            builder = builder.property(key, value)
        builder.execute()
        self._schemas.pop(path, None)

    def evolve(self, spark: SparkSession, path: str, fields: dict[str, DataType], added: tuple[str, ...],
               widened: tuple[str, ...]) -> None:
        """Add and widen columns before a MERGE, so the MERGE never meets a column the table lacks."""
        target = f"delta.{quote(path)}"
        if added:
            columns = ", ".join(f"{quote(c)} {fields[c].simpleString()}" for c in added)
            spark.sql(f"ALTER TABLE {target} ADD COLUMNS ({columns})")
        if widened:
            spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
            for column in widened:
                spark.sql(f"ALTER TABLE {target} ALTER COLUMN {quote(column)} TYPE {fields[column].simpleString()}")
        if added or widened:
            self._schemas.pop(path, None)

    def ensure(self, spark: SparkSession, path: str, fields: dict[str, DataType], meta: list[StructField],
               added: tuple[str, ...] = (), widened: tuple[str, ...] = (),
               properties: dict[str, str] | None = None) -> None:
        """Create the table with `fields` + `meta`, or evolve it to them."""
        if self.schema(spark, path) is None:
            self.create(spark, path, StructType([StructField(c, t) for c, t in fields.items()] + meta), properties)
        else:
            self.evolve(spark, path, fields, added, widened)

    def forget(self, path: str) -> None:
        self._schemas.pop(path, None)


__all__ = ["SESSION_SETTINGS", "TABLE_PROPERTIES", "Tables", "remove_uncommitted_log", "tune_session"]

"""Delta table maintenance for the Delta sinks: compaction, then vacuum (`tide warehouse optimize`).

Each micro-batch adds files to every table it writes: a MERGE writes its new and changed rows as a
new file and marks the rows it replaces in deletion vectors, the tombstones get one small file per
batch with deletes. A query on a 10-s trigger adds thousands a day, and every reader, the MERGE's own
scan for touched files included, lists and opens them all. Compaction (Delta's OPTIMIZE) bin-packs
small files into large ones and rewrites files whose deletion vectors mark many of their rows; it
changes no row (its commit says dataChange=false, which streaming readers of the table skip). VACUUM
then deletes the files that no version within the retention references.

Run with the sink's query paused (services/warehouse/maintenance.py): a MERGE and a compaction of the
same files cannot both commit, and Delta fails whichever commits second.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs.sinks.delta._tables import PARQUET_SETTINGS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Delta's own default retention (delta.deletedFileRetentionDuration): versions a week old stay readable.
DEFAULT_RETAIN_HOURS = 168.0
# Delta refuses a shorter retention unless this check is off (in the maintenance session only).
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
# VACUUM lists a table's folder in this many Spark tasks (Spark's default: 10,000): 20 s for a table of a
# few files on two cores, 2 s with one task per core.
LISTING_TASKS = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


@dataclass(frozen=True)
class Maintained:
    """One table before and after: the files its current version reads, and the files on disk
    (data and deletion vectors; None for a table on object storage, which is not listed)."""

    path: str
    files_before: int
    files_after: int
    on_disk_before: int | None
    on_disk_after: int | None


def delta_tables(folders: list[str]) -> list[str]:
    """Every Delta table in or under `folders` (a folder with a `_delta_log`), sorted; a table's own
    folders are not searched further. Folders that do not exist (a sink that never ran) hold none."""
    found = []
    for folder in folders:
        for root, dirs, _files in os.walk(folder):
            if "_delta_log" in dirs:
                found.append(root)
                dirs.clear()
    return sorted(found)


def _files_on_disk(path: str) -> int | None:
    if "://" in path:
        return None
    return sum(1 for file in Path(path).rglob("*")
               if file.is_file() and "_delta_log" not in file.parts and not file.name.startswith("."))


def _live_files(spark: SparkSession, path: str) -> int:
    from delta.tables import DeltaTable

    (detail,) = DeltaTable.forPath(spark, path).detail().select("numFiles").collect()
    return int(detail[0])


def session_settings(spark: SparkSession, retain_hours: float) -> dict[str, str]:
    """What a maintenance session sets before `maintain`: the Delta queries' Parquet settings (compaction
    writes the files they read), VACUUM's listing in one task per core, and Delta's retention check off
    when `retain_hours` is below its default (safe for the sink, which is paused and the tables' only
    writer; a reader still reading a version older than that can fail)."""
    found = PARQUET_SETTINGS | {LISTING_TASKS: str(spark.sparkContext.defaultParallelism)}
    return found | ({RETENTION_CHECK: "false"} if retain_hours < DEFAULT_RETAIN_HOURS else {})


def maintain(spark: SparkSession, path: str, retain_hours: float = DEFAULT_RETAIN_HOURS) -> Maintained:
    """Compact the table at `path`, then vacuum it with `retain_hours`, in a session with
    `session_settings` (versions older than `retain_hours` can no longer be read)."""
    from delta.tables import DeltaTable

    before, on_disk_before = _live_files(spark, path), _files_on_disk(path)
    table = DeltaTable.forPath(spark, path)
    table.optimize().executeCompaction()
    table.vacuum(retain_hours)
    return Maintained(path, before, _live_files(spark, path), on_disk_before, _files_on_disk(path))


__all__ = ["DEFAULT_RETAIN_HOURS", "Maintained", "delta_tables", "maintain", "session_settings"]

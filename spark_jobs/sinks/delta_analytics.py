"""The warehouse's derived tables, SCD2 history and event-time windows, as a sink of their own:
the `analytics` query, with its own checkpoint and consumer position. The current-state tables
(the `warehouse` query) never wait for them, and either can be rebuilt alone (docs/sinks/delta.md).

- history (`spark_jobs/sinks/delta_history.py`) takes every decoded change of a batch;
- windows (`spark_jobs/sinks/delta_windows.py`) are computed from a current-state copy of each
  windowed table that this sink keeps itself, under `<warehouse_dir>/_tideline/analytics`, with the
  warehouse's own MERGE: the windows need the row a change replaces (for late deltas) and the rows
  of the open windows, as of this query's position in the topics. Reading the warehouse query's
  tables instead would tie the two queries together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_jobs.changes import Change
from spark_jobs.config import PipelineConfig, late_table
from spark_jobs.sinks.base import Rejected
from spark_jobs.sinks.delta import DeltaSink
from spark_jobs.sinks.delta_history import DeltaHistory
from spark_jobs.sinks.delta_windows import DeltaWindows

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import SparkSession


class AnalyticsSink:
    """History and window tables under `<warehouse_dir>`; a BatchSink with `write_history`."""

    name = "analytics"

    def __init__(self, warehouse_dir: str, pipeline: PipelineConfig) -> None:
        warehouse_dir = warehouse_dir.rstrip("/")
        self.history = DeltaHistory(warehouse_dir, pipeline.history_tables())
        self.windows = DeltaWindows(warehouse_dir, pipeline.windows)
        self.windowed = frozenset(pipeline.windowed_tables())
        self.rows = DeltaSink(f"{warehouse_dir}/_tideline/analytics", pipeline, windows=self.windows)

    def setup(self, pipeline: PipelineConfig) -> None:
        if self.windowed:
            self.rows.setup(pipeline)

    def write_batch(self, spark: SparkSession, changes: RDD[Change], batch_id: int) -> list[Rejected]:
        """The newest change per row of the windowed tables into this sink's copy of them; each
        MERGE records late changes and refreshes the open windows (DeltaSink with windows)."""
        windowed = self.windowed
        if not windowed:
            return []
        return self.rows.write_batch(spark, changes.filter(lambda change: change.table in windowed), batch_id)

    def write_history(self, spark: SparkSession, changes: RDD[Change], batch_id: int) -> list[Rejected]:
        """Every decoded change of the batch (before the newest-per-row reduction) into the history tables."""
        return self.history.write(spark, changes)

    def folders(self) -> list[str]:
        windows = [self.windows.path(t) for name in self.windows.views for t in (name, late_table(name))]
        history = [self.history.path(table) for table in sorted(self.history.tables)]
        return [*history, *windows, self.windows.watermarks_path, self.rows.warehouse_dir]

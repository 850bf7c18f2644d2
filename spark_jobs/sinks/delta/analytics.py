"""The `analytics` sink: the warehouse's derived tables, SCD2 history and event-time windows, as a
query of its own (own checkpoint and Kafka position), so the current-state tables never wait for them.

- history (spark_jobs/sinks/delta/_history.py) takes every change of the batch (`Batch.every`);
- windows (spark_jobs/sinks/delta/_windows.py) are computed from a current-state copy of each
  windowed table that this sink keeps itself, under `<warehouse_dir>/_tideline/analytics`, with the
  warehouse's own code (spark_jobs/sinks/delta/_current.py): the windows need the row a change
  replaces (for late deltas) and the rows of the open windows as of this query's position in the
  topics. Reading the warehouse query's tables instead would tie the two queries together.

Both are written from the same batch: the facts of the windowed tables come from one aggregate over
the newest changes, the history's from one over every change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_jobs.model.catalogue import Catalogue
from spark_jobs.model.config import PipelineConfig
from spark_jobs.sinks.base import Batch, Sink
from spark_jobs.sinks.delta._current import CurrentState
from spark_jobs.sinks.delta._history import History
from spark_jobs.sinks.delta._tables import Tables, remove_folders, tune_session
from spark_jobs.sinks.delta._windows import Windows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_jobs.model.settings import JobSettings


class AnalyticsSink(Sink):
    """History and window tables under `warehouse_dir`."""

    name = "analytics"

    def __init__(self, warehouse_dir: str, pipeline: PipelineConfig) -> None:
        super().__init__(pipeline)
        self.warehouse_dir = warehouse_dir.rstrip("/")
        tables = Tables()
        self.history = History(self.warehouse_dir, pipeline, tables)
        self.windows = Windows(self.warehouse_dir, pipeline.windows, tables)
        self.copy = CurrentState(f"{self.warehouse_dir}/_tideline/analytics", pipeline, pipeline.windowed_tables())

    @classmethod
    def from_settings(cls, settings: JobSettings, pipeline: PipelineConfig) -> AnalyticsSink:
        return cls(str(settings.warehouse_dir), pipeline)

    def folders(self) -> list[str]:
        return [*self.history.folders(), *self.windows.folders(), self.copy.folder]

    def clear(self) -> None:
        remove_folders(self.folders())

    def setup(self, spark: SparkSession, catalogue: Catalogue) -> None:
        """Creates the history tables, the window watermarks and the windowed tables' copy. Idempotent."""
        self.history.setup(spark, catalogue)
        if self.copy.tables:
            self.copy.setup(spark, catalogue)
            self.windows.setup(spark)

    def write(self, batch: Batch) -> DataFrame | None:
        """The windowed tables' copy (with the windows around each MERGE), then the history. Returns
        the changes either rejected (lazy), or None."""
        tune_session(batch.spark)
        rejected = []
        if self.copy.tables:
            rejected.append(self.copy.apply(batch.spark, batch.newest, batch.catalogue, hooks=self.windows))
        rejected.append(self.history.write(batch.spark, batch.every, batch.catalogue))
        found = [frame for frame in rejected if frame is not None]
        if not found:
            return None
        combined = found[0]
        for frame in found[1:]:
            combined = combined.unionByName(frame)
        return combined


__all__ = ["AnalyticsSink"]

"""The `warehouse` sink: one current-state Delta table per table with a `warehouse:` view.

`<warehouse_dir>/<table>` holds each source row once, with its version and commit time
(docs/sinks/delta.md); `<warehouse_dir>/_tideline/tombstones` and `_tideline/truncates` are its
bookkeeping. The work is spark_jobs/sinks/delta/_current.py's: per batch one facts job, one MERGE per
table, one append of tombstones when the batch deletes rows; the rejected changes come back lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_jobs.model.catalogue import Catalogue
from spark_jobs.model.config import PipelineConfig
from spark_jobs.sinks.base import Batch, Sink
from spark_jobs.sinks.delta._current import CurrentState
from spark_jobs.sinks.delta._tables import remove_folders, tune_session

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_jobs.model.settings import JobSettings


class WarehouseSink(Sink):
    """Current-state tables under `warehouse_dir`. Runs several Spark actions per batch (the MERGEs),
    so not SINGLE_PASS: the pipeline persists the batch while they run."""

    name = "warehouse"

    def __init__(self, warehouse_dir: str, pipeline: PipelineConfig, prune_by_key_range: bool = True) -> None:
        super().__init__(pipeline)
        self.warehouse_dir = warehouse_dir.rstrip("/")
        self.state = CurrentState(self.warehouse_dir, pipeline, self.tables(), prune_by_key_range)

    @classmethod
    def from_settings(cls, settings: JobSettings, pipeline: PipelineConfig) -> WarehouseSink:
        return cls(str(settings.warehouse_dir), pipeline)

    def path(self, table: str) -> str:
        return self.state.path(table)

    @property
    def tombstones_path(self) -> str:
        return self.state.marks.tombstones_path

    @property
    def truncates_path(self) -> str:
        return self.state.marks.truncates_path

    def folders(self) -> list[str]:
        return self.state.folders()

    def clear(self) -> None:
        remove_folders(self.folders())

    def setup(self, spark: SparkSession, catalogue: Catalogue) -> None:
        """Creates the bookkeeping tables and the catalogue's tables if missing; reads the watermarks."""
        self.state.setup(spark, catalogue)

    def write(self, batch: Batch) -> DataFrame | None:
        """Apply one micro-batch (idempotent: a replay commits nothing)."""
        tune_session(batch.spark)
        return self.state.apply(batch.spark, batch.newest, batch.catalogue)


__all__ = ["WarehouseSink"]

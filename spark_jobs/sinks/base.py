"""The contract every sink keeps. One module per sink implements it; `spark_jobs/pipeline.py` wires them.

A sink receives, for each micro-batch, the newest change per row (and the
newest truncate per table) — already decoded, deduplicated and with
unchanged-TOAST columns filled from earlier changes in the same batch
(`spark_jobs.merge.newest_per_row`). Each sink must:

- apply an upsert or delete only if its `sequence` is above what it holds for
  the row (`spark_jobs.merge.stored_version`: row, tombstone, truncate watermark),
  atomically per row; an equal version is a replay and must change nothing;
- keep delete versions (tombstones) for as long as an older change could still
  arrive, so a deleted row is never resurrected;
- apply a truncate by raising the table's watermark and removing rows below it;
- keep the stored value of the columns `spark_jobs.merge.kept_columns` names for
  the stored row's version: those in `Change.unavailable`, and those in
  `Change.filled` whose value came from a change no newer than the stored row;
- never raise for one bad row: return it as `Rejected` (it goes to the
  dead-letter topic) and apply the rest. Raising means the whole batch failed
  (the sink is down); Spark retries it, which is safe because writes are idempotent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from spark_jobs.changes import Change
from spark_jobs.config import PipelineConfig

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import SparkSession

# Metadata every sink stores beside a row's columns; `tide verify` ignores names with this prefix.
META_PREFIX = "tl_"
VERSION_MAJOR = "tl_version_major"
VERSION_MINOR = "tl_version_minor"
# A history table's primary-key columns, in its Delta table properties (a version's key is key + version).
KEYS_PROPERTY = "tideline.primaryKey"
COMMIT_TS = "tl_commit_ts"


@dataclass(frozen=True)
class Rejected:
    change: Change
    reason: str


class PartitionSink(Protocol):
    """A sink written from each Spark partition (Elasticsearch, Redis). Must be picklable: it is
    shipped to executors, so it holds settings only and opens clients inside `write`."""

    name: str

    def setup(self, pipeline: PipelineConfig) -> None:
        """Called once on the driver when the query starts: create indices, mappings, scripts. Idempotent."""

    def write(self, changes: Sequence[Change]) -> list[Rejected]:
        """Called on an executor with one partition's changes (newest per row). Idempotent, version-guarded."""

    def available(self) -> bool:
        """Called on the driver before each batch: False makes that query wait (with back-off) instead
        of launching tasks that would fail. An outage then never aborts Spark jobs shared with others."""


class BatchSink(Protocol):
    """A sink written per micro-batch from the driver with Spark operations (Delta Lake MERGE)."""

    name: str

    def setup(self, pipeline: PipelineConfig) -> None: ...

    def write_batch(self, spark: SparkSession, changes: RDD[Change], batch_id: int) -> list[Rejected]:
        """Apply one micro-batch (an RDD of the newest change per row; never collected to the driver).
        Idempotent for a replayed batch_id. Returns the (few) changes it could not apply."""

    def folders(self) -> list[str]:
        """Every folder the sink writes: `tide rebuild` clears them before its query replays the topics."""

    # Optional: a sink that has it (the analytics sink, for SCD2 history) is also called, beside
    # `write_batch`, with every decoded change of the batch before the newest-per-row reduction:
    # def write_history(self, spark, changes: RDD[Change], batch_id: int) -> list[Rejected]


"""The contract every sink keeps, and the capabilities a sink declares. `spark_jobs/pipeline.py` wires them.

A sink receives each micro-batch as a `Batch`: DataFrames of `CHANGE` rows (spark_jobs/changes/schema.py),
the newest change per row already chosen and unchanged-TOAST columns filled from older changes of the
batch (spark_jobs/changes/newest.py), and the catalogue of column types. Per-row work stays in the JVM: a sink
builds what its store needs with Spark SQL expressions and either writes it with Spark (Delta Lake) or
hands Arrow batches of ready bytes to Python on the executors, which only ships them (Elasticsearch,
Redis). Nothing is collected to the driver but per-table metadata and the few changes a sink rejects.

Every sink must:
- apply an upsert or delete only if its `version` is above what it holds for the row: the row's
  version, the row's tombstone, and the table's truncate watermark, whichever is highest; an equal
  version is a replay and changes nothing; the check and the write are atomic per row;
- keep delete versions (tombstones) for as long as an older change could still arrive, so a deleted row
  is never resurrected; apply a truncate by raising the table's watermark and removing rows below it;
- keep its stored value of a column the change names in `unavailable`, and of a column in `filled` when
  its stored row is at least as new as the version `filled` gives (the fill-version rule);
- for a create that moved the row from another key (`old_row_id`: a primary-key change), take the
  unavailable columns from what it holds for that key, row or tombstone;
- never fail a batch for one bad row: return it among the rejected (it goes to the dead-letter topic
  with the reason). Raising means the whole batch failed (the store is down); Spark retries the batch,
  which is safe because every write is idempotent.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from spark_jobs.model.catalogue import Catalogue
from spark_jobs.model.config import PipelineConfig
from spark_jobs.model.sink_registry import Capability, spec_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_jobs.model.settings import JobSettings

# Metadata every sink stores beside a row's columns; `tide verify` ignores names with this prefix.
META_PREFIX = "tl_"
VERSION_MAJOR = "tl_version_major"
VERSION_MINOR = "tl_version_minor"
# How long a real-time writer's create of a moved row's new key waits for the move's delete of the old
# key (another Kafka partition, so another task) to be applied, whose tombstone holds the row's
# unchanged-TOAST values (dev.tideline.writers.RareLines, KeyMoves).
MOVE_WAIT_MS = 30_000
# A history table's primary-key columns, in its Delta table properties (a version's key is key + version).
KEYS_PROPERTY = "tideline.primaryKey"
COMMIT_TS = "tl_commit_ts"


@dataclass(frozen=True)
class LetterTopic:
    """Where a real-time writer produces the dead letters of what its store refused."""

    bootstrap: str
    topic: str


@dataclass(frozen=True)
class Batch:
    """One micro-batch as a sink sees it. `newest` and `every` hold no dead letters."""

    id: int
    spark: SparkSession
    newest: DataFrame
    every: DataFrame
    catalogue: Catalogue


class Sink(ABC):
    """One destination, declared in spark_jobs/model/sink_registry.py under `name` (its capabilities are
    there). Holds plain settings only: it is pickled to executors where it ships bytes."""

    name: ClassVar[str]

    def __init__(self, pipeline: PipelineConfig) -> None:
        self.pipeline = pipeline

    @classmethod
    @abstractmethod
    def from_settings(cls, settings: JobSettings, pipeline: PipelineConfig) -> Sink:
        """The sink as the jobs run it, configured from their settings."""

    @property
    def capabilities(self) -> frozenset[Capability]:
        return spec_of(self.name).capabilities

    def can(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def tables(self) -> list[str]:
        """The captured tables this sink has a view of (its query subscribes to their topics)."""
        return self.pipeline.sink_tables(self.name)

    @abstractmethod
    def setup(self, spark: SparkSession, catalogue: Catalogue) -> None:
        """Called once on the driver when the query starts: create indices, tables, scripts. Idempotent."""

    @abstractmethod
    def write(self, batch: Batch) -> DataFrame | None:
        """Apply one micro-batch, idempotently and version-guarded. Returns the changes it rejected (as
        `CHANGE` rows with `error` set) as a DataFrame the pipeline writes to the dead-letter topic, or
        None. The returned frame may be lazy: the pipeline's write of the dead letters is then the action
        that runs the sink's writes (one Spark job for the whole batch)."""

    def available(self) -> bool:
        """WAITS_FOR_STORE: whether the store answers (on the driver, before each batch)."""
        raise NotImplementedError(f"{self.name} does not wait for its store")

    def writer_rows(self, changes: DataFrame, catalogue: Catalogue) -> DataFrame:
        """REAL_TIME: the decoded stream (`CHANGE` rows, dead letters included, in partition order) as
        the rows this sink's JVM writer takes, planned with `catalogue` (the query restarts when its
        tables' columns change); no shuffle, aggregation or Python in the plan."""
        raise NotImplementedError(f"{self.name} has no real-time writer")

    def writer(self, jvm: Any, letters: LetterTopic) -> Any:
        """REAL_TIME: the JVM ForeachWriter (a py4j object, built after `setup`) that ships `writer_rows`,
        sending what its store refuses to `letters` with the reason."""
        raise NotImplementedError(f"{self.name} has no real-time writer")

    def follow_up_topic(self) -> str | None:
        """REAL_TIME: a topic the JVM writer produces to once a change is applied, for a micro-batch
        query of this sink's own to finish the work Python does (search: its nested views); None if none."""
        return None

    def follow_up(self, records: DataFrame) -> DataFrame:
        """REAL_TIME with a `follow_up_topic`: one micro-batch of that topic's records (Kafka's columns)
        applied; returns the rejected rows like `write` (lazy: the caller runs it)."""
        raise NotImplementedError(f"{self.name} has no follow-up query")

    def folders(self) -> list[str]:
        """A Delta sink's folders: its tables are in them (`clear` removes them; `tide warehouse optimize`
        compacts the tables found in them)."""
        raise NotImplementedError(f"{self.name} keeps no tables in folders")

    def clear(self) -> None:
        """CLEARS: remove everything the sink wrote (with the query stopped), so replaying the topics
        from offset zero rebuilds it."""
        raise NotImplementedError(f"{self.name} cannot be cleared")

    def rebuild_target(self) -> Sink:
        """SWAPS_ON_REBUILD: a sink like this one that writes new, empty physical stores behind the same
        names; `tide rebuild` fills it by replaying the topics, then calls `promote` with it."""
        raise NotImplementedError(f"{self.name} does not rebuild into new stores")

    def promote(self, target: Sink) -> dict[str, str]:
        """SWAPS_ON_REBUILD: make `target`'s stores the ones users read, atomically per name; returns
        {name users read: store now behind it}. The old stores are kept for roll-back."""
        raise NotImplementedError(f"{self.name} does not rebuild into new stores")


def build_sink(name: str, settings: JobSettings, pipeline: PipelineConfig) -> Sink:
    """The sink the registry declares as `name`, configured from the job settings (its class is
    imported only now: a job loads only the clients it uses)."""
    module, _, attribute = spec_of(name).sink_class.partition(":")
    sink_type: type[Sink] = getattr(importlib.import_module(module), attribute)
    return sink_type.from_settings(settings, pipeline)

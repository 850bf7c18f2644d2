"""Typed settings of the apply jobs, read from the environment (`TIDE_JOB_*`) at start-up.

Kept apart from the stack's settings so the jobs run unchanged under
`spark-submit --master <cluster>` with nothing but these variables set:
`tide jobs start` fills them from the local stack's settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from spark_jobs.model.config import DEFAULT_PATH
from spark_jobs.model.errors import ConfigurationError
from spark_jobs.model.sink_registry import DELTA_SINKS, REALTIME_CAPABLE, SINKS, SinkName, spec_of

__all__ = ["REALTIME_CAPABLE", "SINKS", "JobSettings", "JobSettingsError", "SinkName", "one_line", "read_settings",
           "sink_names"]  # the sinks' names: spark_jobs/model/sink_registry.py


def sink_names(value: object) -> object:
    """A list of sinks from the environment: a JSON list or names separated by commas."""
    if isinstance(value, str):
        if value.lstrip().startswith("["):
            return json.loads(value)
        return [n.strip() for n in value.split(",") if n.strip()]
    return value


class JobSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIDE_JOB_", extra="ignore", frozen=True)

    pipeline_file: Path = DEFAULT_PATH
    kafka_bootstrap: str = "127.0.0.1:9092"
    # Replicas of the topics the jobs create (spark_jobs/runtime/topics.py): the stack's brokers, up to three.
    kafka_replication: int = Field(default=1, ge=1)
    elasticsearch_url: str = "http://127.0.0.1:9200"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Delta tables live under <warehouse_dir>/<table>; checkpoints under <checkpoint_dir>/<sink>.
    warehouse_dir: Path = Path(".tideline/warehouse")
    checkpoint_dir: Path = Path(".tideline/checkpoints")
    jars_dir: Path = Path(".tideline/lib/spark")
    # The driver rewrites this each supervision loop: each query's state and last error.
    status_file: Path = Path(".tideline/jobs/status.json")
    # Written by `tide jobs pause|resume`, read by the driver: the sinks whose query is held stopped.
    paused_file: Path = Path(".tideline/jobs/paused.json")
    # Written by `tide tables add|remove`, read by the driver: re-read pipeline.yaml's tables.
    reload_file: Path = Path(".tideline/jobs/reload.json")
    # Records that cannot be decoded or applied go here with the reason.
    dlq_topic: str = "tideline.dlq"
    # A read-only PostgreSQL connection (libpq conninfo) for the column catalogue: change records carry
    # no schema, so column types come from the source's catalogue (spark_jobs/model/catalogue.py).
    postgres_conninfo: SecretStr | None = None

    sinks: list[SinkName] = list(SINKS)
    # The queries that run in Real-Time Mode instead of micro-batches: long-running tasks, one per Kafka
    # partition they read, each record written as it arrives (docs/apply.md). By default every sink
    # with a JVM writer; empty (TIDE_JOB_REALTIME_SINKS= or '[]'): every query runs micro-batches.
    # A JSON list or names separated by commas: TIDE_JOB_REALTIME_SINKS=cache.
    realtime_sinks: Annotated[list[SinkName], NoDecode] = list(REALTIME_CAPABLE)
    # Real-Time Mode's epoch: how often its offsets are checkpointed and its progress reported (Spark's
    # minimum is 5 seconds). Records are written as they arrive whatever this is. Each epoch's start
    # costs planning and a task launch per partition (idle, 26 % of a core with 5-s epochs, 6-7 % with
    # 30-s ones) and stalls the writes for a second or more under load: the cache's p99 was 0.4-1.8 s
    # with 120-s epochs against 1.4-5.5 s with 30-s ones (docs/benchmarks.md, 2026-12-04). A restarted
    # driver applies again at most an epoch's changes (idempotent). Status reads what the writers
    # applied, not the epochs.
    realtime_epoch: Annotated[str, Field(pattern=r"^\d+ (seconds|minutes)$")] = "120 seconds"
    # Back-pressure: how often a micro-batch starts and how many records it may take.
    trigger_interval: Annotated[str, Field(pattern=r"^\d+ (milliseconds|seconds|minutes)$")] = "2 seconds"
    # Delta pays a fixed cost per MERGE (several Spark jobs per table), so the warehouse runs
    # fewer, larger batches; search and cache keep the short interval.
    warehouse_trigger_interval: Annotated[str, Field(pattern=r"^\d+ (milliseconds|seconds|minutes)$")] = "10 seconds"
    # History and windows cost more Delta jobs and commits per batch than the current state and
    # nothing waits on them within seconds: fewer, larger batches leave the 2 cores to the others.
    analytics_trigger_interval: Annotated[str, Field(pattern=r"^\d+ (milliseconds|seconds|minutes)$")] = "30 seconds"
    max_offsets_per_trigger: int = Field(default=20_000, ge=1)
    # The Delta queries' batch cost is mostly fixed (planning and committing about five Spark jobs per
    # table), so when they are behind (a snapshot, a backlog) larger batches apply far more per second:
    # warehouse alone 2,070 changes/s in 20,000-change batches, 7,800 in 100,000 (docs/apply.md).
    delta_max_offsets_per_trigger: int = Field(default=100_000, ge=1)
    # Search's follow-up query (the nested views' lookups) rebuilds each touched document once per batch,
    # so when it is behind larger batches rebuild fewer: a 500,000-change drain with search alone had its
    # nested views caught up after 182 s with 100,000, 240 s with 20,000 (docs/benchmarks.md, 2026-12-04).
    follow_up_max_offsets_per_trigger: int = Field(default=100_000, ge=1)
    # None = let spark-submit's --master decide (cluster runs). Locally, 4 task slots (the micro-batch
    # queries'; a local driver adds one per Kafka partition its real-time queries read) on the
    # machine's 2 cores: FAIR pools never preempt a running task, so with 2 slots the analytics
    # query's long tasks took both, and each of the warehouse's many short jobs waited for one
    # (measured: a 224-record warehouse batch took 10.7 minutes). A stage still has at most 2 tasks
    # (spark.default.parallelism), so the extra slots serve the other queries.
    master: str | None = "local[4]"
    # A cluster master (spark://...): how many executors the jobs ask it for (the task slots they need are
    # split evenly among them: realtime.cluster_conf), each one's heap, and the address the executors reach
    # the driver at (spark.driver.host; unset: Spark's choice, the machine's name). docs/cluster.md.
    executors: int = Field(default=2, ge=1)
    executor_memory: Annotated[str, Field(pattern=r"^\d+[mMgG]$")] = "1g"
    driver_host: str | None = None
    # The whole local[4] job runs in this heap: four queries, two of them holding 20,000-record batches
    # (persisted) while Delta reads history tables. 1g died of OutOfMemoryError in the drain benchmark.
    driver_memory: str = "2g"
    # More options of a local driver's JVM, space-separated (e.g. the JIT's; the class archive's are
    # added by spark_jobs/runtime/session.py). A cluster run passes spark-submit's --driver-java-options.
    jvm_options: str = ""
    es_bulk_size: int = Field(default=1000, ge=1)
    # Real-Time Mode: how often the search writer makes what it wrote searchable (one refresh per index
    # that was written); 0 refreshes after every bulk request. Each refresh costs Elasticsearch CPU.
    es_refresh_ms: int = Field(default=100, ge=0)
    # Set: locally (`python -m spark_jobs --keep-alive`) the Delta queries run in a driver of their own
    # at this nice value, so search and cache get the CPU first (spark_jobs/runtime/drivers.py). Unset (the
    # default): one driver. Measured: on a saturated machine the Delta driver starves (docs/apply.md).
    delta_driver_nice: int | None = Field(default=None, ge=0, le=19)

    _names = field_validator("realtime_sinks", mode="before")(lambda value: sink_names(value))

    @field_validator("realtime_sinks")
    @classmethod
    def _has_a_writer(cls, sinks: list[SinkName]) -> list[SinkName]:
        if unable := [sink for sink in sinks if sink not in REALTIME_CAPABLE]:
            raise ValueError(f"{', '.join(unable)} cannot run in Real-Time Mode yet (only "
                             f"{', '.join(REALTIME_CAPABLE)} have a JVM writer): remove it from the list")
        return sinks

    @field_validator("delta_driver_nice", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    def trigger_interval_of(self, sink: str) -> str:
        """How often `sink`'s query starts a micro-batch."""
        return str(getattr(self, spec_of(sink).trigger_setting))

    def max_offsets_of(self, sink: str) -> int:
        """The most records one micro-batch of `sink`'s query takes."""
        return self.delta_max_offsets_per_trigger if sink in DELTA_SINKS else self.max_offsets_per_trigger

    def require_postgres_conninfo(self) -> str:
        if self.postgres_conninfo is None:
            raise JobSettingsError("TIDE_JOB_POSTGRES_CONNINFO is not set: the jobs read column types from "
                                   "PostgreSQL's catalogue; `tide jobs start` sets it from the stack's settings "
                                   "(the CDC role)")
        return self.postgres_conninfo.get_secret_value()


def one_line(exc: ValidationError, prefix: str) -> str:
    """A settings error as one line naming its variable (`prefix` + the field), for users."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    if not field:  # a check across settings (e.g. TIDE_POSTGRES_URL's parts): its message names them
        return f"invalid settings: {first['msg'].removeprefix('Value error, ')}"
    return f"invalid setting {prefix}{field.upper()}: {first['msg']}"


def read_settings() -> JobSettings:
    """The job settings from the environment; a bad one is a one-line JobSettingsError naming its variable."""
    try:
        return JobSettings()
    except ValidationError as exc:
        raise JobSettingsError(one_line(exc, "TIDE_JOB_")) from None


class JobSettingsError(ConfigurationError):
    """A TIDE_JOB_* setting is missing or invalid; the message names the variable."""

"""Every sink, declared once: its name, the pipeline.yaml view it reads, how its query runs, what it
can do, and the class that builds it. The settings' list of sinks, the tables each query reads, the
pace of its micro-batches, the driver a query runs in, `tide rebuild`, and the sinks `tide verify` and
`tide bench` read (and how) are all derived from here; a name not declared here is an error. Imports
nothing of the pipeline's (config, settings and the sinks import it) and no pyspark (the CLI reads it):
a sink's class is imported only when one is built (`spark_jobs.sinks.base.build_sink`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal, get_args

from spark_jobs.model.errors import ConfigurationError


class Capability(Enum):
    """What a sink can do beyond `setup` and `write`, or what its store guarantees; the registry states
    each sink's set, and the pipeline, `tide rebuild` and `tide verify` ask it (`Sink.can`, `spec_of`),
    never probe for methods or compare names."""

    # `write` runs no Spark action: the frame it returns is lazy, and the pipeline's write of the dead
    # letters runs the whole batch as one job. Without it the pipeline persists the batch's frames
    # while the sink runs its own actions (Delta's MERGEs), so the topics are read and decoded once.
    SINGLE_PASS = "single_pass"
    # `available()`: the query holds (with back-off) while the store is down, instead of launching
    # tasks that would fail and take shared Python workers with them.
    WAITS_FOR_STORE = "waits_for_store"
    # `Batch.every` is read: every change of the batch, not only the newest per row (SCD2 history).
    EVERY_CHANGE = "every_change"
    # `clear()`: removes everything the sink wrote, so `tide rebuild` replays the topics into an empty store.
    CLEARS = "clears"
    # `writer_rows()` / `writer()`: the sink can run in Spark's Real-Time Mode (spark_jobs/realtime.py):
    # Spark SQL builds each change's request, a JVM ForeachWriter ships it as it arrives.
    REAL_TIME = "real_time"
    # `rebuild_target()` / `promote()`: a rebuild fills new physical stores behind the users' names and
    # swaps them in at the end (Elasticsearch aliases), so readers never see a half-built view.
    SWAPS_ON_REBUILD = "swaps_on_rebuild"
    # The store holds at most one entry per row key (an Elasticsearch document id, a Redis key), so a key
    # read twice is the read repeating itself (Redis SCAN may return a key twice), never a second row.
    # A Delta table can hold two rows for one key: `tide verify` reports those (`duplicate`).
    UNIQUE_KEYS = "unique_keys"


class Kind(Enum):
    """How a sink's query is paced and where it runs."""

    # Ships rows to a store that answers reads within seconds: short micro-batches or Real-Time Mode.
    SHIPPING = "shipping"
    # Writes Delta tables: a fixed cost per table and batch, so fewer, larger micro-batches, in the
    # driver that gives way when one is configured (spark_jobs/runtime/drivers.py).
    DELTA = "delta"


# The names as a type, for settings and signatures; checked against the declarations below at import.
SinkName = Literal["search", "cache", "warehouse", "analytics"]


@dataclass(frozen=True)
class SinkSpec:
    name: SinkName
    kind: Kind
    capabilities: frozenset[Capability]
    # The pipeline.yaml view section whose tables the query reads; None for a sink derived from other
    # views (analytics: the tables its history and windows are built from, PipelineConfig.analytics_tables).
    view: str | None
    # The JobSettings field holding how often its micro-batch starts.
    trigger_setting: str
    # "module:Class" of its Sink; the class builds itself from the job settings (`from_settings`).
    sink_class: str

    @property
    def derived(self) -> bool:
        """The sink has no view of its own: it builds tables derived from other views' (analytics: the
        history and windows of the tables PipelineConfig.analytics_tables names)."""
        return self.view is None


_SPECS = (
    SinkSpec("search", Kind.SHIPPING,
             frozenset({Capability.SINGLE_PASS, Capability.WAITS_FOR_STORE, Capability.SWAPS_ON_REBUILD,
                        Capability.REAL_TIME, Capability.UNIQUE_KEYS}),
             "search", "trigger_interval", "spark_jobs.sinks.elasticsearch:ElasticsearchSink"),
    SinkSpec("cache", Kind.SHIPPING,
             frozenset({Capability.SINGLE_PASS, Capability.WAITS_FOR_STORE, Capability.CLEARS, Capability.REAL_TIME,
                        Capability.UNIQUE_KEYS}),
             "cache", "trigger_interval", "spark_jobs.sinks.redis:RedisSink"),
    SinkSpec("warehouse", Kind.DELTA, frozenset({Capability.CLEARS}),
             "warehouse", "warehouse_trigger_interval", "spark_jobs.sinks.delta:WarehouseSink"),
    # The warehouse's derived tables (SCD2 history, event-time windows): a query of its own, so the
    # current-state tables never wait for them.
    SinkSpec("analytics", Kind.DELTA, frozenset({Capability.EVERY_CHANGE, Capability.CLEARS}),
             None, "analytics_trigger_interval", "spark_jobs.sinks.delta:AnalyticsSink"),
)
REGISTRY: dict[str, SinkSpec] = {spec.name: spec for spec in _SPECS}
SINKS: tuple[SinkName, ...] = tuple(spec.name for spec in _SPECS)
DELTA_SINKS: tuple[SinkName, ...] = tuple(spec.name for spec in _SPECS if spec.kind is Kind.DELTA)
REALTIME_CAPABLE: tuple[SinkName, ...] = tuple(spec.name for spec in _SPECS
                                               if Capability.REAL_TIME in spec.capabilities)
assert get_args(SinkName) == SINKS, "SinkName must list the declared sinks, in order"


class UnknownSinkError(ConfigurationError):
    """A sink name that is not declared here."""


def spec_of(name: str) -> SinkSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownSinkError(f"unknown sink {name}; choose one of {', '.join(SINKS)}") from None


"""End-to-end freshness, measured from outside: marker rows committed at known times, read back from each sink.

A writer commits one new `customers` row (the marker) every interval and notes the
wall-clock time its COMMIT returned. One reader per sink polls that sink, the way
a user of the view would read it, for the markers not seen yet; a marker's delay
is the time of the first poll that finds it minus its commit time. The delay is
therefore an upper bound by at most one poll interval (recorded in the result).
Search counts a marker once a search finds it (after an index refresh), not a
realtime GET. A fourth reader, `captured`, tails the marker table's change topic: commit → in
Kafka, the capture stage's own delay (what Debezium's poll interval and the producer's linger add).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice

from services.demo.workload import PROBE_DOMAIN
from services.jobs.driver import job_settings
from services.settings import StackSettings
from services.stack.rows import scalar
from spark_jobs.model.config import PipelineConfig
from spark_jobs.model.settings import SINKS, JobSettings, SinkName
from spark_jobs.model.sink_registry import spec_of
from spark_jobs.sinks.redis import row_key

TABLE = "customers"
# Seconds between two reads of a view's store: a delay is an upper bound by at most this (plus the read),
# so each must be well under the targets it is held to (issue 33: cache p50 50 ms at ~50 row changes/s,
# search p50 1 s). Redis answers a pipelined EXISTS in well under a millisecond: every 10 ms. A search is
# a request Elasticsearch plans and runs on the cores it shares with the pipeline: every 50 ms, half the
# search writer's refresh interval. Delta is read by opening the table log each time: every 2 s, so the
# probe does not load the machine it measures (its delays are tens of seconds anyway).
POLL_BY_VIEW: dict[str, float] = {"cache": 0.01, "search": 0.05, "warehouse": 2.0}
# The topic's reader blocks in Kafka's poll (up to 50 ms, returning as soon as a record arrives): between
# two polls it only yields.
CAPTURED_POLL_S = 0.002

Finder = Callable[[list[int]], set[int]]


def capture_finder(settings: StackSettings, pipeline: PipelineConfig) -> Finder:
    """Marker ids seen in the marker table's change topic since now (read from its end, by one thread)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    topic = pipeline.topic(TABLE)
    partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
    consumer.assign(partitions)
    consumer.seek_to_end(*partitions)
    for partition in partitions:
        # seek_to_end is lazy: resolved at the first poll, it could land after the first marker and miss
        # it (seen once: a marker every sink showed, never seen in Kafka). Resolve the ends now.
        consumer.position(partition)
    seen: set[int] = set()

    def in_kafka(ids: list[int]) -> set[int]:
        for records in consumer.poll(timeout_ms=50).values():
            seen.update(key for record in records if (key := record_id(record.key)) is not None)
        return seen.intersection(ids)

    return in_kafka


def record_id(key: bytes | None) -> int | None:
    """The `id` in a change record's JSON key, with Connect's schema envelope or without."""
    if not key:
        return None
    try:
        document = json.loads(key)
    except ValueError:
        return None
    document = document.get("payload", document) if isinstance(document, dict) else None
    value = document.get("id") if isinstance(document, dict) else None
    return value if isinstance(value, int) else None


def _search_finder(jobs: JobSettings, pipeline: PipelineConfig) -> Finder:
    from elasticsearch import Elasticsearch

    search = pipeline.tables[TABLE].search
    alias = (search.index if search else None) or TABLE
    es = Elasticsearch(jobs.elasticsearch_url, request_timeout=10)

    def in_search(ids: list[int]) -> set[int]:
        if not es.indices.exists_alias(name=alias) and not es.indices.exists(index=alias):
            return set()
        found = es.search(index=alias, query={"ids": {"values": [str(i) for i in ids]}}, source=False, size=len(ids))
        return {int(hit["_id"]) for hit in found["hits"]["hits"]}

    return in_search


def _cache_finder(jobs: JobSettings, pipeline: PipelineConfig) -> Finder:
    import redis

    cache = redis.Redis.from_url(jobs.redis_url)

    def in_cache(ids: list[int]) -> set[int]:
        pipe = cache.pipeline(transaction=False)
        for key in ids:
            pipe.exists(row_key(TABLE, str(key)))
        return {key for key, exists in zip(ids, pipe.execute(), strict=True) if exists}

    return in_cache


def _warehouse_finder(jobs: JobSettings, pipeline: PipelineConfig) -> Finder:
    from deltalake import DeltaTable, QueryBuilder

    warehouse = str(jobs.warehouse_dir / TABLE)

    def in_warehouse(ids: list[int]) -> set[int]:
        try:
            table = DeltaTable(warehouse)
        except Exception:  # noqa: BLE001 - no table yet: nothing readable
            return set()
        listed = ",".join(str(int(i)) for i in ids)
        rows = QueryBuilder().register("t", table).execute(f"SELECT id FROM t WHERE id IN ({listed})").read_all()
        return set(rows.column("id").to_pylist())

    return in_warehouse


# How a marker is looked up in the store of each pipeline.yaml view a sink declares (SinkSpec.view),
# the way that view's users read it: keyed by the view, as the lookup is the store's.
# tests/unit/test_bench.py holds these keys to the registry's views, so a sink declared with a new view
# fails there until it has a finder. A derived sink (analytics) has no view of the marker table: no probe.
FINDERS: dict[str, Callable[[JobSettings, PipelineConfig], Finder]] = {
    "search": _search_finder, "cache": _cache_finder, "warehouse": _warehouse_finder}
PROBED: tuple[SinkName, ...] = tuple(sink for sink in SINKS if not spec_of(sink).derived)
POLL_S: dict[str, float] = {"captured": CAPTURED_POLL_S,
                            **{sink: POLL_BY_VIEW[view] for sink in PROBED if (view := spec_of(sink).view)}}


def sink_finders(
    settings: StackSettings, pipeline: PipelineConfig, sinks: tuple[SinkName, ...]
) -> dict[str, Finder]:
    """For each of `sinks` with a probe, a function from marker ids to the ones readable in that sink now."""
    jobs = job_settings(settings)
    return {sink: FINDERS[view](jobs, pipeline) for sink in PROBED
            if sink in sinks and (view := spec_of(sink).view) is not None}


@dataclass
class Marker:
    id: int
    committed_at: float  # seconds on the bench's clock
    seen_at: dict[str, float] = field(default_factory=dict)


class FreshnessProbe:
    """Commits markers every `interval_s` and records when each sink first shows each of them."""

    def __init__(self, conninfo: str, finders: dict[str, Finder], clock: Callable[[], float],
                 interval_s: float = 0.5) -> None:
        self.conninfo, self.finders, self.clock, self.interval_s = conninfo, finders, clock, interval_s
        self.markers: dict[int, Marker] = {}
        # Per sink, the ids it has not shown yet, oldest first: its reader polls every few ms and should not
        # scan every marker of the run to find them.
        self._waiting: dict[str, dict[int, None]] = {sink: {} for sink in finders}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._writing = threading.Event()
        self._stop = threading.Event()
        self._run = uuid.uuid4().hex[:8]
        self._threads = [threading.Thread(target=self._write, daemon=True, name="marker-writer")] + [
            threading.Thread(target=self._read, args=(sink,), daemon=True, name=f"marker-{sink}") for sink in finders
        ]

    def start(self) -> None:
        self._writing.set()
        for thread in self._threads:
            thread.start()

    def stop_writing(self) -> None:
        self._writing.clear()

    def pending(self) -> dict[str, int]:
        with self._lock:
            return {sink: len(waiting) for sink, waiting in self._waiting.items()}

    def stop(self) -> None:
        self._writing.clear()
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _write(self) -> None:
        import psycopg

        sequence = 0
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            while not self._stop.wait(self.interval_s):
                if not self._writing.is_set():
                    continue
                sequence += 1
                key = scalar(
                    conn,
                    "INSERT INTO customers (email, name, country) VALUES (%s, %s, 'GB') RETURNING id",
                    (f"marker-{self._run}-{sequence}@{PROBE_DOMAIN}", f"Marker {sequence}"),
                )
                committed = self.clock()  # autocommit: the INSERT has committed when execute returns
                with self._lock:
                    self.markers[key] = Marker(key, committed)
                    for waiting in self._waiting.values():
                        waiting[key] = None

    def _read(self, sink: str) -> None:
        finder = self.finders[sink]
        while not self._stop.wait(POLL_S[sink]):
            with self._lock:
                waiting = list(islice(self._waiting[sink], 500))
            if not waiting:
                continue
            try:
                found = finder(waiting)
            except Exception as exc:  # noqa: BLE001 - a sink briefly unreadable is a delay, not a crash
                if len(self.errors) < 50:
                    self.errors.append(f"{sink}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            seen = self.clock()
            with self._lock:
                for key in found:  # a subset of `waiting`: the finders answer for the ids asked
                    self._waiting[sink].pop(key, None)
                    self.markers[key].seen_at.setdefault(sink, seen)

    def delays(self, since: float = 0.0, until: float = float("inf")) -> dict[str, list[list[float]]]:
        """Per sink: [commit time, delay] of every marker committed in [since, until) that the sink showed."""
        with self._lock:
            markers = [m for m in self.markers.values() if since <= m.committed_at < until]
        return {
            sink: [[round(m.committed_at, 3), round(m.seen_at[sink] - m.committed_at, 3)]
                   for m in markers if sink in m.seen_at]
            for sink in self.finders
        }

    def unseen(self, since: float = 0.0, until: float = float("inf")) -> dict[str, int]:
        with self._lock:
            markers = [m for m in self.markers.values() if since <= m.committed_at < until]
        return {sink: sum(1 for m in markers if sink not in m.seen_at) for sink in self.finders}


def delay_values(points: Iterable[list[float]]) -> list[float]:
    return [delay for _, delay in points]

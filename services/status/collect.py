"""Reading the status figures from the real systems: Kafka (end offsets, the records at each query's
checkpointed offsets, the dead-letter topic, the positions real-time writers published as applied), each
query's checkpoint folder, the driver's report,
Kafka Connect's REST API and PostgreSQL's pg_replication_slots. Nothing comes from counters kept
in memory by the jobs. A system that does not answer is reported in `Status.problems`, never raised."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from services.capture.connector import registration
from services.capture.connector.connect_api import ConnectApi, ConnectError
from services.jobs import dlq, driver, lag
from services.settings import StackSettings
from services.stack import kafka
from services.status.figures import (
    SinkFigures,
    SourceFigures,
    Status,
    TableFigures,
    TaskFigures,
    first_commit,
    last_commit,
    newest,
    oldest,
    query_state,
)
from spark_jobs.changes import DecodeError, decode
from spark_jobs.model.config import PipelineConfig
from spark_jobs.model.settings import SINKS

# Records read on each side of a checkpointed offset to find one that carries a commit time
# (a tombstone or an undecodable record has none).
WINDOW = 8
READ_TIMEOUT_S = 5.0
# A status must answer soon when Kafka is down (the client's default waits 30 s to bootstrap).
BOOTSTRAP_TIMEOUT_MS = 5_000

# (topic, partition, first offset, offset after the last): a span of a partition to read.
Window = tuple[str, int, int, int]


def collect(settings: StackSettings, pipeline: PipelineConfig) -> Status:
    problems: list[str] = []
    report = driver.read_status(settings)
    now_ms = int(time.time() * 1000)
    return Status(
        taken_at_ms=now_ms,
        driver_report_age_s=None if report is None else max(0, now_ms - report["written_at_ms"]) / 1000,
        source=source_figures(settings, pipeline, problems),
        sinks=sink_figures(settings, pipeline, report, now_ms, problems),
        problems=tuple(problems),
    )


def source_figures(settings: StackSettings, pipeline: PipelineConfig, problems: list[str]) -> SourceFigures:
    name, slot_name = pipeline.source.connector, pipeline.source.slot
    state = "unreachable"
    tasks: tuple[TaskFigures, ...] = ()
    try:
        with ConnectApi(kafka.connect_url(settings), timeout=5.0) as api:
            reported = api.status(name)
        state = "absent" if reported is None else reported["connector"]["state"]
        tasks = tuple(
            TaskFigures(task["id"], task["state"], _first_line(task.get("trace")))
            for task in (reported or {}).get("tasks", [])
        )
    except ConnectError as exc:
        problems.append(str(exc))
    slot, found = None, None
    try:
        slot = registration.slot_state(settings, slot_name)
        found = slot is not None
    except Exception as exc:  # noqa: BLE001 - psycopg's errors: PostgreSQL down or refusing
        problems.append(f"cannot read replication slot {slot_name} from PostgreSQL: {_first_line(str(exc))}")
    return SourceFigures(
        connector=name,
        connector_state=state,
        tasks=tasks,
        slot=slot_name,
        slot_found=found,
        slot_active=slot.active if slot else None,
        slot_lag_bytes=slot.lag_bytes if slot else None,
        slot_wal_status=slot.wal_status if slot else None,
        slot_lag_warn_bytes=settings.slot_lag_warn_bytes,
    )


def sink_figures(
    settings: StackSettings, pipeline: PipelineConfig, report: dict | None, now_ms: int, problems: list[str]
) -> tuple[SinkFigures, ...]:
    jobs = driver.job_settings(settings)
    views = {sink: {table: pipeline.topic(table) for table in pipeline.sink_tables(sink)} for sink in SINKS}
    checkpoints: dict[str, Path] = {sink: jobs.checkpoint_dir / sink for sink in SINKS}
    try:
        # A real-time query commits at its epochs' ends only: what its writers applied since counts too.
        committed = lag.positions(settings, checkpoints, jobs.realtime_sinks, BOOTSTRAP_TIMEOUT_MS)
        every_topic = sorted({topic for names in views.values() for topic in names.values()})
        ends = lag.end_offsets(settings, every_topic, BOOTSTRAP_TIMEOUT_MS)
        wanted = {span for sink, topics in views.items() for topic in topics.values()
                  for span in spans(topic, committed[sink].get(topic, {}), ends.get(topic, {}))}
        times = commit_times(settings, wanted)
        dead = dlq.count_by_sink_and_topic(
            dlq.read_letters(settings, jobs.dlq_topic, bootstrap_timeout_ms=BOOTSTRAP_TIMEOUT_MS))
        follow_ups = {sink: lag.follow_up_behind(settings, jobs, sink, topic) for sink in jobs.realtime_sinks
                      if views.get(sink) and (topic := lag.follow_up_topic(jobs, pipeline, sink))}
    except KafkaError as exc:
        problems.append(f"cannot read Kafka at {settings.kafka_bootstrap}: {exc}")
        # The checkpoints alone, when Kafka (and so the writers' applied positions) cannot be read.
        committed = {sink: lag.committed_offsets(path) for sink, path in checkpoints.items()}
        ends, times, dead, follow_ups = None, {}, {}, {}
    figures = []
    for sink, topics in views.items():
        if not topics:
            continue
        state, last_error = query_state(report, sink, now_ms)
        tables = tuple(
            table_figures(table, topic, committed[sink].get(topic, {}), None if ends is None else ends.get(topic, {}),
                          times, None if ends is None else dead.get((sink, topic), 0))
            for table, topic in topics.items()
        )
        figures.append(SinkFigures(sink, state, last_error, tables, follow_ups.get(sink)))
    return tuple(figures)


def spans(topic: str, committed: dict[int, int], ends: dict[int, int]) -> list[Window]:
    """Where to read commit times for one query and topic: the records just before its position in
    each partition (the newest it applied) and from its position on (the oldest it has not)."""
    return [*_applied_spans(topic, committed, ends), *_unapplied_spans(topic, committed, ends)]


def _applied_spans(topic: str, committed: dict[int, int], ends: dict[int, int]) -> list[Window]:
    return [(topic, p, max(0, committed[p] - WINDOW), committed[p]) for p in ends if committed.get(p, 0) > 0]


def _unapplied_spans(topic: str, committed: dict[int, int], ends: dict[int, int]) -> list[Window]:
    return [(topic, p, committed.get(p, 0), min(end, committed.get(p, 0) + WINDOW))
            for p, end in ends.items() if committed.get(p, 0) < end]


def table_figures(
    table: str, topic: str, committed: dict[int, int], ends: dict[int, int] | None,
    times: dict[Window, list[tuple[int, int | None]]], dead_letters: int | None,
) -> TableFigures:
    """One table's figures; with `ends` None (Kafka could not be read) only what is known without it."""
    if ends is None:
        return TableFigures(table, topic, None, None, None, None)
    return TableFigures(
        table=table,
        topic=topic,
        records_behind=lag.records_behind({topic: committed}, {topic: ends}),
        dead_letters=dead_letters,
        newest_applied_commit_ms=newest(
            last_commit(times.get(span, [])) for span in _applied_spans(topic, committed, ends)
        ),
        oldest_unapplied_commit_ms=oldest(
            first_commit(times.get(span, [])) for span in _unapplied_spans(topic, committed, ends)
        ),
    )


def commit_times(settings: StackSettings, spans: Iterable[Window]) -> dict[Window, list[tuple[int, int | None]]]:
    """(offset, source commit time) of each record in each span, read from Kafka. A partition is
    read for one span at a time, so spans of the same partition go in rounds."""
    by_partition: dict[TopicPartition, list[Window]] = defaultdict(list)
    for span in sorted(spans):
        if span[2] < span[3]:
            by_partition[TopicPartition(span[0], span[1])].append(span)
    found: dict[Window, list[tuple[int, int | None]]] = {}
    if not by_partition:
        return found
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", bootstrap_timeout_ms=BOOTSTRAP_TIMEOUT_MS)
    try:
        while by_partition:
            round_ = {tp: spans.pop(0) for tp, spans in by_partition.items()}
            by_partition = {tp: spans for tp, spans in by_partition.items() if spans}
            found.update(_read_round(consumer, round_))
    finally:
        consumer.close()
    return found


def _read_round(consumer: KafkaConsumer, round_: dict[TopicPartition, Window]) -> dict[Window, list]:
    consumer.assign(list(round_))
    for tp, span in round_.items():
        consumer.seek(tp, span[2])
    found: dict[Window, list] = {span: [] for span in round_.values()}
    reading = set(round_)
    deadline = time.monotonic() + READ_TIMEOUT_S
    while reading and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=200).items():
            span = round_[tp]
            found[span] += [(r.offset, _commit_ms(tp.topic, r.key, r.value)) for r in records if r.offset < span[3]]
        reading = {tp for tp in reading if consumer.position(tp) < round_[tp][3]}
        consumer.pause(*(set(round_) - reading))
    consumer.resume(*round_)
    return found


def _commit_ms(topic: str, key: bytes | None, value: bytes | None) -> int | None:
    """source.ts_ms of a change record (when its transaction committed); None for a tombstone or junk."""
    try:
        change = decode(topic, key, value)
    except DecodeError:
        return None
    return change.commit_ts_ms if change else None


def _first_line(text: str | None) -> str | None:
    lines = (text or "").strip().splitlines()
    return lines[0][:300] if lines else None

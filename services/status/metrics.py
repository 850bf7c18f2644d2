"""The status figures in Prometheus' text format (`GET /metrics`), rendered by prometheus-client
from one `Status` read at scrape time: a gauge per figure, labelled by sink and table."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from services.status.figures import Status, age_s

CONTENT_TYPE = CONTENT_TYPE_LATEST
QUERY_STATES = ("running", "paused", "stopped", "unknown")
CONNECTOR_STATES = ("RUNNING", "PAUSED", "STOPPED", "FAILED", "UNASSIGNED", "RESTARTING", "absent", "unreachable")


class _StatusCollector(Collector):
    def __init__(self, status: Status) -> None:
        self.status = status

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from _sink_metrics(self.status)
        yield from _source_metrics(self.status)


def _gauge(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"tideline_{name}", documentation, labels=labels)


def _sink_metrics(status: Status) -> Iterator[GaugeMetricFamily]:
    now = status.taken_at_ms
    behind = _gauge("records_behind", "Records in the table's topic the sink's query has not committed",
                    ["sink", "table"])
    dead = _gauge("dead_letters", "Distinct records of the table's topic in the dead-letter topic, per sink",
                  ["sink", "table"])
    applied = _gauge("newest_applied_age_seconds",
                     "Now minus the source commit time of the newest change the query committed", ["sink", "table"])
    unapplied = _gauge("oldest_unapplied_age_seconds",
                       "Now minus the source commit time of the oldest change the query has not committed "
                       "(0 when none is waiting)", ["sink", "table"])
    state = _gauge("query_state", "1 for the state the sink's query is in", ["sink", "state"])
    follow_up = _gauge("follow_up_records_behind", "Lookups of the sink's nested views its follow-up query "
                       "has not applied (search in Real-Time Mode)", ["sink"])
    for sink in status.sinks:
        for table in sink.tables:
            labels = [sink.sink, table.table]
            if table.records_behind is None or table.dead_letters is None:
                continue  # Kafka could not be read (both are None then): no figure rather than a false 0
            behind.add_metric(labels, table.records_behind)
            dead.add_metric(labels, table.dead_letters)
            if (newest_age := age_s(now, table.newest_applied_commit_ms)) is not None:
                applied.add_metric(labels, newest_age)
            if (oldest_age := age_s(now, table.oldest_unapplied_commit_ms)) is not None:
                unapplied.add_metric(labels, oldest_age)
            elif table.records_behind == 0:
                unapplied.add_metric(labels, 0.0)
        for name in QUERY_STATES:
            state.add_metric([sink.sink, name], 1.0 if sink.state == name else 0.0)
        if sink.follow_up_behind is not None:
            follow_up.add_metric([sink.sink], sink.follow_up_behind)
    yield from (behind, dead, applied, unapplied, state, follow_up)


def _source_metrics(status: Status) -> Iterator[GaugeMetricFamily]:
    source = status.source
    connector = _gauge("connector_state", "1 for the state Kafka Connect reports for the connector",
                       ["connector", "state"])
    states = (CONNECTOR_STATES if source.connector_state in CONNECTOR_STATES
              else (*CONNECTOR_STATES, source.connector_state))
    for name in states:
        connector.add_metric([source.connector, name], 1.0 if source.connector_state == name else 0.0)
    tasks = _gauge("connector_tasks_running", "Tasks of the connector in state RUNNING", ["connector"])
    tasks.add_metric([source.connector], sum(task.state == "RUNNING" for task in source.tasks))
    yield from (connector, tasks)
    if source.slot_active is not None:
        active = _gauge("replication_slot_active", "1 while a consumer (Debezium) reads the slot", ["slot"])
        active.add_metric([source.slot], 1.0 if source.slot_active else 0.0)
        yield active
    if source.slot_lag_bytes is not None:
        lag = _gauge("replication_slot_lag_bytes", "WAL bytes the slot holds: current WAL position minus "
                     "the position the connector confirmed", ["slot"])
        lag.add_metric([source.slot], source.slot_lag_bytes)
        yield lag
    if source.slot_found:
        threshold = _gauge("replication_slot_lag_warn_bytes", "TIDE_SLOT_LAG_WARN_BYTES: the slot lag past which "
                           "the status warns", ["slot"])
        threshold.add_metric([source.slot], source.slot_lag_warn_bytes)
        lost = _gauge("replication_slot_lost", "1 when PostgreSQL invalidated the slot (wal_status lost): "
                      "re-snapshot, see docs/reliability.md", ["slot"])
        lost.add_metric([source.slot], 1.0 if source.slot_wal_status == "lost" else 0.0)
        yield from (threshold, lost)
    warnings = _gauge("status_warnings", "Conditions needing action (GET /status warnings)", [])
    warnings.add_metric([], len(source.warnings))
    yield warnings
    if status.driver_report_age_s is not None:
        report = _gauge("driver_report_age_seconds", "Age of the oldest jobs driver's last report (status.*.json)", [])
        report.add_metric([], status.driver_report_age_s)
        yield report
    problems = _gauge("status_problems", "Systems the status could not read (see GET /status)", [])
    problems.add_metric([], len(status.problems))
    yield problems


def render(status: Status) -> bytes:
    """The exposition text of one status (a registry of its own per scrape: no global state)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatusCollector(status))
    return generate_latest(registry)

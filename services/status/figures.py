"""The status figures and the arithmetic on them (pure: no I/O), shared by every view of them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from services.capture.connector.slot_safety import slot_warnings
from services.settings import DEFAULT_LAG_WARN_BYTES

# The driver rewrites its report every few seconds; older than this, it is not running.
REPORT_STALE_S = 30.0


@dataclass(frozen=True)
class TableFigures:
    """One table's topic as one sink's query sees it."""

    table: str
    topic: str
    # None when Kafka could not be read: unknown is not zero.
    records_behind: int | None  # Kafka end offsets minus the query's checkpointed offsets
    dead_letters: int | None  # distinct records of this topic in the dead-letter topic for this sink
    newest_applied_commit_ms: int | None  # source commit time of the newest change the query committed
    oldest_unapplied_commit_ms: int | None  # source commit time of the first change it has not committed


@dataclass(frozen=True)
class SinkFigures:
    sink: str
    state: str  # running | paused | stopped | unknown (the driver is not reporting)
    last_error: str | None
    tables: tuple[TableFigures, ...]
    # Search's nested views in Real-Time Mode: lookups its follow-up query has not applied (until it has,
    # the nested documents they reach are behind their rows). None for a sink without one, or unknown.
    follow_up_behind: int | None = None

    @property
    def records_behind(self) -> int | None:
        return total(table.records_behind for table in self.tables)

    @property
    def dead_letters(self) -> int | None:
        return total(table.dead_letters for table in self.tables)

    @property
    def newest_applied_commit_ms(self) -> int | None:
        return newest(table.newest_applied_commit_ms for table in self.tables)

    @property
    def oldest_unapplied_commit_ms(self) -> int | None:
        return oldest(table.oldest_unapplied_commit_ms for table in self.tables)


@dataclass(frozen=True)
class TaskFigures:
    id: int
    state: str
    error: str | None


@dataclass(frozen=True)
class SourceFigures:
    connector: str
    # Connect's state (RUNNING, PAUSED, STOPPED, FAILED, UNASSIGNED), or absent / unreachable.
    connector_state: str
    tasks: tuple[TaskFigures, ...]
    slot: str
    slot_found: bool | None  # None: PostgreSQL did not answer
    slot_active: bool | None  # None: the slot does not exist or PostgreSQL did not answer
    slot_lag_bytes: int | None  # WAL the slot still holds: current WAL position minus confirmed_flush_lsn
    slot_wal_status: str | None
    slot_lag_warn_bytes: int = DEFAULT_LAG_WARN_BYTES  # TIDE_SLOT_LAG_WARN_BYTES

    @property
    def connector_running(self) -> bool:
        return self.connector_state == "RUNNING" and all(task.state == "RUNNING" for task in self.tasks)

    @property
    def warnings(self) -> tuple[str, ...]:
        """One line per slot condition that needs action (lost, unreserved, lag over the threshold)."""
        return slot_warnings(self.slot, self.slot_wal_status, self.slot_lag_bytes, self.slot_lag_warn_bytes)


@dataclass(frozen=True)
class Status:
    taken_at_ms: int
    driver_report_age_s: float | None  # None: the driver has not written a report
    source: SourceFigures
    sinks: tuple[SinkFigures, ...]
    problems: tuple[str, ...] = field(default=())  # systems that could not be read, one line each


def total(counts: Iterable[int | None]) -> int | None:
    """The sum, or None if any part is unknown."""
    parts = list(counts)
    known = [part for part in parts if part is not None]
    return None if len(known) < len(parts) else sum(known)


def newest(times: Iterable[int | None]) -> int | None:
    known = [time for time in times if time is not None]
    return max(known) if known else None


def oldest(times: Iterable[int | None]) -> int | None:
    known = [time for time in times if time is not None]
    return min(known) if known else None


def age_s(now_ms: int, commit_ms: int | None) -> float | None:
    """Seconds from a commit to now; never negative (the source's clock may run a little ahead)."""
    return None if commit_ms is None else max(0, now_ms - commit_ms) / 1000


def query_state(report: dict[str, Any] | None, sink: str, now_ms: int) -> tuple[str, str | None]:
    """(state, last error) of a sink's query from the driver's report (status.json)."""
    if report is None:
        return "unknown", "the jobs driver is not reporting (`tide jobs start`)"
    query = report.get("queries", {}).get(sink)
    # Each driver reports its own queries (locally the Delta queries have a driver of their own).
    reported_at_ms = (query or {}).get("reported_at_ms", report.get("written_at_ms", 0))
    if (now_ms - reported_at_ms) / 1000 > REPORT_STALE_S:
        return "unknown", "the jobs driver is not reporting (`tide jobs start`)"
    if query is None:
        return "unknown", "the driver runs no query for this sink"
    if query.get("paused"):
        return "paused", query.get("last_error")
    return ("running" if query.get("active") else "stopped"), query.get("last_error")


def first_commit(times: list[tuple[int, int | None]]) -> int | None:
    """The commit time of the first record (by offset) that has one: the oldest unapplied change."""
    return next((ts for _, ts in sorted(times) if ts is not None), None)


def last_commit(times: list[tuple[int, int | None]]) -> int | None:
    """The commit time of the last record (by offset) that has one: the newest applied change."""
    return next((ts for _, ts in sorted(times, reverse=True) if ts is not None), None)


def _freshness(figures: TableFigures | SinkFigures, now_ms: int) -> dict[str, Any]:
    return {
        "records_behind": figures.records_behind,
        "dead_letters": figures.dead_letters,
        "newest_applied_commit_ms": figures.newest_applied_commit_ms,
        "newest_applied_age_s": age_s(now_ms, figures.newest_applied_commit_ms),
        "oldest_unapplied_commit_ms": figures.oldest_unapplied_commit_ms,
        "oldest_unapplied_age_s": age_s(now_ms, figures.oldest_unapplied_commit_ms),
    }


def to_json(status: Status) -> dict[str, Any]:
    """The document `GET /status` answers (docs/status.md describes every field)."""
    now = status.taken_at_ms
    return {
        "taken_at_ms": now,
        "driver_report_age_s": status.driver_report_age_s,
        "problems": list(status.problems),
        "source": {**asdict(status.source), "connector_running": status.source.connector_running},
        "warnings": list(status.source.warnings),
        "sinks": [
            {
                "sink": sink.sink,
                "state": sink.state,
                "last_error": sink.last_error,
                **_freshness(sink, now),
                "follow_up_records_behind": sink.follow_up_behind,
                "tables": [{"table": t.table, "topic": t.topic, **_freshness(t, now)} for t in sink.tables],
            }
            for sink in status.sinks
        ],
    }

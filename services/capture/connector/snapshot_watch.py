"""Following an incremental snapshot in Kafka: Debezium's notifications and the re-read rows.

`tide snapshot` (services/capture/connector/snapshot.py) writes the signal; this module reads what comes back:
the notifications topic (`Notification`, `SnapshotProgress.on_notification`: STARTED ... COMPLETED or
ABORTED) and the table's change topic, where the re-read rows arrive as op=r records among the stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from services.capture.connector import topics
from services.stack.service import StackError
from spark_jobs.changes import DecodeError, decode

AGGREGATE_TYPE = "Incremental Snapshot"
# TABLE_SCAN_COMPLETED statuses that are not failures (Debezium's TableScanCompletionStatus).
SCAN_OK = frozenset({"SUCCEEDED", "EMPTY"})


class SnapshotError(StackError):
    """A snapshot cannot be requested, failed in Debezium, or did not finish in time; the message says which."""


@dataclass(frozen=True)
class Notification:
    """One Debezium notification (`io.debezium.connector.common.Notification`); additional_data values are strings."""

    id: str
    type: str
    aggregate_type: str
    data: dict[str, str]


def parse_notification(value: bytes | None) -> Notification | None:
    """The notification in a record of the notifications topic, or None if the record is not one."""
    try:
        document = json.loads(value) if value else None
    except (ValueError, UnicodeDecodeError):
        return None
    payload = document.get("payload", document) if isinstance(document, dict) else None
    if not isinstance(payload, dict) or not {"id", "type", "aggregate_type"} <= payload.keys():
        return None
    return Notification(
        id=str(payload["id"]),
        type=str(payload["type"]),
        aggregate_type=str(payload["aggregate_type"]),
        data=dict(payload.get("additional_data") or {}),
    )


@dataclass
class SnapshotProgress:
    """What `run` has seen so far; passed to its on_progress callback after every poll."""

    signal_id: str
    table: str  # schema-qualified
    estimated: int  # count(*) with the filter, taken just before the signal
    emitted: int = 0  # op=r records for the table seen in its change topic since the signal
    state: str = "SIGNALLED"  # type of the last notification for this snapshot
    scanned: bool = False  # TABLE_SCAN_COMPLETED seen for the table
    completed: bool = False  # Debezium reported COMPLETED
    delivered: bool = False  # ...and Kafka has acknowledged every record produced before that
    # Types of this snapshot's notifications, in arrival order (several can arrive in one poll).
    seen: list[str] = field(default_factory=list)

    def on_notification(self, note: Notification) -> None:
        """Advance on this snapshot's notifications; raise SnapshotError on an abort or a failed scan.

        Notifications carry the signal's id. A signal that arrives while another
        incremental snapshot runs is queued into it, so the closing COMPLETED may
        carry the other id: after our table's scan, any COMPLETED ends it.
        """
        if note.aggregate_type != AGGREGATE_TYPE:
            return
        ours = note.id == self.signal_id
        if ours:
            self.state = note.type
            self.seen.append(note.type)
        if note.type == "TABLE_SCAN_COMPLETED" and ours and note.data.get("scanned_collection") == self.table:
            status = note.data.get("status", "SUCCEEDED")
            if status not in SCAN_OK:
                raise SnapshotError(
                    f"Debezium could not read {self.table} for snapshot {self.signal_id}: {status} "
                    "(see the Kafka Connect log)"
                )
            self.scanned = True
        elif note.type == "ABORTED" and (ours or self.state != "SIGNALLED"):
            raise SnapshotError(
                f"incremental snapshot {self.signal_id} of {self.table} was aborted after {self.emitted} rows"
            )
        elif note.type == "COMPLETED" and (ours or self.scanned):
            self.completed = True


def assign_from(consumer: KafkaConsumer, positions: dict[TopicPartition, int]) -> None:
    consumer.assign(list(positions))
    for partition, offset in positions.items():
        consumer.seek(partition, offset)


def _count_snapshot_reads(progress: SnapshotProgress, topic: str, records: list[ConsumerRecord]) -> None:
    for record in records:
        try:
            change = decode(topic, record.key, record.value)
        except DecodeError:
            continue  # not ours to judge here; the apply jobs dead-letter it
        if change is not None and change.op == "r":
            progress.emitted += 1


def drain(consumer: KafkaConsumer, progress: SnapshotProgress, topic: str, deadline: float) -> None:
    """Count the change topic up to its current end (called once delivery is confirmed)."""
    until = {tp: end for tp, end in topics.end_offsets(consumer, topic).items() if tp in consumer.assignment()}
    while any(consumer.position(tp) < end for tp, end in until.items()) and time.monotonic() < deadline:
        poll(consumer, progress, topic)


def poll(consumer: KafkaConsumer, progress: SnapshotProgress, change_topic: str) -> None:
    for partition, records in consumer.poll(timeout_ms=500).items():
        if partition.topic == change_topic:
            _count_snapshot_reads(progress, change_topic, records)
        else:
            for record in records:
                if (note := parse_notification(record.value)) is not None:
                    progress.on_notification(note)


def late(progress: SnapshotProgress, waiting_for: str) -> SnapshotError:
    return SnapshotError(
        f"incremental snapshot {progress.signal_id} of {progress.table}: no {waiting_for} in time "
        f"({progress.emitted} of ~{progress.estimated} rows seen, last state {progress.state}); "
        "Debezium keeps going: check `tide connector status`, watch `tide tail`, or raise --timeout"
    )


def follow(
    consumer: KafkaConsumer,
    progress: SnapshotProgress,
    change_topic: str,
    deadline: float,
    on_progress: Callable[[SnapshotProgress], None],
    done: Callable[[], bool],
    waiting_for: str,
) -> None:
    """Count re-read rows and follow this snapshot's notifications until `done()`; past the deadline,
    a SnapshotError saying what was still awaited (`waiting_for`)."""
    while not done():
        if time.monotonic() > deadline:
            raise late(progress, waiting_for)
        poll(consumer, progress, change_topic)
        on_progress(progress)


__all__ = ["AGGREGATE_TYPE", "SCAN_OK", "Notification", "SnapshotError", "SnapshotProgress", "assign_from", "drain",
           "follow", "late", "parse_notification", "poll"]

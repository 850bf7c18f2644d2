"""What the chaos run observes, from the real systems: duplicate deliveries in the change topics and
micro-batches the Spark driver ran again after a crash.

- A duplicate delivery is a change record for the same row and the same source position (table
  topic, key, Debezium's source.sequence, op) that appears more than once in its topic: Debezium
  sent it again after a restart (its offsets were flushed before the crash, the records after it
  went out twice). Records the runner itself produced (stale redeliveries) are not counted.
- A replayed micro-batch is a batch whose offsets a driver wrote to a query's checkpoint (the batch
  was planned and running) and that a driver killed with kill -9 never committed; the commit for
  that same batch id, with the same offsets, written after the kill, is the restarted driver
  running it again. A Real-Time Mode query writes an epoch's offsets only as it commits it, so its
  epoch in flight is seen instead as the records its writers applied past its last commit
  (`applied_past_epoch`): a driver killed then applies them again from the checkpoint.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kafka.errors import KafkaError

from services.capture.connector import topics as change_topics
from services.jobs import lag
from services.settings import StackSettings
from spark_jobs.changes import Change, DecodeError, decode
from spark_jobs.changes.envelope import row_id

Position = tuple[str, int, int]  # topic, partition, offset


@dataclass(frozen=True)
class Delivered:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @property
    def position(self) -> Position:
        return (self.topic, self.partition, self.offset)


def read_to_end(settings: StackSettings, topic: str, timeout_s: float = 300.0) -> list[Delivered]:
    """Every record of `topic` up to its end offsets as of the call, in (partition, offset) order.
    Fails after `timeout_s` seconds without progress: a large topic may take longer than that in all."""
    consumer = change_topics.open_consumer(settings)
    try:
        parts = change_topics.partitions(consumer, topic)
        if not parts:
            return []
        ends = change_topics.end_offsets(consumer, topic)
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        records: list[Delivered] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(part) < end for part, end in ends.items()):
            if time.monotonic() > deadline:
                raise change_topics.TopicError(f"reading {topic} to its end made no progress for {timeout_s:.0f}s")
            for part, batch in consumer.poll(timeout_ms=500).items():
                records += [Delivered(topic, part.partition, r.offset, r.key, r.value)
                            for r in batch if r.offset < ends[part]]
                deadline = time.monotonic() + timeout_s
    except KafkaError as exc:
        raise change_topics.TopicError(f"reading {topic} from {settings.kafka_bootstrap} failed: {exc}") from exc
    finally:
        consumer.close()
    return sorted(records, key=lambda r: (r.partition, r.offset))


def _changes(records: Iterable[Delivered]) -> Iterator[tuple[Delivered, Change]]:
    """Each record that decodes to a row or table change; tombstones and anything else are skipped
    (not a change record: dead letters are the sinks' business)."""
    for record in records:
        try:
            change = decode(record.topic, record.key, record.value)
        except DecodeError:
            continue
        if change is not None:
            yield record, change


def duplicate_deliveries(records: Iterable[Delivered], injected: set[Position]) -> int:
    """Change records delivered more than once: for each (topic, key, source sequence, op), its
    deliveries beyond the first. Tombstones and the runner's own records are left out."""
    seen: Counter[tuple] = Counter(
        (record.topic, record.key, change.sequence, change.op)
        for record, change in _changes(records) if record.position not in injected
    )
    return sum(times - 1 for times in seen.values() if times > 1)


def key_history(records: Iterable[Delivered], doc_ids: set[str], injected: set[Position]) -> dict[str, list[str]]:
    """For each row id in `doc_ids`, one line per change record of that row, in topic order: where it
    sits, its op and source.sequence, and its after image; the runner's own records are marked. What a
    divergence report needs to tell a change Debezium never sent from one a sink did not apply."""
    found: dict[str, list[str]] = defaultdict(list)
    for record, change in _changes(records):
        row = row_id(list(change.key.values())) if change.op != "t" else None
        if row in doc_ids:
            mark = " (sent by the runner)" if record.position in injected else ""
            found[row].append(
                f"p{record.partition}@{record.offset} {change.op} v{change.sequence} after={change.after}{mark}")
    return dict(found)


def stale_records(records: Iterable[Delivered], how_many: int, rnd: random.Random) -> list[Delivered]:
    """Up to `how_many` old change records worth sending again: for a key whose latest record says
    something else (a later update, or a delete), its first change record. Sent after the newer ones,
    each is older than what every sink holds, so only the version guard keeps it out, and, where it
    shares a micro-batch with a later unchanged-TOAST placeholder of its row, the fill-version rule
    (docs/reliability.md, "Found by the chaos runner")."""
    by_key: dict[tuple[str, bytes | None], list[Delivered]] = defaultdict(list)
    for record in records:
        by_key[(record.topic, record.key)].append(record)
    candidates = []
    for history in by_key.values():
        first = next((record for record in history if record.value is not None), None)
        if first is None or history[-1] is first or history[-1].value == first.value:
            continue
        candidates.append(first)
    return rnd.sample(candidates, min(how_many, len(candidates)))


def applied_past_epoch(settings: StackSettings, checkpoints: Path, sinks: Iterable[str],
                       timeout_s: float = 60.0) -> dict[str, int]:
    """Per real-time query, the records its writers published as applied (services/jobs/lag.py) past
    its checkpoint's last commit; the positions are published every half second, so a lower bound."""
    paths = {sink: checkpoints / sink for sink in sinks}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            applied = lag.applied_offsets(settings, paths)
            break
        except KafkaError as exc:
            # E.g. NotCoordinator while a broker restarted by the fault before this one loads its groups.
            if not exc.retriable or time.monotonic() > deadline:
                raise
            time.sleep(1.0)  # poll: the coordinator answers once it has loaded its groups
    return {sink: lag.records_behind(lag.committed_offsets(path), applied[sink]) for sink, path in paths.items()}


@dataclass(frozen=True)
class InFlight:
    """A micro-batch whose offsets are written but not yet committed."""

    sink: str
    batch: int
    offsets: str


def _batch_ids(folder: Path) -> list[int]:
    return [int(path.name) for path in folder.glob("[0-9]*")] if folder.is_dir() else []


def in_flight(checkpoints: Path) -> list[InFlight]:
    """Each query's planned but uncommitted batches (normally one while a batch runs, else none)."""
    found = []
    for checkpoint in sorted(path for path in checkpoints.iterdir() if path.is_dir()) if checkpoints.is_dir() else []:
        last_commit = max(_batch_ids(checkpoint / "commits"), default=-1)
        for batch in sorted(b for b in _batch_ids(checkpoint / "offsets") if b > last_commit):
            try:
                found.append(InFlight(checkpoint.name, batch, (checkpoint / "offsets" / str(batch)).read_text()))
            except FileNotFoundError:
                continue  # purged or being renamed into place
    return found


@dataclass(frozen=True)
class Replay:
    sink: str
    batch: int
    after_kill_s: float  # from the kill to the replayed batch's commit


class ReplayWatch(threading.Thread):
    """Watches the batches in flight when a driver was killed until each is committed again."""

    def __init__(self, checkpoints: Path, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True, name="chaos-replay-watch")
        self.checkpoints, self.interval_s = checkpoints, interval_s
        self.pending: list[tuple[InFlight, float]] = []
        self.replays: list[Replay] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def killed(self, batches: list[InFlight], at: float) -> None:
        """The driver that planned `batches` was killed at wall-clock time `at`."""
        with self.lock:
            self.pending += [(batch, at) for batch in batches]

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            self.check()

    def check(self) -> None:
        with self.lock:
            still = []
            for batch, killed_at in self.pending:
                replay = replayed(self.checkpoints, batch, killed_at)
                if replay is None:
                    still.append((batch, killed_at))
                elif replay:
                    self.replays.append(replay)
            self.pending = still


def replayed(checkpoints: Path, batch: InFlight, killed_at: float) -> Replay | Literal[False] | None:
    """A Replay once the batch is committed after the kill with the offsets it had; None while not
    committed yet; False if it was committed otherwise (before the kill, or with other offsets)."""
    checkpoint = checkpoints / batch.sink
    commit = checkpoint / "commits" / str(batch.batch)
    try:
        committed_at = commit.stat().st_mtime
        offsets = (checkpoint / "offsets" / str(batch.batch)).read_text()
    except FileNotFoundError:
        return None
    if committed_at <= killed_at or offsets != batch.offsets:
        return False
    return Replay(batch.sink, batch.batch, round(committed_at - killed_at, 1))
